// Command instancebench measures instances.create to running on real VMs
// (issue 13's benchmark): it runs computed (every role, the gateway
// included) and one compute-agent with the qemu runtime as child
// processes on a database of its own, creates -runs instances one after
// another and splits each one's time into the control plane's share
// (admission, placement and commit, then the spec reaching the daemon,
// which acknowledges it by its observed generation) and the host's share
// (the VM booting until its guest agent answers). It writes the section
// "Instances" of docs/benchmarks.md and docs/benchmarks-notes.md.
//
//	go run ./tools/instancebench [-runs 50] [-database $SERVICE_DATABASE_URL]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/images"
	"computeplane/internal/pki"
	"computeplane/internal/qemu"
	"computeplane/tools/benchkit"
)

const secret = "instancebench-secret-0123456789abcdefghijklmn"

func main() {
	runs := flag.Int("runs", 50, "instances created, one after another")
	database := flag.String("database", os.Getenv("SERVICE_DATABASE_URL"), "a PostgreSQL URL; a database of its own is made on that server")
	imagesDir := flag.String("images", ".service/images", "the image source with computeplane/minimal (make images)")
	out := flag.String("out", "docs/benchmarks.md", "the benchmarks page")
	notes := flag.String("notes", "docs/benchmarks-notes.md", "the notes page make bench appends")
	flag.Parse()
	ctx := context.Background()
	if _, err := (&images.Dir{Path: *imagesDir}).Get(ctx, "computeplane/minimal"); err != nil {
		log.Fatalf("instancebench: %v (run make images)", err)
	}
	abs, err := filepath.Abs(*imagesDir)
	check(err)
	work, err := os.MkdirTemp("", "ib")
	check(err)
	defer os.RemoveAll(work)
	for _, b := range []string{"computed", "compute-agent"} {
		run(exec.Command("go", "build", "-o", filepath.Join(work, b), "./cmd/"+b))
	}
	dbURL, drop, err := benchkit.FreshDatabase(ctx, *database, "instancebench")
	check(err)
	defer drop()
	pkiFile := filepath.Join(work, "pki.json")
	_, _, err = pki.Init(pkiFile, secret, "bench.local")
	check(err)
	port, err := benchkit.FreePort()
	check(err)
	gwPort, err := benchkit.FreePort()
	check(err)
	cfg := filepath.Join(work, "config.yaml")
	check(os.WriteFile(cfg, []byte(fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: bench, listen: \"127.0.0.1:%d\"}\nimages: {dir: %q}\n", gwPort, gwPort, abs)), 0o600))
	env := append(os.Environ(), "SERVICE_DATABASE_URL="+dbURL, "SERVICE_SECRET="+secret, "SERVICE_PKI="+pkiFile, "SERVICE_CONFIG="+cfg,
		"SERVICE_BASE_URL="+fmt.Sprintf("http://127.0.0.1:%d", port), "HOST=127.0.0.1", "PORT="+strconv.Itoa(port), "SERVICE_LOG_LEVEL=warn")
	srv := start(filepath.Join(work, "computed"), env, filepath.Join(work, "computed.log"), "serve")
	defer stop(srv)
	waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
	key := strings.TrimSpace(lastLine(output(exec.Command(filepath.Join(work, "computed"), "iam", "create-key", "--tenant", "bench", "--identity", "bench", "--role", "owner"), env)))
	c, err := computeclient.New(fmt.Sprintf("http://127.0.0.1:%d%s", port, config.DefaultBasePath), computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	check(err)
	site, err := c.SitesCreate(ctx, &client.SitesCreateInput{TenantId: "bench", Kind: client.SitesCreateInputKindCustom, Region: "bench", IdempotencyKey: "s"})
	check(err)
	pool, err := c.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: "bench", SiteId: site.Data.SiteId, Name: "vms", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	check(err)
	_, err = c.FlavorsCreate(ctx, &client.FlavorsCreateInput{TenantId: "bench", PoolId: pool.Data.PoolId, Name: "small", Vcpu: 1, MemoryMiB: 256})
	check(err)
	tok, err := c.PoolsJoinToken(ctx, &client.PoolsJoinTokenInput{TenantId: "bench", PoolId: pool.Data.PoolId})
	check(err)
	agentDir := filepath.Join(work, "a")
	node := strings.TrimSpace(output(exec.Command(filepath.Join(work, "compute-agent"), "join", "--api", fmt.Sprintf("http://127.0.0.1:%d", port),
		"--token", tok.Data.Token, "--dir", agentDir), env))
	agent := start(filepath.Join(work, "compute-agent"), env, filepath.Join(work, "agent.log"), "run", "--dir", agentDir, "--runtime", "qemu",
		"--accel", "tcg", "--vcpu", "8", "--memory-mib", "8192")
	defer stop(agent)
	db, err := pgx.Connect(ctx, dbURL)
	check(err)
	defer db.Close(ctx)
	for {
		var state string
		_ = db.QueryRow(ctx, `select state from nodes where node_id = $1`, node).Scan(&state)
		if state == "ready" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	im, err := (&images.Dir{Path: abs}).Get(ctx, "computeplane/minimal")
	check(err)
	var admit, deliver, host, total, bare []time.Duration
	for i := 0; i < *runs; i++ {
		// The same image booted by qemu alone, in the same run: the host
		// share's baseline.
		bare = append(bare, bareBoot(ctx, work, im, i))
		var gen0 int64
		_ = db.QueryRow(ctx, `select observed_generation from nodes where node_id = $1`, node).Scan(&gen0)
		t0 := time.Now()
		res, err := c.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: "bench", PoolId: pool.Data.PoolId, Flavor: "small",
			ImageId: "computeplane/minimal", Name: "vm-" + strconv.Itoa(i), IdempotencyKey: "i" + strconv.Itoa(i)})
		check(err)
		t1 := time.Now()
		id := res.Data.InstanceId
		var t2, t3 time.Time
		for t3.IsZero() {
			var gen int64
			var state string
			check(db.QueryRow(ctx, `select n.observed_generation, i.state from nodes n, instances i where n.node_id = $1 and i.instance_id = $2`, node, id).Scan(&gen, &state))
			if t2.IsZero() && gen > gen0 {
				t2 = time.Now()
			}
			if state == "running" {
				t3 = time.Now()
				if t2.IsZero() {
					t2 = t3
				}
			}
			if state == "failed" {
				log.Fatalf("instancebench: instance %s failed", id)
			}
			time.Sleep(2 * time.Millisecond)
		}
		admit, deliver, host, total = append(admit, t1.Sub(t0)), append(deliver, t2.Sub(t1)), append(host, t3.Sub(t2)), append(total, t3.Sub(t0))
		_, err = c.InstancesDelete(ctx, &client.InstancesDeleteInput{TenantId: "bench", InstanceId: id})
		check(err)
		for {
			var state string
			check(db.QueryRow(ctx, `select state from instances where instance_id = $1`, id).Scan(&state))
			if state == "deleted" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		log.Printf("run %d: total %s (admission %s, delivery %s, host %s)", i+1, t3.Sub(t0).Round(time.Millisecond),
			t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond))
	}
	cp := make([]time.Duration, len(admit))
	for i := range admit {
		cp[i] = admit[i] + deliver[i]
	}
	section := fmt.Sprintf(`## Instances

Written by `+"`make bench-instances`"+` (tools/instancebench) on %s: computed (every role, the
gateway included) and one compute-agent with the qemu runtime on this machine, %d instances
(1 vCPU, 256 MiB, the minimal image: the Debian cloud kernel and an initramfs with
compute-guest) created one after another, each deleted before the next; TCG, not KVM (see
../shared/design/TOOLING.md); %d cores, %s. The control plane's share is the create call
(admission, placement, quota, commit) plus the spec reaching the daemon (its observed
generation acknowledges it); the host's share is the VM booting until compute-guest answers
and took its identity.

| Figure | p50 | p99 |
|---|---:|---:|
| create to running, end to end | %s | %s |
| control plane: create call | %s | %s |
| control plane: spec delivered and acknowledged | %s | %s |
| control plane, together | %s | %s |
| host: boot to a ready guest | %s | %s |
| bare qemu boot of the same image to a ready guest (baseline) | %s | %s |

The host share is %.0f %% above the bare boot at p50 (goal: at most 10 %%); the control
plane's p99 is %s (goal: under 20 ms).

`, time.Now().UTC().Format("2006-01-02"), *runs, runtime.NumCPU(), runtime.Version(),
		pct(total, 50), pct(total, 99), pct(admit, 50), pct(admit, 99), pct(deliver, 50), pct(deliver, 99), pct(cp, 50), pct(cp, 99), pct(host, 50), pct(host, 99), pct(bare, 50), pct(bare, 99),
		100*(float64(quantile(host, 50))/float64(quantile(bare, 50))-1), pct(cp, 99))
	fmt.Print(section)
	for _, f := range []string{*out, *notes} {
		check(benchkit.ReplaceSection(f, "## Instances", section))
	}
}

func quantile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return s[i]
}

func pct(d []time.Duration, p int) string {
	return quantile(d, p).Round(100 * time.Microsecond).String()
}

// bareBoot boots the image with qemu alone (the runtime's machine and
// flags, TCG) until compute-guest's ready event, and ends it.
func bareBoot(ctx context.Context, work string, im *images.Image, i int) time.Duration {
	c := &qemu.Config{ID: "bare-" + strconv.Itoa(i), Dir: filepath.Join(work, "bare"), VCPU: 1, MemoryMiB: 256, Accel: qemu.AccelTCG,
		Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline + " compute.hostname=bare"}
	start := time.Now()
	vm, err := qemu.Start(ctx, c)
	check(err)
	defer func() { _ = vm.Kill() }()
	var g *qemu.Guest
	for g == nil {
		if g, err = vm.Guest(); err != nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err = g.Ready(rctx)
	check(err)
	return time.Since(start)
}

func start(bin string, env []string, logPath string, args ...string) *exec.Cmd {
	logf, err := os.Create(logPath)
	check(err)
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	check(cmd.Start())
	return cmd
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_, _ = cmd.Process.Wait()
}

func waitHTTP(u string) {
	for i := 0; i < 600; i++ {
		if r, err := http.Get(u); err == nil {
			_ = r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatal("instancebench: computed did not become ready")
}

func output(cmd *exec.Cmd, env []string) string {
	cmd.Env = env
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	check(err)
	return string(out)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func run(cmd *exec.Cmd) {
	if out, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("instancebench: %s: %v %s", strings.Join(cmd.Args, " "), err, out)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal("instancebench: ", err)
	}
}
