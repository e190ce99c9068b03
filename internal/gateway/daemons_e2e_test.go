package gateway_test

// Issue 11's end-to-end test with real processes on loopback: one computed
// process with the api and worker roles (P0), two gateway processes (G1
// also serves the public host the daemons join through and its WebSocket
// fallback, G2 is a gateway only), and two compute-agent processes. The
// daemons join with single-use tokens, hold sessions, apply a spec, run a
// signed command; a SIGKILLed gateway's nodes move to the other gateway
// within the lease time; a drained gateway's daemons reconnect and
// re-sync; a killed daemon's node goes down and comes back up.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agentproto"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/gateway"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/testenv"
)

// fleet is the processes of the test and what it needs to drive them.
type fleet struct {
	t               *testing.T
	dir             string
	computed, agent string
	db              *pgxpool.Pool
	c               *computeclient.Client
	envOf           func(cfg, roles string, port int) []string
	publicURL       string // G1's HTTP listener: join and the fallback
	gwPorts         [2]int
	gwCfg           [2]string
	gws             [2]*proctest.Process
	httpPorts       [2]int
	poolID          string
}

const downAfter = 2 * time.Second

func (f *fleet) startGateway(i int) {
	roles := "gateway"
	if i == 0 {
		roles = "api,gateway" // the public host: join and the fallback
	}
	var since time.Time
	require.NoError(f.t, f.db.QueryRow(f.t.Context(), `select now()`).Scan(&since))
	f.gws[i] = proctest.Start(f.t, fmt.Sprintf("G%d", i+1), f.computed, f.envOf(f.gwCfg[i], roles, f.httpPorts[i]), "serve")
	if i == 0 {
		f.gws[i].WaitHealthy(f.t, fmt.Sprintf("127.0.0.1:%d", f.httpPorts[i]))
	}
	require.Eventually(f.t, func() bool {
		f.gws[i].RequireRunning(f.t)
		var n int
		_ = f.db.QueryRow(f.t.Context(), `select count(*) from gateways where url = $1 and started_at >= $2`, f.gwURL(i), since).Scan(&n)
		return n == 1
	}, 30*time.Second, 20*time.Millisecond, "gateway %d registered", i+1)
}

func (f *fleet) gwURL(i int) string { return fmt.Sprintf("https://127.0.0.1:%d", f.gwPorts[i]) }

// gatewayOf is the index of the gateway process holding the node's
// session, or -1.
func (f *fleet) gatewayOf(node string) int {
	var url string
	err := f.db.QueryRow(f.t.Context(), `select g.url from nodes n join gateways g on g.gateway_id = n.session_gateway where n.node_id = $1`, node).Scan(&url)
	if err != nil {
		return -1
	}
	for i := range f.gwPorts {
		if url == f.gwURL(i) {
			return i
		}
	}
	return -1
}

// agentProc is one compute-agent.
type agentProc struct {
	dir  string
	node string
	p    *proctest.Process
}

func (f *fleet) join(name string) *agentProc {
	tok, err := f.c.PoolsJoinToken(f.t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: f.poolID})
	require.NoError(f.t, err)
	dir := filepath.Join(f.dir, name)
	tokFile := filepath.Join(f.dir, name+".token")
	require.NoError(f.t, os.WriteFile(tokFile, []byte(tok.Data.Token), 0o600))
	out := proctest.Run(f.t, f.agent, proctest.ChildEnv(nil), "join", "--api", f.publicURL, "--token-file", tokFile, "--dir", dir, "--hostname", name)
	a := &agentProc{dir: dir, node: strings.TrimSpace(out)}
	require.True(f.t, strings.HasPrefix(a.node, "node_"), "join prints the node id: %q", out)
	// The token is single-use: a second machine presenting it is refused.
	other := filepath.Join(f.dir, name+"-replay")
	_, err = runAgent(f.agent, "join", "--api", f.publicURL, "--token-file", tokFile, "--dir", other)
	require.Error(f.t, err, "a replayed join token is refused")
	return a
}

func (f *fleet) run(a *agentProc) {
	a.p = proctest.Start(f.t, "agent "+filepath.Base(a.dir), f.agent, proctest.ChildEnv(nil),
		"run", "--dir", a.dir, "--runtime", "recording", "--vcpu", "4", "--memory-mib", "8192", "--disk-gib", "50")
}

func runAgent(bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = proctest.ChildEnv(nil)
	return cmd.CombinedOutput()
}

func (f *fleet) state(node string) string {
	var s string
	require.NoError(f.t, f.db.QueryRow(f.t.Context(), `select state from nodes where node_id = $1`, node).Scan(&s))
	return s
}

func (f *fleet) events(typ, node string) int {
	var n int
	require.NoError(f.t, f.db.QueryRow(f.t.Context(), `select count(*) from outbox where type = $1 and subject = $2`, typ, node).Scan(&n))
	return n
}

// putSpec writes a node's desired spec and wakes its gateway, as the api
// does after commit.
func (f *fleet) putSpec(node string, instances ...agentproto.InstanceSpec) int64 {
	var gen int64
	require.NoError(f.t, pgx.BeginFunc(f.t.Context(), f.db, func(tx pgx.Tx) error {
		g, topic, err := nodework.PutSpec(f.t.Context(), tx, node, agentproto.SpecBody{Instances: instances})
		gen = g
		if err != nil {
			return err
		}
		_, err = tx.Exec(f.t.Context(), `select pg_notify($1, $2)`, notify.Channel, topic)
		return err
	}))
	return gen
}

func (f *fleet) observed(node string) int64 {
	var g int64
	require.NoError(f.t, f.db.QueryRow(f.t.Context(), `select observed_generation from nodes where node_id = $1`, node).Scan(&g))
	return g
}

// appliedGeneration is what the recording runtime wrote on the host.
func appliedGeneration(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "runtime", "spec.json"))
	if err != nil {
		return 0
	}
	var s struct {
		Generation int64 `json:"generation"`
	}
	_ = json.Unmarshal(b, &s)
	return s.Generation
}

func TestDaemonsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds computed and compute-agent and runs five processes")
	}
	dbURL := dbtest.URL(t)
	f := &fleet{t: t, dir: t.TempDir()}
	f.computed = proctest.Build(t, "computeplane/cmd/computed")
	f.agent = proctest.Build(t, "computeplane/cmd/compute-agent")
	pkiFile := filepath.Join(f.dir, "pki.json")
	_, _, err := pki.Init(pkiFile, testenv.TestSecret, "e2e.local")
	require.NoError(t, err)
	f.db, err = pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(f.db.Close)

	p0Port := testenv.FreePort(t)
	f.httpPorts = [2]int{testenv.FreePort(t), testenv.FreePort(t)}
	f.gwPorts = [2]int{testenv.FreePort(t), testenv.FreePort(t)}
	f.publicURL = fmt.Sprintf("http://127.0.0.1:%d", f.httpPorts[0])
	for i := range f.gwCfg {
		f.gwCfg[i] = testenv.ConfigFile(t, fmt.Sprintf(
			"gateway: {url: %q, region: eu, listen: \"127.0.0.1:%d\", drainDelayMs: 300, downAfterMs: %d}\n",
			f.gwURL(i), f.gwPorts[i], downAfter.Milliseconds()))
	}
	f.envOf = func(cfg, roles string, port int) []string {
		return proctest.ChildEnv(map[string]string{
			"SERVICE_DATABASE_URL": dbURL, "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": pkiFile,
			"SERVICE_CONFIG": cfg, "SERVICE_ROLES": roles, "SERVICE_BASE_URL": f.publicURL,
			"HOST": "127.0.0.1", "PORT": strconv.Itoa(port),
		})
	}
	// P0: the api and every worker role (the command sweeper among them).
	p0 := proctest.Start(t, "P0", f.computed, f.envOf(f.gwCfg[0], "api,controllers,scheduler,sinks,iam", p0Port), "serve")
	p0.WaitHealthy(t, fmt.Sprintf("127.0.0.1:%d", p0Port))
	key := proctest.CreateKey(t, f.computed, f.envOf(f.gwCfg[0], "api", p0Port), "acme", "ops", "owner")
	f.c, err = computeclient.New(fmt.Sprintf("http://127.0.0.1:%d%s", p0Port, config.DefaultBasePath),
		computeclient.WithToken(key), computeclient.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}))
	require.NoError(t, err)
	f.startGateway(0)
	f.startGateway(1)

	site, err := f.c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := f.c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "hosts",
		Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	f.poolID = pool.Data.PoolId

	// Two daemons join and hold sessions; their nodes become ready with
	// the capacity they report.
	agents := []*agentProc{f.join("host-a"), f.join("host-b")}
	for _, a := range agents {
		f.run(a)
	}
	for _, a := range agents {
		require.Eventually(t, func() bool { a.p.RequireRunning(t); return f.state(a.node) == "ready" }, 30*time.Second, 50*time.Millisecond,
			"node %s ready\n%s", a.node, proctest.Tail(a.p.Stderr.String(), 20))
		n, err := f.c.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: a.node})
		require.NoError(t, err)
		assert.EqualValues(t, 4, n.Data.Capacity.Vcpu)
		assert.Equal(t, 1, f.events("node.registered", a.node))
	}

	// A spec reaches the daemon, which applies it and reports the
	// generation it observed.
	a := agents[0]
	gen := f.putSpec(a.node, agentproto.InstanceSpec{ID: "inst-1", State: "running"})
	require.Eventually(t, func() bool { return appliedGeneration(a.dir) == gen && f.observed(a.node) == gen }, 15*time.Second, 50*time.Millisecond)

	// A signed command runs once and its result comes back.
	var cmdID string
	require.NoError(t, pgx.BeginFunc(t.Context(), f.db, func(tx pgx.Tx) error {
		c, topic, err := nodework.EnqueueCommand(t.Context(), tx, a.node, agentproto.CommandEcho, json.RawMessage(`{"say":"hello"}`), "test", time.Minute, time.Now())
		cmdID = c.CommandID
		if err != nil {
			return err
		}
		_, err = tx.Exec(t.Context(), `select pg_notify($1, $2)`, notify.Channel, topic)
		return err
	}))
	var result []byte
	require.Eventually(t, func() bool {
		var state string
		_ = f.db.QueryRow(t.Context(), `select state, coalesce(result, 'null') from node_commands where command_id = $1`, cmdID).Scan(&state, &result)
		return state == "succeeded"
	}, 15*time.Second, 50*time.Millisecond)
	var r agentproto.Result
	require.NoError(t, json.Unmarshal(result, &r))
	assert.JSONEq(t, `{"say":"hello"}`, string(r.Output))
	assert.FileExists(t, filepath.Join(a.dir, "commands", cmdID+".json"), "the command is journaled on the host")

	// SIGKILL the gateway holding node a: its daemons move to the other
	// gateway of the region within the lease time, and the node never
	// goes down.
	victim := f.gatewayOf(a.node)
	require.NotEqual(t, -1, victim)
	killedAt := time.Now()
	f.gws[victim].Kill(t)
	survivor := 1 - victim
	for _, ag := range agents {
		require.Eventually(t, func() bool { return f.gatewayOf(ag.node) == survivor }, gateway.LeaseTTL, 50*time.Millisecond,
			"node %s moved to the surviving gateway within the lease time", ag.node)
	}
	t.Logf("sessions moved to the surviving gateway in %s", time.Since(killedAt).Round(time.Millisecond))
	for _, ag := range agents {
		assert.Equal(t, "ready", f.state(ag.node))
		assert.Zero(t, f.events("node.down", ag.node), "a failover is not an outage")
	}

	// The killed gateway restarts; then the survivor drains (SIGTERM):
	// its daemons reconnect to the restarted one and re-sync, a spec
	// written meanwhile arrives.
	f.startGateway(victim)
	gen = f.putSpec(a.node, agentproto.InstanceSpec{ID: "inst-1", State: "stopped"})
	assert.Equal(t, 0, f.gws[survivor].Stop(t, 15*time.Second), "a drained gateway exits cleanly")
	for _, ag := range agents {
		require.Eventually(t, func() bool { return f.gatewayOf(ag.node) == victim }, 15*time.Second, 50*time.Millisecond)
	}
	require.Eventually(t, func() bool { return appliedGeneration(a.dir) == gen && f.observed(a.node) == gen }, 15*time.Second, 50*time.Millisecond)
	f.startGateway(survivor)

	// A daemon killed: its node goes down after downAfter (node.down),
	// and comes back up with the daemon (node.up).
	b := agents[1]
	b.p.Kill(t)
	require.Eventually(t, func() bool { return f.state(b.node) == "down" }, downAfter+3*gateway.SweepEvery, 100*time.Millisecond)
	assert.Equal(t, 1, f.events("node.down", b.node))
	f.run(b)
	require.Eventually(t, func() bool { return f.state(b.node) == "ready" }, 30*time.Second, 50*time.Millisecond)
	assert.Equal(t, 1, f.events("node.up", b.node))

	// Behind a proxy that breaks mutual TLS (here: every gateway URL the
	// daemon knows is unreachable), the transport ladder falls back to the
	// public host's WebSocket endpoint, reports it, and remembers it.
	assert.Equal(t, 0, a.p.Stop(t, 15*time.Second), "a daemon stops cleanly on SIGTERM")
	var st struct {
		Gateways []map[string]any `json:"gateways"`
	}
	statePath := filepath.Join(a.dir, "state.json")
	raw, err := os.ReadFile(statePath)
	require.NoError(t, err)
	var state map[string]any
	require.NoError(t, json.Unmarshal(raw, &state))
	require.NoError(t, json.Unmarshal(raw, &st))
	dead := testenv.FreePort(t)
	for _, g := range st.Gateways {
		g["url"] = fmt.Sprintf("https://127.0.0.1:%d", dead)
	}
	state["gateways"] = st.Gateways
	raw, err = json.Marshal(state)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(statePath, raw, 0o600))
	f.run(a)
	require.Eventually(t, func() bool {
		var transport string
		_ = f.db.QueryRow(t.Context(), `select coalesce(session_transport, '') from nodes where node_id = $1 and session_gateway is not null`, a.node).Scan(&transport)
		return transport == agentproto.TransportWebSocket
	}, 30*time.Second, 50*time.Millisecond, "%s", proctest.Tail(a.p.Stderr.String(), 10))
	// The gateway records the session at hello, the daemon its status
	// file once the welcome arrives: a moment later.
	require.Eventually(t, func() bool {
		status, err := os.ReadFile(filepath.Join(a.dir, "status.json"))
		return err == nil && strings.Contains(string(status), `"transport": "wss-fallback"`)
	}, 10*time.Second, 20*time.Millisecond, "status.json reports the fallback")
	assert.Equal(t, "ready", f.state(a.node))
}
