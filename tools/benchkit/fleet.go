package benchkit

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/pki"
	"computeplane/internal/qemu/vmowner"
)

// Fleet is computed (every role, a gateway included) and one compute-agent
// with the qemu runtime (TCG), run as child processes on a database of
// their own, with a tenant "bench" owning a vps-host pool with flavor
// "small" (1 vCPU, 256 MiB). The VM benchmarks share it.
type Fleet struct {
	Work     string // a temporary directory: binaries, logs, the agent's
	AgentDir string
	C        *computeclient.Client
	DB       *pgx.Conn
	PoolID   string
	Node     string
	DBName   string // the fleet's database, as PostgreSQL's backends name it

	name    string
	owner   string // the vmowner mark of the qemu processes it starts
	cleanup []func()
}

const benchSecret = "benchkit-secret-0123456789abcdefghijklmnop"

// StartFleet starts a fleet for the tool name, with the image source at
// imagesDir; it exits the process on any failure (a benchmark has no one
// AgentArgs are more flags for the fleet's compute-agent run (a
// benchmark's A/B, such as --restore-pool 0).
var AgentArgs []string

// to return to).
func StartFleet(ctx context.Context, name, database, imagesDir string) *Fleet {
	// Marked before any child starts, so that every VM it boots carries it.
	f := &Fleet{name: name, owner: vmowner.Mark()}
	abs, err := filepath.Abs(imagesDir)
	f.check(err)
	f.Work, err = os.MkdirTemp("", name)
	f.check(err)
	f.defer_(func() { _ = os.RemoveAll(f.Work) })
	for _, b := range []string{"computed", "compute-agent"} {
		f.run(exec.Command("go", "build", "-o", filepath.Join(f.Work, b), "./cmd/"+b))
	}
	dbURL, drop, err := FreshDatabase(ctx, database, name)
	f.check(err)
	if u, err := url.Parse(dbURL); err == nil {
		f.DBName = strings.TrimPrefix(u.Path, "/")
	}
	f.defer_(drop)
	pkiFile := filepath.Join(f.Work, "pki.json")
	_, _, err = pki.Init(pkiFile, benchSecret, "bench.local")
	f.check(err)
	port, err := FreePort()
	f.check(err)
	gwPort, err := FreePort()
	f.check(err)
	cfg := filepath.Join(f.Work, "config.yaml")
	f.check(os.WriteFile(cfg, []byte(fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: bench, listen: \"127.0.0.1:%d\"}\nimages: {dir: %q}\n", gwPort, gwPort, abs)), 0o600))
	env := append(os.Environ(), "SERVICE_DATABASE_URL="+dbURL, "SERVICE_SECRET="+benchSecret, "SERVICE_PKI="+pkiFile, "SERVICE_CONFIG="+cfg,
		"SERVICE_BASE_URL="+fmt.Sprintf("http://127.0.0.1:%d", port), "HOST=127.0.0.1", "PORT="+strconv.Itoa(port), "SERVICE_LOG_LEVEL=warn")
	f.start(env, "computed.log", filepath.Join(f.Work, "computed"), "serve")
	f.waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
	key := lastLine(f.output(env, filepath.Join(f.Work, "computed"), "iam", "create-key", "--tenant", "bench", "--identity", "bench", "--role", "owner"))
	f.C, err = computeclient.New(fmt.Sprintf("http://127.0.0.1:%d%s", port, config.DefaultBasePath), computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	f.check(err)
	site, err := f.C.SitesCreate(ctx, &client.SitesCreateInput{TenantId: "bench", Kind: client.SitesCreateInputKindCustom, Region: "bench", IdempotencyKey: "s"})
	f.check(err)
	pool, err := f.C.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: "bench", SiteId: site.Data.SiteId, Name: "vms", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	f.check(err)
	f.PoolID = pool.Data.PoolId
	_, err = f.C.FlavorsCreate(ctx, &client.FlavorsCreateInput{TenantId: "bench", PoolId: f.PoolID, Name: "small", Vcpu: 1, MemoryMiB: 256})
	f.check(err)
	tok, err := f.C.PoolsJoinToken(ctx, &client.PoolsJoinTokenInput{TenantId: "bench", PoolId: f.PoolID})
	f.check(err)
	f.AgentDir = filepath.Join(f.Work, "a")
	f.Node = lastLine(f.output(env, filepath.Join(f.Work, "compute-agent"), "join", "--api", fmt.Sprintf("http://127.0.0.1:%d", port),
		"--token", tok.Data.Token, "--dir", f.AgentDir))
	memory, err := os.MkdirTemp("/dev/shm", name) // guest memory on a tmpfs, as an operator would set it
	f.check(err)
	f.defer_(func() { _ = os.RemoveAll(memory) })
	f.start(env, "agent.log", filepath.Join(f.Work, "compute-agent"), append([]string{"run", "--dir", f.AgentDir, "--runtime", "qemu",
		"--memory-dir", memory, "--accel", "tcg", "--vcpu", "16", "--memory-mib", "16384"}, AgentArgs...)...)
	f.DB, err = pgx.Connect(ctx, dbURL)
	f.check(err)
	f.defer_(func() { _ = f.DB.Close(context.Background()) })
	for {
		var state string
		_ = f.DB.QueryRow(ctx, `select state from nodes where node_id = $1`, f.Node).Scan(&state)
		if state == "ready" {
			return f
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close deletes every sandbox, snapshot, template and instance of the fleet through
// the API, waits for their VMs to end, stops the processes and removes what
// the fleet made. A VM still running after that is killed and ends the
// tool with an error: VMs outlive their daemon by design, so a benchmark
// that left one would leave it running for good.
func (f *Fleet) Close() {
	if f.C != nil {
		f.deleteAll()
	}
	left := vmowner.WaitGone(f.owner, 60*time.Second)
	if keep := os.Getenv("BENCHKIT_KEEP_LOGS"); keep != "" && f.Work != "" {
		// The processes' logs outlive the run (a trace's other half).
		for _, l := range []string{"computed.log", "agent.log"} {
			if b, err := os.ReadFile(filepath.Join(f.Work, l)); err == nil {
				_ = os.WriteFile(filepath.Join(keep, f.name+"-"+l), b, 0o600)
			}
		}
	}
	for _, fn := range slices.Backward(f.cleanup) {
		fn()
	}
	f.cleanup = nil
	if len(left) > 0 {
		vmowner.Kill(left)
		log.Fatalf("%s: %d VM(s) still running after every sandbox, snapshot, template and instance was deleted (killed now):\n  %s",
			f.name, len(left), vmowner.Describe(left))
	}
}

// deleteAll deletes what the benchmark booted, through the API as a
// tenant would; errors are logged, and what is left is found by Close.
func (f *Fleet) deleteAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	warn := func(what string, err error) {
		if err != nil {
			log.Printf("%s: cleanup: %s: %v", f.name, what, err)
		}
	}
	// Sandboxes first, then snapshots (the agent's restore pool keeps qemus
	// started ahead for a snapshot until it is deleted), templates and
	// instances.
	deleteEach(warn, "sandboxes", func() ([]client.Sandbox, error) {
		out, err := f.C.SandboxesList(ctx, &client.SandboxesListInput{TenantId: "bench"})
		if err != nil {
			return nil, err
		}
		return out.Data.Items, nil
	}, func(sb client.Sandbox) (string, error) {
		_, err := f.C.SandboxesDelete(ctx, &client.SandboxesDeleteInput{TenantId: "bench", SandboxId: sb.SandboxId})
		return sb.SandboxId, err
	})
	deleteEach(warn, "snapshots", func() ([]client.SandboxSnapshot, error) {
		out, err := f.C.SandboxSnapshotsList(ctx, &client.SandboxSnapshotsListInput{TenantId: "bench"})
		if err != nil {
			return nil, err
		}
		return out.Data.Items, nil
	}, func(sn client.SandboxSnapshot) (string, error) {
		_, err := f.C.SandboxSnapshotsDelete(ctx, &client.SandboxSnapshotsDeleteInput{TenantId: "bench", SnapshotId: sn.SnapshotId})
		return sn.SnapshotId, err
	})
	deleteEach(warn, "templates", func() ([]client.SandboxTemplate, error) {
		out, err := f.C.SandboxTemplatesList(ctx, &client.SandboxTemplatesListInput{TenantId: "bench"})
		if err != nil {
			return nil, err
		}
		return out.Data.Items, nil
	}, func(tp client.SandboxTemplate) (string, error) {
		_, err := f.C.SandboxTemplatesDelete(ctx, &client.SandboxTemplatesDeleteInput{TenantId: "bench", TemplateId: tp.TemplateId})
		return tp.TemplateId, err
	})
	deleteEach(warn, "instances", func() ([]client.Instance, error) {
		out, err := f.C.InstancesList(ctx, &client.InstancesListInput{TenantId: "bench"})
		if err != nil {
			return nil, err
		}
		return out.Data.Items, nil
	}, func(in client.Instance) (string, error) {
		_, err := f.C.InstancesDelete(ctx, &client.InstancesDeleteInput{TenantId: "bench", InstanceId: in.InstanceId})
		return in.InstanceId, err
	})
}

// deleteEach lists what and deletes each item, warning of what fails and
// going on: a cleanup removes what it can.
func deleteEach[T any](warn func(string, error), what string, list func() ([]T, error), del func(T) (string, error)) {
	all, err := list()
	if err != nil {
		warn("list "+what, err)
		return
	}
	for _, item := range all {
		id, err := del(item)
		warn("delete "+id, err)
	}
}

// Sched is SchedByGroup of the fleet's processes and its database's
// backends.
func (f *Fleet) Sched() map[string]Sched { return SchedByGroup(f.owner, f.DBName) }

func (f *Fleet) defer_(fn func()) { f.cleanup = append(f.cleanup, fn) }

func (f *Fleet) start(env []string, logName, bin string, args ...string) {
	logf, err := os.Create(filepath.Join(f.Work, logName))
	f.check(err)
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	f.check(cmd.Start())
	f.defer_(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_, _ = cmd.Process.Wait()
	})
}

func (f *Fleet) waitHTTP(u string) {
	for i := 0; i < 600; i++ {
		if r, err := http.Get(u); err == nil {
			_ = r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.Fatal("computed did not become ready")
}

func (f *Fleet) output(env []string, bin string, args ...string) string {
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stderr = env, os.Stderr
	out, err := cmd.Output()
	f.check(err)
	return string(out)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func (f *Fleet) run(cmd *exec.Cmd) {
	if out, err := cmd.CombinedOutput(); err != nil {
		f.Fatal(fmt.Sprintf("%s: %v %s", strings.Join(cmd.Args, " "), err, out))
	}
}

func (f *Fleet) check(err error) {
	if err != nil {
		f.Fatal(err.Error())
	}
}

// Fatal ends the tool after cleaning up.
func (f *Fleet) Fatal(msg string) {
	f.Close()
	log.Fatalf("%s: %s", f.name, msg)
}

// Quantile is the p-th percentile of d (nearest rank).
func Quantile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return s[i]
}

// Pct formats the p-th percentile of d.
func Pct(d []time.Duration, p int) string {
	return Quantile(d, p).Round(100 * time.Microsecond).String()
}
