package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

// Issue 21: a gateway restarted at the same URL under a new id welcomed
// the daemon, which remembered the id of the list entry it dialled; at
// the next drop it dialled the restarted gateway again first (with a dead
// host, a 10 s dial timeout). The welcome's id and the URL name it now.
// transports.json keeps only the gateways listed.
func TestARestartedGatewayIsLeftByItsWelcomeIDAndURL(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g1, g2 := w.gateway("gw_1", false), w.gateway("gw_2", false)
	w.setGateways("", g1, g2) // the list as joined: gw_1 at g1's URL
	// g1 has restarted as gw_1b; its welcome lists it (and the old entry,
	// whose lease has not run out yet).
	g1.welcomeID = "gw_1b"
	g1.list = []agentproto.Gateway{{ID: "gw_1b", URL: g1.srv.URL}, {ID: "gw_1", URL: g1.srv.URL}, {ID: "gw_2", URL: g2.srv.URL}}
	g2.list = g1.list
	// The last session was on gw_1: it is dialled first.
	require.NoError(t, writeJSON(w.dir.path(fileStatus), Status{NodeID: "node_a", GatewayID: "gw_1"}))
	require.NoError(t, writeJSON(w.dir.path(fileTransports), map[string]string{"gw_1": "mtls", "https://gone.example:1": "wss-fallback"}))
	w.run()

	s := g1.next(t)
	require.Eventually(t, func() bool { st := w.status(); return st.Connected && st.GatewayID == "gw_1b" }, waitFor, 10*time.Millisecond)
	var remembered map[string]string
	require.NoError(t, readJSON(w.dir.path(fileTransports), &remembered))
	assert.Equal(t, map[string]string{g1.srv.URL: agentproto.TransportMTLS}, remembered, "gateways no longer listed are forgotten")

	// gw_1b drops the session: the daemon goes to gw_2, not back to it.
	before := g1.requests.Load()
	require.NoError(t, s.conn.CloseNow())
	g2.next(t)
	assert.Equal(t, before, g1.requests.Load(), "the dropped gateway is not dialled first")
	require.Eventually(t, func() bool { return w.status().GatewayURL == g2.srv.URL }, waitFor, 10*time.Millisecond)
}

// Issue 21: a one-process `make run` restarted in a second left its
// daemon without a session for the drain delay (up to a minute). With no
// other gateway to spread over, the drained one is dialled again at once,
// then with a backoff of at most DrainRetryMax.
func TestDrainWithoutAnotherGatewayReconnectsAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g := w.gateway("gw_1", false)
	w.setGateways("", g)
	w.run()

	s := g.next(t)
	g.busy.Store(true) // draining, then restarting
	require.NoError(t, s.send(agentproto.Message{Type: agentproto.TypeReconnect, Reconnect: &agentproto.Reconnect{DelayMS: 60_000}}))
	require.Eventually(t, func() bool { return g.requests.Load() >= 4 }, waitFor, 10*time.Millisecond, "dialled again during the drain")
	time.Sleep(1500 * time.Millisecond) // the backoff would have grown past DrainRetryMax by now
	g.busy.Store(false)
	back := time.Now()
	g.next(t)
	assert.Less(t, time.Since(back), DrainRetryMax*3/2+500*time.Millisecond, "back within the short backoff")
}

// A draining gateway's 503 is its answer over mutual TLS: the daemon does
// not climb down to the fallback for it, nor remember the fallback.
func TestABusyGatewayIsNoReasonForTheFallback(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g := w.gateway("gw_1", false)
	fb := w.gateway("public", true)
	g.busy.Store(true)
	w.setGateways(fb.wsURL(), g)
	w.run()

	require.Eventually(t, func() bool { return g.requests.Load() >= 3 }, waitFor, 10*time.Millisecond)
	assert.Zero(t, fb.requests.Load(), "the fallback is not dialled")
	g.busy.Store(false)
	s := g.next(t)
	assert.Equal(t, agentproto.TransportMTLS, s.hello.Transport)
}

// Daemons spread over the region's gateways (issue 21: all of them read
// one least-loaded-first order and sat on the same gateway), and losing a
// gateway moves only its daemons.
func TestOrderSpreadsDaemonsOverGateways(t *testing.T) {
	gws := []agentproto.Gateway{{ID: "gw_a", URL: "https://a:7443"}, {ID: "gw_b", URL: "https://b:7443"}, {ID: "gw_c", URL: "https://c:7443"}}
	first := func(node string, list []agentproto.Gateway) string {
		a := &Agent{state: &State{NodeID: node, Gateways: list}}
		return a.order(gatewayRef{})[0].ID
	}
	const n = 900
	on := map[string]int{}
	for i := range n {
		on[first(fmt.Sprintf("node_%d", i), gws)]++
	}
	for _, g := range gws {
		assert.InDelta(t, n/3, on[g.ID], n/10, "daemons on %s", g.ID)
	}
	moved := 0
	for i := range n {
		node := fmt.Sprintf("node_%d", i)
		was, now := first(node, gws), first(node, gws[:2])
		if was != "gw_c" {
			assert.Equal(t, was, now, "a daemon of a surviving gateway stays")
		} else {
			moved++
		}
	}
	assert.Equal(t, on["gw_c"], moved)

	// Draining gateways last, one entry per URL, the avoided one at the
	// end, the last one first.
	list := []agentproto.Gateway{{ID: "gw_d", URL: "https://d:7443", Draining: true}, gws[0], {ID: "gw_a2", URL: gws[0].URL}, gws[1], gws[2]}
	a := &Agent{state: &State{NodeID: "node_1", Gateways: list}, lastGateway: gatewayRef{id: "gw_c"}}
	got := a.order(gatewayRef{id: "gw_b2", url: gws[1].URL})
	require.Len(t, got, 4)
	assert.Equal(t, "gw_c", got[0].ID)
	assert.Equal(t, "gw_a", got[1].ID)
	assert.Equal(t, "gw_d", got[2].ID)
	assert.Equal(t, "gw_b", got[3].ID)
}
