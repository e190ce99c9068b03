// Package fleettest runs a small deployment as real processes for
// end-to-end tests: one computed with every role (the gateway included)
// on a database of its own, and compute-agents that join its pools.
package fleettest

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/metrics"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/testenv"
)

// Tenant is the tenant the fleet's client acts as (an owner key).
const Tenant = "acme"

// Fleet is a running deployment.
type Fleet struct {
	t        *testing.T
	C        *computeclient.Client
	Key      string // the owner key C uses
	DB       *pgxpool.Pool
	Computed *proctest.Process
	// Gateway is computed with the gateway role alone, beside Computed
	// with the others, with the SplitGateway option (nil otherwise).
	Gateway   *proctest.Process
	PublicURL string
	// PKIFile is the deployment's sealed PKI bundle (the service secret
	// is testenv.TestSecret).
	PKIFile string
	// ComputedBin and AgentBin are the binaries the fleet runs.
	ComputedBin, AgentBin string
	agentBin              string
	// computed and env make more keys (Client, CreateKey).
	computed string
	env      []string
	agentEnv map[string]string
	addr     string // the api's listener
	metrics  string // the metrics token, with the Metrics option
}

// Option changes the deployment Start runs.
type Option func(*options)

type options struct {
	tunnels bool
	// previewDomain is tunnels.previewDomain ("" none).
	previewDomain string
	ssh           bool
	version       string
	env           map[string]string
	agentEnv      map[string]string
	// tunnelLimits is tunnels.limits (TunnelLimits).
	tunnelLimits string
	metrics      bool
	// gatewayEnv, with SplitGateway, is the gateway process's added
	// environment (nil: one process with every role).
	gatewayEnv map[string]string
}

// Env adds variables to computed's environment (a blob store's
// credentials, say).
func Env(vars map[string]string) Option { return func(o *options) { o.env = vars } }

// AgentEnv adds variables to every compute-agent's environment.
func AgentEnv(vars map[string]string) Option { return func(o *options) { o.agentEnv = vars } }

// Version stamps the release version into the binaries the fleet builds,
// as make release does.
func Version(v string) Option { return func(o *options) { o.version = v } }

// Tunnels configures tunnels (the issuer is the public URL) and the
// gateway's internal API they relay through.
func Tunnels() Option { return func(o *options) { o.tunnels = true } }

// TunnelLimits configures tunnels with limits, the YAML flow mapping of
// tunnels.limits ("{openPerNode: 2}").
func TunnelLimits(limits string) Option {
	return func(o *options) { o.tunnels, o.tunnelLimits = true, limits }
}

// PreviewDomain configures tunnels with host-based preview URLs under
// domain (tunnels.previewDomain).
func PreviewDomain(domain string) Option {
	return func(o *options) { o.tunnels, o.previewDomain = true, domain }
}

// SSH configures tunnels with SSH (tunnels.ssh: true).
func SSH() Option { return func(o *options) { o.tunnels, o.ssh = true, true } }

// SplitGateway runs the gateway role as a process of its own (Fleet.Gateway,
// env added to its environment) beside computed with every other role, as
// a deployment separates them: what one role holds can then be measured.
func SplitGateway(env map[string]string) Option {
	return func(o *options) {
		o.gatewayEnv = env
		if o.gatewayEnv == nil {
			o.gatewayEnv = map[string]string{}
		}
	}
}

// Metrics serves /metrics with a token, for Fleet.RoundTrips.
func Metrics() Option { return func(o *options) { o.metrics = true } }

// Start runs computed with every role on a fresh database; extraConfig is
// appended to its configuration file (after the gateway option).
func Start(t *testing.T, extraConfig string, opts ...Option) *Fleet {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dbURL := dbtest.URL(t)
	dir := t.TempDir()
	computed := proctest.BuildVersion(t, "computeplane/cmd/computed", o.version)
	f := &Fleet{t: t, agentBin: proctest.BuildVersion(t, "computeplane/cmd/compute-agent", o.version), agentEnv: o.agentEnv}
	f.ComputedBin, f.AgentBin = computed, f.agentBin
	pkiFile := filepath.Join(dir, "pki.json")
	f.PKIFile = pkiFile
	_, _, err := pki.Init(pkiFile, testenv.TestSecret, "fleet.local")
	require.NoError(t, err)
	port, gwPort := testenv.FreePort(t), testenv.FreePort(t)
	f.PublicURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	internal := ""
	if o.tunnels {
		internal = fmt.Sprintf(", internalListen: \"127.0.0.1:%d\"", testenv.FreePort(t))
		extra := ""
		if o.tunnelLimits != "" {
			extra += ", limits: " + o.tunnelLimits
		}
		if o.previewDomain != "" {
			extra += fmt.Sprintf(", previewDomain: %q", o.previewDomain)
		}
		extraConfig += fmt.Sprintf("tunnels: {issuer: %q, ssh: %t%s}\n", f.PublicURL, o.ssh, extra)
	}
	cfg := testenv.ConfigFile(t, fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: eu, listen: \"127.0.0.1:%d\", downAfterMs: 5000%s}\n%s",
		gwPort, gwPort, internal, extraConfig))
	vars := map[string]string{
		"SERVICE_DATABASE_URL": dbURL, "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": pkiFile, "SERVICE_CONFIG": cfg,
		"SERVICE_BASE_URL": f.PublicURL, "HOST": "127.0.0.1", "PORT": strconv.Itoa(port),
	}
	if o.metrics {
		f.metrics = "fleet-metrics-token"
		vars[config.EnvMetricsToken] = f.metrics
	}
	for k, v := range o.env {
		vars[k] = v
	}
	if o.gatewayEnv != nil {
		vars[config.EnvRoles] = "api,controllers,scheduler,sinks,iam"
	}
	env := proctest.ChildEnv(vars)
	f.computed, f.env = computed, env
	f.Computed = proctest.Start(t, "computed", computed, env, "serve")
	f.addr = fmt.Sprintf("127.0.0.1:%d", port)
	f.Computed.WaitHealthy(t, f.addr)
	if o.gatewayEnv != nil {
		gwVars := maps.Clone(vars)
		maps.Copy(gwVars, o.gatewayEnv)
		gwVars[config.EnvRoles] = "gateway"
		f.Gateway = proctest.Start(t, "gateway", computed, proctest.ChildEnv(gwVars), "serve")
		// No api listener (no /healthz): up once its daemon listener
		// answers.
		require.Eventually(t, func() bool {
			f.Gateway.RequireRunning(t)
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", gwPort), time.Second)
			if err == nil {
				_ = c.Close()
			}
			return err == nil
		}, 30*time.Second, 20*time.Millisecond, "the gateway process listens")
	}
	key := proctest.CreateKey(t, computed, env, Tenant, "ops", "owner")
	f.Key = key
	f.C, err = computeclient.New(f.PublicURL+config.DefaultBasePath, computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	require.NoError(t, err)
	f.DB, err = pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(f.DB.Close)
	return f
}

// Client is a client acting as an owner of another tenant (a key made
// by computed's iam create-key).
func (f *Fleet) Client(tenant string) *computeclient.Client {
	t := f.t
	t.Helper()
	key := proctest.CreateKey(t, f.computed, f.env, tenant, "ops-"+tenant, "owner")
	c, err := computeclient.New(f.PublicURL+config.DefaultBasePath, computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	require.NoError(t, err)
	return c
}

// CreateKey creates an API key for identity with role in tenant (args:
// more of computed iam create-key's flags, e.g. --mfa) and returns it.
func (f *Fleet) CreateKey(tenant, identity, role string, args ...string) string {
	f.t.Helper()
	out := proctest.Run(f.t, f.computed, f.env, append([]string{"iam", "create-key", "--tenant", tenant, "--identity", identity, "--role", role}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// RunComputed runs a command of computed (iam revoke-key ...) against
// the fleet's database and returns its standard output.
func (f *Fleet) RunComputed(args ...string) string {
	f.t.Helper()
	return proctest.Run(f.t, f.computed, f.env, args...)
}

// RestartComputed stops computed with SIGTERM (its shutdown in the
// specification's order) and starts it again, waiting until it is healthy.
func (f *Fleet) RestartComputed() {
	t := f.t
	t.Helper()
	f.Computed.Stop(t, 60*time.Second)
	f.Computed = proctest.Start(t, "computed", f.computed, f.env, "serve")
	f.Computed.WaitHealthy(t, f.addr)
}

// Pool makes a site and a hosted pool of class (vps-host, metal-host)
// with a flavor of vcpu and memory, and returns the pool's id.
func (f *Fleet) Pool(class client.PoolsCreateInputClass, flavor string, vcpu, memoryMiB int64) string {
	t := f.t
	t.Helper()
	site, err := f.C.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: Tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu",
		IdempotencyKey: "site-" + flavor})
	require.NoError(t, err)
	pool, err := f.C.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: Tenant, SiteId: site.Data.SiteId, Name: "pool-" + flavor,
		Class: class, IdempotencyKey: "pool-" + flavor})
	require.NoError(t, err)
	_, err = f.C.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: Tenant, PoolId: pool.Data.PoolId, Name: flavor, Vcpu: vcpu,
		MemoryMiB: memoryMiB, DiskGiB: client.NewOptInt64(1)})
	require.NoError(t, err)
	return pool.Data.PoolId
}

// Agent is one compute-agent.
type Agent struct {
	f    *Fleet
	Dir  string
	Node string
	Proc *proctest.Process
	args []string
}

// Join joins a compute-agent to pool (a token minted through the API) and
// runs it with args (--runtime ..., capacity flags); the test waits until
// its node is ready.
func (f *Fleet) Join(pool string, args ...string) *Agent {
	t := f.t
	t.Helper()
	tok, err := f.C.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: Tenant, PoolId: pool})
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "agent") // short: unix socket paths under it
	require.NoError(t, err)
	// Guest memory files on a tmpfs, as an operator would set it, gone
	// with the test.
	memory, err := os.MkdirTemp("/dev/shm", "agent-memory")
	require.NoError(t, err)
	a := &Agent{f: f, Dir: dir, args: append([]string{"--memory-dir", memory}, args...)}
	t.Cleanup(func() {
		a.Stop()
		// VMs outlive their daemon by design: end them with the test.
		pids, _ := filepath.Glob(filepath.Join(dir, "runtime", "vms", "*", "qemu.pid"))
		// (and a restore pool's qemus, should the daemon have failed to)
		pooled, _ := filepath.Glob(filepath.Join(dir, "runtime", "pool", "*", "qemu.pid"))
		pids = append(pids, pooled...)
		for _, p := range pids {
			if b, err := os.ReadFile(p); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(memory)
	})
	tokFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokFile, []byte(tok.Data.Token), 0o600))
	a.Node = strings.TrimSpace(proctest.Run(t, f.agentBin, proctest.ChildEnv(nil), "join", "--api", f.PublicURL, "--token-file", tokFile, "--dir", dir))
	a.Run()
	require.Eventually(t, func() bool {
		a.Proc.RequireRunning(t)
		return f.NodeState(a.Node) == "ready"
	}, 30*time.Second, 50*time.Millisecond)
	return a
}

// Run starts the agent (again).
func (a *Agent) Run() {
	a.Proc = proctest.Start(a.f.t, "agent", a.f.agentBin, proctest.ChildEnv(a.f.agentEnv), append([]string{"run", "--dir", a.Dir}, a.args...)...)
}

// Stop ends the agent with SIGTERM when it runs.
func (a *Agent) Stop() {
	if a.Proc != nil && !a.Proc.Exited() {
		_ = a.Proc.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-time.After(10 * time.Second):
			_ = a.Proc.Cmd.Process.Kill()
		case <-waitExit(a.Proc):
		}
	}
}

func waitExit(p *proctest.Process) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for !p.Exited() {
			time.Sleep(10 * time.Millisecond)
		}
		close(ch)
	}()
	return ch
}

// NodeState reads a node's state.
func (f *Fleet) NodeState(node string) string {
	var s string
	_ = f.DB.QueryRow(f.t.Context(), `select state from nodes where node_id = $1`, node).Scan(&s)
	return s
}

// Events counts the outbox events of typ about subject.
func (f *Fleet) Events(typ, subject string) int {
	var n int
	require.NoError(f.t, f.DB.QueryRow(f.t.Context(), `select count(*) from outbox where type = $1 and subject = $2`, typ, subject).Scan(&n))
	return n
}

// RoundTrips reads computed's compute_rpc_db_round_trips of method (the
// Metrics option): how many calls it counted and their round trips in all.
func (f *Fleet) RoundTrips(method string) (calls uint64, trips float64) {
	t := f.t
	t.Helper()
	require.NotEmpty(t, f.metrics, "start the fleet with fleettest.Metrics()")
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.PublicURL+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+f.metrics)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	require.NoError(t, err)
	for _, m := range fams[metrics.RPCDBRoundTrips].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "method" && l.GetValue() == method {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

// CallRoundTrips runs call and returns the database round trips computed
// counted for it (call makes exactly one call of method).
func (f *Fleet) CallRoundTrips(method string, call func()) int {
	t := f.t
	t.Helper()
	n0, sum0 := f.RoundTrips(method)
	call()
	n1, sum1 := f.RoundTrips(method)
	require.Equal(t, n0+1, n1, "one call of %s", method)
	return int(sum1 - sum0)
}

// SpecApplied waits until node's daemon has applied its latest spec (its
// reports after a change are done, so its row is not being written).
func (f *Fleet) SpecApplied(node string) {
	t := f.t
	t.Helper()
	require.Eventually(t, func() bool {
		var applied bool
		err := f.DB.QueryRow(t.Context(), `select coalesce(n.observed_generation >= s.generation, true) from nodes n
			left join node_specs s using (node_id) where n.node_id = $1`, node).Scan(&applied)
		return err == nil && applied
	}, 30*time.Second, 20*time.Millisecond, "node %s applies its spec", node)
}

// FewestRoundTrips makes tries calls of method (call(i) makes the i-th),
// each once node's daemon has applied its spec, and returns the fewest
// round trips one took: a call that finds the node's row locked by the
// daemon's report books again after a pause (placement.HeldWait), which
// measures contention rather than the call.
func (f *Fleet) FewestRoundTrips(method, node string, tries int, call func(i int)) int {
	f.t.Helper()
	fewest := -1
	for i := range tries {
		f.SpecApplied(node)
		n := f.CallRoundTrips(method, func() { call(i) })
		f.t.Logf("%s: %d round trips", method, n)
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	return fewest
}

// RoundTripGoal is the fleet paths' goal of database round trips per call
// (issue 26; docs/benchmarks.md).
const RoundTripGoal = 8

// AtMostRoundTrips holds the round trips n of the call label names at
// most, what the method makes today, and never above RoundTripGoal; it
// records them (RecordRoundTrips).
func AtMostRoundTrips(t *testing.T, label string, n, most int) {
	t.Helper()
	RecordRoundTrips(t, label, n)
	assert.LessOrEqual(t, n, min(most, RoundTripGoal), label)
}

// RoundTripsOutEnv names a file to which RecordRoundTrips appends each
// count, one "label<TAB>count" line: scripts/roundtrips.sh collects them
// for the figures of `make bench` (docs/benchmarks.md).
const RoundTripsOutEnv = "ROUNDTRIPS_OUT"

// RecordRoundTrips logs the round trips n of the call label names and,
// with RoundTripsOutEnv set, appends them to that file.
func RecordRoundTrips(t *testing.T, label string, n int) {
	t.Helper()
	t.Logf("%s: %d round trips", label, n)
	path := os.Getenv(RoundTripsOutEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	_, err = fmt.Fprintf(f, "%s\t%d\n", label, n)
	require.NoError(t, errors.Join(err, f.Close()))
}
