// Package deploytest runs the multi-process deployment of docs/deploy.md
// on this machine with real processes: two api processes behind an L7
// balancer, two worker processes, two gateways behind an L4 balancer
// (TLS passthrough), PostgreSQL with a streaming standby, and two
// daemons. It upgrades the deployment one process at a time in the
// specification's order while calls keep succeeding, then fails the
// database over to its standby.
package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"crypto/sha256"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/release"
	"computeplane/internal/testenv"
)

const (
	tenant = "acme"
	oldV   = "v1.0.0"
	newV   = "v1.1.0" // adds the expand migration
	nextV  = "v1.2.0" // adds the contract migration
)

// The schema change the upgrade carries: the new release adds a nullable
// column (expand: the old release's queries do not see it), the release
// after drops it (contract: once no process of the old release runs).
const (
	expandSQL   = "-- +goose Up\nALTER TABLE nodes ADD COLUMN upgrade_probe text;\n-- +goose Down\nALTER TABLE nodes DROP COLUMN upgrade_probe;\n"
	contractSQL = "-- +goose Up\nALTER TABLE nodes DROP COLUMN upgrade_probe;\n-- +goose Down\nALTER TABLE nodes ADD COLUMN upgrade_probe text;\n"
)

// build compiles pkg with version stamped and the extra migrations
// (name -> SQL) laid over the migrations directory (go build -overlay):
// the next releases of this tree, without committing them.
func build(t *testing.T, pkg, version string, migrations map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, filepath.Base(pkg)+"-"+version)
	args := []string{"build", "-o", bin, "-ldflags", "-X computeplane/internal/buildinfo.version=" + version}
	if len(migrations) > 0 {
		root, err := exec.Command("go", "env", "GOMOD").Output()
		require.NoError(t, err)
		repl := map[string]string{}
		for name, sql := range migrations {
			p := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(p, []byte(sql), 0o644))
			repl[filepath.Join(filepath.Dir(strings.TrimSpace(string(root))), "migrations", name)] = p
		}
		ov, err := json.Marshal(map[string]any{"Replace": repl})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "overlay.json"), ov, 0o644))
		args = append(args, "-overlay", filepath.Join(dir, "overlay.json"))
	}
	out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
	require.NoError(t, err, "go build %s: %s", pkg, out)
	return bin
}

// deployment is the running topology.
type deployment struct {
	t        *testing.T
	pg       *pgPair
	dir      string
	env      map[string]string
	apiPorts []int
	gwConfig []string // one configuration file per gateway (its listen addresses)
	config   string   // everyone else's
	procs    map[string]*proctest.Process
	l7       *l7
	l4       *l4
}

// production is the configuration of docs/deploy.md's example, with this
// machine's paths and ports.
func productionConfig(publicURL, gatewayURL, gwListen, gwInternal, sinkPath, downloadsDir string) string {
	return fmt.Sprintf(`trustedProxies: [127.0.0.1/32]
notifier: {kind: postgres}
metrics: {token: metrics-token-0123456789abcdef}
sinks:
  events:
    - {id: events-file, kind: file, path: %q}
  audit:
    - {id: audit-file, kind: file, path: %q}
gateway:
  url: %q
  region: eu
  listen: %q
  internalListen: %q
  drainDelayMs: 2000
  downAfterMs: 20000
downloads: {dir: %q}
log: {level: info}
shutdown: {unreadyMs: 1000}
`, sinkPath, sinkPath+".audit", gatewayURL, gwListen, gwInternal, downloadsDir)
}

func (d *deployment) start(name, bin, roles, configFile string, port int) *proctest.Process {
	vars := map[string]string{"SERVICE_ROLES": roles, "SERVICE_CONFIG": configFile, "SERVICE_SKIP_MIGRATIONS": "1"}
	for k, v := range d.env {
		vars[k] = v
	}
	if port != 0 {
		vars["PORT"] = strconv.Itoa(port)
	}
	p := proctest.Start(d.t, name, bin, proctest.ChildEnv(vars), "serve")
	d.procs[name] = p
	return p
}

func (d *deployment) migrate(bin string) {
	proctest.Run(d.t, bin, proctest.ChildEnv(d.env), "migrate")
}

// query answers one value from the database the processes use.
func (d *deployment) query(q string, args ...any) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, d.pg.URL())
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	var v any
	if err := c.QueryRow(ctx, q, args...).Scan(&v); err != nil {
		return "", err
	}
	return fmt.Sprint(v), nil
}

func (d *deployment) eventually(what, q string, want string, args ...any) {
	d.t.Helper()
	var last string
	require.Eventually(d.t, func() bool {
		for _, p := range d.procs {
			p.RequireRunning(d.t)
		}
		s, err := d.query(q, args...)
		last = fmt.Sprint(s, err)
		return err == nil && s == want
	}, 60*time.Second, 100*time.Millisecond, "%s (last: %s)", what, last)
}

// load makes calls through the L7 balancer until stopped: each creates
// a site (a write: api, database, outbox to the sinks through the
// workers) and reads the pool. UNAVAILABLE with retryAfterMs is retried
// after the time it names (as the specification tells clients); any other
// error is a failed call.
type load struct {
	calls, retried atomic.Int64
	mu             sync.Mutex
	failures       map[string]int
	sample         map[string]string // a message per code, retried ones too
	stop           chan struct{}
	wg             sync.WaitGroup
	lastOK         atomic.Int64 // when the latest successful write was sent (unix nanos)
}

func startLoad(t *testing.T, c *computeclient.Client, pool string, workers int) *load {
	l := &load{failures: map[string]int{}, sample: map[string]string{}, stop: make(chan struct{})}
	var seq atomic.Int64
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				i := seq.Add(1)
				l.call(func(ctx context.Context) error {
					sent := time.Now().UnixNano()
					_, err := c.SitesCreate(ctx, &client.SitesCreateInput{TenantId: tenant, Kind: client.SitesCreateInputKindCustom,
						Region: "eu", IdempotencyKey: fmt.Sprintf("load-%d-%d", w, i)})
					if err == nil {
						l.lastOK.Store(max(l.lastOK.Load(), sent))
					}
					return err
				})
				l.call(func(ctx context.Context) error {
					_, err := c.PoolsGet(ctx, &client.PoolsGetInput{TenantId: tenant, PoolId: pool})
					return err
				})
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *load) call(f func(context.Context) error) {
	l.calls.Add(1)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return
		}
		e, ok := computeclient.AsError(err)
		if ok {
			l.mu.Lock()
			if _, seen := l.sample[string(e.Code)]; !seen {
				l.sample[string(e.Code)] = e.Message
			}
			l.mu.Unlock()
		}
		if ok && e.Code == "UNAVAILABLE" && e.RetryAfterMs != nil && attempt < 120 {
			l.retried.Add(1)
			time.Sleep(time.Duration(min(*e.RetryAfterMs, 1000)) * time.Millisecond)
			continue
		}
		code := "transport: " + err.Error()
		if ok {
			code = string(e.Code)
		}
		l.mu.Lock()
		l.failures[code]++
		l.mu.Unlock()
		return
	}
}

func (l *load) halt() {
	close(l.stop)
	l.wg.Wait()
}

func (l *load) report() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var fs []string
	for k, v := range l.failures {
		fs = append(fs, fmt.Sprintf("%s x%d", k, v))
	}
	sort.Strings(fs)
	return fmt.Sprintf("calls %d, UNAVAILABLE retried %d, failed %v; messages %v", l.calls.Load(), l.retried.Load(), fs, l.sample)
}

func (l *load) failed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, v := range l.failures {
		n += v
	}
	return n
}

func TestRollingUpgradeAndFailover(t *testing.T) {
	pg := startPGPair(t)
	d := &deployment{t: t, pg: pg, dir: t.TempDir(), procs: map[string]*proctest.Process{}}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range d.procs {
				t.Logf("%s stderr:\n%s", name, proctest.Tail(p.Stderr.String(), 15))
			}
		}
	})
	pg.WaitReplicated(t, func(q string) (string, error) { return d.query(q) })

	// The releases: this tree as v1.0.0, then v1.1.0 with the expand
	// migration, and v1.2.0 with the contract migration too.
	expand := map[string]string{"90001_upgrade_probe_expand.sql": expandSQL}
	contract := map[string]string{"90001_upgrade_probe_expand.sql": expandSQL, "90002_upgrade_probe_contract.sql": contractSQL}
	computedOld := build(t, "computeplane/cmd/computed", oldV, nil)
	computedNew := build(t, "computeplane/cmd/computed", newV, expand)
	computedNext := build(t, "computeplane/cmd/computed", nextV, contract)
	agentOld := build(t, "computeplane/cmd/compute-agent", oldV, nil)
	agentNew := build(t, "computeplane/cmd/compute-agent", newV, nil)

	pkiFile := filepath.Join(d.dir, "pki.json")
	bundle, _, err := pki.Init(pkiFile, testenv.TestSecret, "deploy.local")
	require.NoError(t, err)
	// The new daemon, published in the downloads directory and signed
	// with the release key, as make release lays it out.
	downloads := filepath.Join(d.dir, "downloads")
	publishAgent(t, downloads, bundle, agentNew, newV)

	apiPorts := []int{testenv.FreePort(t), testenv.FreePort(t)}
	gwPorts := []int{testenv.FreePort(t), testenv.FreePort(t)}
	d.l7 = startL7(t, fmt.Sprintf("127.0.0.1:%d", apiPorts[0]), fmt.Sprintf("127.0.0.1:%d", apiPorts[1]))
	d.l4 = startL4(t, fmt.Sprintf("127.0.0.1:%d", gwPorts[0]), fmt.Sprintf("127.0.0.1:%d", gwPorts[1]))
	publicURL := "http://" + d.l7.addr
	sink := filepath.Join(d.dir, "events.jsonl")
	for i := range 2 {
		f := filepath.Join(d.dir, fmt.Sprintf("gateway-%d.yaml", i+1))
		require.NoError(t, os.WriteFile(f, []byte(productionConfig(publicURL, "https://"+d.l4.addr, fmt.Sprintf("127.0.0.1:%d", gwPorts[i]),
			fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), sink, downloads)), 0o600))
		d.gwConfig = append(d.gwConfig, f)
	}
	d.config = d.gwConfig[0]
	d.env = map[string]string{"SERVICE_DATABASE_URL": pg.URL(), "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": pkiFile,
		"SERVICE_BASE_URL": publicURL, "HOST": "127.0.0.1"}

	// The configuration is one computed config check accepts.
	check := exec.Command(computedOld, "config", "check", d.config)
	check.Env = proctest.ChildEnv(d.env)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "%s", out)

	// Release v1.0.0 everywhere.
	d.migrate(computedOld)
	roles := map[string]string{"api-1": "api", "api-2": "api", "worker-1": "controllers,scheduler,sinks,iam", "worker-2": "controllers,scheduler,sinks,iam",
		"gateway-1": "gateway", "gateway-2": "gateway"}
	startRole := func(name, bin string) {
		switch name {
		case "api-1", "api-2":
			port := apiPorts[name[len(name)-1]-'1']
			p := d.start(name, bin, roles[name], d.config, port)
			p.WaitHealthy(t, fmt.Sprintf("127.0.0.1:%d", port))
		case "gateway-1", "gateway-2":
			d.start(name, bin, roles[name], d.gwConfig[name[len(name)-1]-'1'], 0)
		default:
			d.start(name, bin, roles[name], d.config, 0)
		}
	}
	for _, n := range []string{"worker-1", "worker-2", "gateway-1", "gateway-2", "api-1", "api-2"} {
		startRole(n, computedOld)
	}
	d.eventually("two workers", "select count(*) from workers", "2")
	d.eventually("two gateways", "select count(*) from gateways", "2")

	key := proctest.CreateKey(t, computedOld, proctest.ChildEnv(d.env), tenant, "ops", "owner")
	c, err := computeclient.New(publicURL+config.DefaultBasePath, computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	require.NoError(t, err)
	ctx := t.Context()
	site, err := c.SitesCreate(ctx, &client.SitesCreateInput{TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "site"})
	require.NoError(t, err)
	pool, err := c.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: tenant, SiteId: site.Data.SiteId, Name: "hosts",
		Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "pool"})
	require.NoError(t, err)

	// Two daemons (the recording runtime: the point is the control plane's
	// processes, not VMs), each with its own copy of the binary it
	// upgrades in place.
	var agents []*daemon
	for i := range 2 {
		agents = append(agents, joinDaemon(t, d, c, pool.Data.PoolId, agentOld, publicURL, i))
	}
	nodesReady := func(what string) {
		d.eventually(what, "select count(*) from nodes where state = 'ready' and session_gateway is not null", "2")
	}
	nodesReady("both daemons in session")

	l := startLoad(t, c, pool.Data.PoolId, 4)
	t.Cleanup(func() {
		select {
		case <-l.stop:
		default:
			l.halt()
		}
	})
	time.Sleep(2 * time.Second)
	began := time.Now()

	// 1. Expand migrations, by the new release, while the old one runs.
	d.migrate(computedNew)
	d.eventually("the expand migration", "select count(*) from information_schema.columns where table_name = 'nodes' and column_name = 'upgrade_probe'", "1")

	// 2. Workers and api, one process at a time.
	restart := func(name, bin string) {
		t.Helper()
		p := d.procs[name]
		require.Equal(t, 0, p.Stop(t, 90*time.Second), "%s stops cleanly:\n%s", name, proctest.Tail(p.Stderr.String(), 20))
		startRole(name, bin)
	}
	for _, n := range []string{"worker-1", "worker-2"} {
		restart(n, computedNew)
		d.eventually("two workers again", "select count(*) from workers", "2")
	}
	for _, n := range []string{"api-1", "api-2"} {
		restart(n, computedNew)
	}

	// 3. Gateways, one at a time, each drained: its daemons reconnect
	// through the L4 balancer to the other before the next one goes.
	for _, n := range []string{"gateway-1", "gateway-2"} {
		restart(n, computedNew)
		d.eventually("two gateways again", "select count(*) from gateways", "2")
		nodesReady("daemons back in session after " + n)
	}

	// 4. Daemons, from downloads: compute-agent upgrade verifies the
	// release signature with the key pinned at join and restarts in place.
	for _, a := range agents {
		a.upgrade(t, newV)
		d.eventually("daemon on "+newV, "select agent_version from nodes where node_id = $1", newV, a.node)
	}
	nodesReady("daemons in session after their upgrade")

	// 5. Contract migrations, by the release after, once no process of
	// the old release runs.
	d.migrate(computedNext)
	d.eventually("the contract migration", "select count(*) from information_schema.columns where table_name = 'nodes' and column_name = 'upgrade_probe'", "0")
	time.Sleep(2 * time.Second)
	upgradeTook := time.Since(began)
	l.halt()
	t.Logf("rolling upgrade (%s): %s; the L7 balancer resent %d and passed over an unready api %d times", upgradeTook.Round(time.Second), l.report(), d.l7.resent.Load(), d.l7.skipped.Load())
	assert.Zero(t, l.failed(), "no call fails during the rolling upgrade: %s", l.report())
	require.Greater(t, l.calls.Load(), int64(100))

	// 6. PostgreSQL fails over to its standby while calls go on.
	pg.WaitReplicated(t, func(q string) (string, error) { return d.query(q) })
	l2 := startLoad(t, c, pool.Data.PoolId, 4)
	t.Cleanup(func() {
		select {
		case <-l2.stop:
		default:
			l2.halt()
		}
	})
	time.Sleep(2 * time.Second)
	pg.FailPrimary(t)
	failed := time.Now() // the primary is down
	pg.Promote(t)
	promoted := time.Since(failed)
	// The first write sent after the primary went down that succeeds.
	var recovered time.Duration
	require.Eventually(t, func() bool {
		recovered = time.Since(failed)
		return l2.lastOK.Load() > failed.UnixNano()
	}, 60*time.Second, 10*time.Millisecond, "writes succeed again after the failover")
	// Every process reconnected: the workers still deliver events to the
	// sink, the gateways keep the daemons in session, both api processes
	// answer (the L7 balancer alternates).
	d.eventually("two workers after the failover", "select count(*) from workers", "2")
	nodesReady("daemons in session after the failover")
	before := sinkLines(t, sink)
	_, err = c.SitesCreate(ctx, &client.SitesCreateInput{TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "after-failover"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return sinkLines(t, sink) > before }, 60*time.Second, 100*time.Millisecond, "the sinks deliver after the failover")
	for range 4 {
		_, err := c.PoolsGet(ctx, &client.PoolsGetInput{TenantId: tenant, PoolId: pool.Data.PoolId})
		require.NoError(t, err)
	}
	time.Sleep(time.Second)
	l2.halt()
	t.Logf("failover: promoted in %s, writes again after %s; %s; the L7 balancer resent %d (in all)", promoted.Round(time.Millisecond), recovered.Round(time.Millisecond), l2.report(), d.l7.resent.Load())
	assert.Zero(t, l2.failed(), "calls answer UNAVAILABLE (retried) during the failover, nothing else: %s", l2.report())
	for name, p := range d.procs {
		assert.False(t, p.Exited(), "%s runs", name)
	}
}

func sinkLines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// publishAgent lays out bin as compute-agent <version> for this machine's
// platform, signed with the bundle's release key.
func publishAgent(t *testing.T, dir string, b *pki.Bundle, bin, version string) {
	t.Helper()
	body, err := os.ReadFile(bin)
	require.NoError(t, err)
	platform := runtime.GOOS + "-" + runtime.GOARCH
	p := filepath.Join(dir, filepath.FromSlash(release.Path("compute-agent", version, platform)))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	sum := sha256.Sum256(body)
	require.NoError(t, os.WriteFile(p, body, 0o755))
	require.NoError(t, os.WriteFile(p+release.ChecksumSuffix, release.ChecksumFile(platform, sum), 0o644))
	require.NoError(t, os.WriteFile(p+release.SignatureSuffix, release.Sign(b.ReleaseSigning, "compute-agent", version, platform, sum), 0o644))
}

type daemon struct {
	dir, bin, node string
	proc           *proctest.Process
}

func joinDaemon(t *testing.T, d *deployment, c *computeclient.Client, pool, bin, api string, i int) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "deploy-agent") // short: unix sockets under it
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	own := filepath.Join(dir, "compute-agent")
	b, err := os.ReadFile(bin)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(own, b, 0o755))
	tok, err := c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: tenant, PoolId: pool})
	require.NoError(t, err)
	tokFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokFile, []byte(tok.Data.Token), 0o600))
	a := &daemon{dir: dir, bin: own}
	a.node = strings.TrimSpace(proctest.Run(t, own, proctest.ChildEnv(nil), "join", "--api", api, "--token-file", tokFile, "--dir", dir))
	a.proc = proctest.Start(t, fmt.Sprintf("daemon-%d", i+1), own, proctest.ChildEnv(nil), "run", "--dir", dir, "--runtime", "recording")
	d.procs[fmt.Sprintf("daemon-%d", i+1)] = a.proc
	return a
}

func (a *daemon) upgrade(t *testing.T, version string) {
	t.Helper()
	proctest.Run(t, a.bin, proctest.ChildEnv(nil), "upgrade", "--dir", a.dir, "--version", version)
}
