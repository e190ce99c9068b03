package gateway_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/testenv"
)

// Issue 21: a one-process deployment (`make run`: every role, the region's
// only gateway) restarted in a second, and its daemons waited out the
// drain delay (up to a minute, 60 s by default) with no session. Real
// processes: computed with every role and the default drain delay, two
// compute-agents; each has its session back within 5 s of the restarted
// gateway registering.
func TestDaemonsReconnectWithinSecondsOfTheOnlyGatewayRestarting(t *testing.T) {
	if testing.Short() {
		t.Skip("builds computed and compute-agent and runs three processes")
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

	port := testenv.FreePort(t)
	f.gwPorts[0] = testenv.FreePort(t)
	f.publicURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	cfg := testenv.ConfigFile(t, fmt.Sprintf("gateway: {url: %q, region: solo, listen: \"127.0.0.1:%d\", sessionTicketDays: 7}\n", f.gwURL(0), f.gwPorts[0]))
	env := proctest.ChildEnv(map[string]string{
		"SERVICE_DATABASE_URL": dbURL, "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": pkiFile,
		"SERVICE_CONFIG": cfg, "SERVICE_ROLES": "all", "SERVICE_BASE_URL": f.publicURL, "SERVICE_LOG_LEVEL": "info",
		"HOST": "127.0.0.1", "PORT": strconv.Itoa(port),
	})
	// start runs the process and returns its gateway's id once registered.
	var p *proctest.Process
	start := func() string {
		var since time.Time
		require.NoError(t, f.db.QueryRow(t.Context(), `select now()`).Scan(&since))
		p = proctest.Start(t, "computed", f.computed, env, "serve")
		p.WaitHealthy(t, fmt.Sprintf("127.0.0.1:%d", port))
		var id string
		require.Eventually(t, func() bool {
			p.RequireRunning(t)
			return f.db.QueryRow(t.Context(), `select gateway_id from gateways where url = $1 and started_at >= $2`, f.gwURL(0), since).Scan(&id) == nil
		}, 30*time.Second, 20*time.Millisecond, "the gateway registered")
		return id
	}
	gw := start()
	key := proctest.CreateKey(t, f.computed, env, "acme", "ops", "owner")
	f.c, err = computeclient.New(f.publicURL+config.DefaultBasePath,
		computeclient.WithToken(key), computeclient.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}))
	require.NoError(t, err)
	site, err := f.c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "solo", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := f.c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "hosts",
		Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	f.poolID = pool.Data.PoolId

	sessionOn := func(node string) string {
		var g string
		_ = f.db.QueryRow(t.Context(), `select coalesce(session_gateway, '') from nodes where node_id = $1`, node).Scan(&g)
		return g
	}
	agents := []*agentProc{f.join("host-a"), f.join("host-b")}
	for _, a := range agents {
		f.run(a)
	}
	for _, a := range agents {
		require.Eventually(t, func() bool { a.p.RequireRunning(t); return sessionOn(a.node) == gw }, 30*time.Second, 50*time.Millisecond,
			"node %s holds a session\n%s", a.node, proctest.Tail(a.p.Stderr.String(), 20))
	}

	// Restart: SIGTERM drains (reconnect after a random delay of up to
	// 60 s), the process exits, a new one starts with a new gateway id.
	stopped := time.Now()
	require.Equal(t, 0, p.Stop(t, 30*time.Second), "a drained process exits cleanly")
	gw2 := start()
	require.NotEqual(t, gw, gw2)
	up := time.Now()
	t.Logf("the process was restarted in %s", up.Sub(stopped).Round(time.Millisecond))
	for _, a := range agents {
		require.Eventually(t, func() bool { return sessionOn(a.node) == gw2 }, time.Until(up.Add(5*time.Second)), 20*time.Millisecond,
			"node %s has its session back within 5 s of the gateway's restart\n%s", a.node, proctest.Tail(a.p.Stderr.String(), 10))
	}
	t.Logf("sessions back %s after the gateway registered", time.Since(up).Round(time.Millisecond))
	// Each daemon back over mutual TLS resumed its TLS session with the
	// ticket the first process gave it (the same bundle, the same ticket
	// keys). A daemon whose mutual-TLS dial timed out on a loaded machine
	// is back over the fallback, which has no TLS session to resume
	// (TestDaemonResumesItsTLSSessionOnARestartedGateway covers resumption
	// without that race).
	for _, a := range agents {
		var line string
		require.Eventually(t, func() bool {
			for l := range strings.Lines(p.Stdout.String() + p.Stderr.String()) {
				if strings.Contains(l, `"msg":"session open"`) && strings.Contains(l, `"node":"`+a.node+`"`) {
					line = l
				}
			}
			return line != ""
		}, 10*time.Second, 50*time.Millisecond, "the restarted gateway logs node %s's session", a.node)
		if strings.Contains(line, `"transport":"mtls"`) {
			assert.Contains(t, line, `"resumed":true`, "node %s resumed its TLS session on the restarted gateway\n%s", a.node, proctest.Tail(a.p.Stderr.String(), 20))
		} else {
			t.Logf("node %s came back over the fallback: %s", a.node, line)
		}
	}
	for _, a := range agents {
		assert.Equal(t, "ready", f.state(a.node))
	}
}
