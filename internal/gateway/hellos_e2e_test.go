package gateway_test

// Hellos arriving together open their session rows in one statement
// (hellos.go), and a daemon back with the status it sent before does not
// have it written again.

import (
	"context"
	"encoding/json"
	"expvar"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
	"computeplane/internal/gateway"
	"computeplane/internal/nodework"
)

// gatewayStat reads one of the process's gateway counters (expvar).
func gatewayStat(name string) int64 {
	m, _ := expvar.Get("gateway").(*expvar.Map)
	if m == nil {
		return 0
	}
	v, _ := m.Get(name).(*expvar.Int)
	if v == nil {
		return 0
	}
	return v.Value()
}

// sessionEpoch is the node's row: its session's epoch and gateway.
func (w *world) sessionEpoch(t *testing.T, node string) (int64, string) {
	t.Helper()
	var epoch int64
	var gw *string
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
		`select session_epoch, session_gateway from nodes where node_id = $1`, node).Scan(&epoch, &gw))
	if gw == nil {
		return epoch, ""
	}
	return epoch, *gw
}

// Two hellos of each node race with the hellos of other nodes: a batch
// takes one of a node's hellos and a later batch the other, so each gets
// its own epoch; the session holding the node is the one whose epoch the
// row has, the other is refused or closed (before or after its welcome); and the
// whole storm costs fewer round trips than hellos. Not parallel: it reads
// the process's counters.
func TestHellosThatRaceOpenOneSessionPerNodeInBatches(t *testing.T) {
	w := setup(t)
	const nodes = 8
	var ns []joined
	for range nodes {
		n := w.newNode(t)
		w.session(t, n).CloseNow() // joining -> ready (openRow's transaction)
		ns = append(ns, n)
	}
	closed := func() {
		// Wait until this gateway closed those sessions (their rows).
		require.Eventually(t, func() bool { return w.gw.Sessions() == 0 }, 10*time.Second, 20*time.Millisecond)
	}
	closed()
	// The same reconnects one by one without the batches, for the
	// comparison: openRow's transaction for each.
	gateway.BatchHellos(false)
	hellos0, trips0 := gatewayStat("hellos"), gatewayStat("helloRoundTrips")
	var batches0, slow0 int64
	for _, n := range ns {
		w.session(t, n).CloseNow()
	}
	gateway.BatchHellos(true)
	alone := float64(gatewayStat("helloRoundTrips")-trips0) / float64(gatewayStat("hellos")-hellos0)
	t.Logf("without the batches: %.1f round trips per hello", alone)
	closed()

	// Every connection is dialled first; then all hellos go at once.
	type attempt struct {
		node  int
		conn  *websocket.Conn
		reply agentproto.Message
		err   error
	}
	var attempts []*attempt
	for i, n := range ns {
		for range 2 {
			conn, err := w.dial(t.Context(), n.cert, n.key)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.CloseNow() })
			attempts = append(attempts, &attempt{node: i, conn: conn})
		}
	}
	hellos0, trips0, batches0, slow0 = gatewayStat("hellos"), gatewayStat("helloRoundTrips"), gatewayStat("helloBatches"), gatewayStat("helloSlow")
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, a := range attempts {
		wg.Go(func() {
			<-start
			send(t, a.conn, hello(ns[a.node].nodeID, 0))
			a.reply, a.err = recv(t.Context(), a.conn)
		})
	}
	close(start)
	wg.Wait()
	hellos, trips := gatewayStat("hellos")-hellos0, gatewayStat("helloRoundTrips")-trips0
	t.Logf("%d hellos, %d round trips (%.2f per hello) in %d batches, %d in openRow's transaction", hellos, trips, float64(trips)/float64(hellos), gatewayStat("helloBatches")-batches0, gatewayStat("helloSlow")-slow0)
	assert.EqualValues(t, 2*nodes, hellos)
	assert.Zero(t, gatewayStat("helloSlow")-slow0, "ready nodes open in the batch statement")
	assert.Less(t, trips, hellos, "hellos arriving together share round trips")
	assert.Greater(t, alone, 1.0)

	for i, n := range ns {
		a, b := attempts[2*i], attempts[2*i+1]
		epoch, gw := w.sessionEpoch(t, n.nodeID)
		assert.Equal(t, w.gw.ID(), gw)
		var holder, other *attempt
		for _, x := range []*attempt{a, b} {
			if x.err == nil && x.reply.Type == agentproto.TypeWelcome && x.reply.Welcome.SessionEpoch == epoch {
				holder = x
			} else {
				other = x
			}
		}
		require.NotNil(t, holder, "node %d: a welcome with the row's epoch %d (%+v, %+v)", i, epoch, a.reply, b.reply)
		require.NotNil(t, other)
		switch {
		case other.err != nil:
			// Replaced before its welcome went out: closed.
		case other.reply.Type == agentproto.TypeWelcome:
			// Welcomed with the lower epoch, then replaced: its
			// connection ends.
			assert.Less(t, other.reply.Welcome.SessionEpoch, epoch)
			_, err := recv(t.Context(), other.conn)
			assert.Error(t, err, "node %d: the replaced session is closed", i)
		default:
			require.Equal(t, agentproto.TypeError, other.reply.Type)
			assert.Equal(t, "INVALID_STATE", other.reply.Error.Code)
		}
		// The holder's session writes: its status reaches the row.
		send(t, holder.conn, agentproto.Message{Type: agentproto.TypeStatus, Status: &agentproto.Status{
			VolumeStore: agentproto.VolumeStore{AvailableBytes: int64(1000 + i)}}})
	}
	for i, n := range ns {
		require.Eventually(t, func() bool {
			var avail int64
			_ = w.env.Store.Pool().QueryRow(t.Context(), `select coalesce(volume_available_bytes, 0) from nodes where node_id = $1`, n.nodeID).Scan(&avail)
			return avail == int64(1000+i)
		}, 10*time.Second, 20*time.Millisecond, "node %d", i)
	}
	assert.Equal(t, nodes, w.gw.Sessions())
}

// handled sends a Resolve and waits for its answer: a session handles its
// messages in order, so the messages sent before were handled by then.
func handled(t *testing.T, conn *websocket.Conn) {
	t.Helper()
	send(t, conn, agentproto.Message{Type: agentproto.TypeResolve, Resolve: &agentproto.Resolve{ID: "sync", InstanceID: "none"}})
	for {
		m, err := recv(t.Context(), conn)
		require.NoError(t, err)
		if m.Type == agentproto.TypeResolved {
			return
		}
	}
}

// A daemon back on a new session (as after a gateway restart) with the
// status it sent before has it skipped: the row keeps the last status's
// hash. A changed status is written; so is the same status after a hello
// whose observed generation differs from the row's (the hash is cleared),
// and after the node was marked down.
func TestAnUnchangedStatusAfterAReconnectIsNotWrittenAgain(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	pool := w.env.Store.Pool()
	status := func(avail int64) agentproto.Message {
		return agentproto.Message{Type: agentproto.TypeStatus, Status: &agentproto.Status{ObservedGeneration: 0,
			Instances: []agentproto.InstanceStatus{}, VolumeStore: agentproto.VolumeStore{AvailableBytes: avail}}}
	}
	// reportedLongAgo marks the row so that a status written afterwards
	// shows (ReportStatus sets volume_reported_at).
	reportedLongAgo := func() {
		_, err := pool.Exec(t.Context(), `update nodes set volume_reported_at = '2000-01-01' where node_id = $1`, n.nodeID)
		require.NoError(t, err)
	}
	written := func() bool {
		var at time.Time
		require.NoError(t, pool.QueryRow(t.Context(), `select coalesce(volume_reported_at, '2000-01-01') from nodes where node_id = $1`, n.nodeID).Scan(&at))
		return at.Year() > 2000
	}
	reconnect := func(old *websocket.Conn, gen int64) *websocket.Conn {
		if old != nil {
			_ = old.CloseNow()
		}
		conn, err := w.dial(t.Context(), n.cert, n.key)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.CloseNow() })
		send(t, conn, hello(n.nodeID, gen))
		m, err := recv(t.Context(), conn)
		require.NoError(t, err)
		require.Equal(t, agentproto.TypeWelcome, m.Type, "%+v", m.Error)
		return conn
	}

	conn := reconnect(nil, 0)
	reportedLongAgo()
	send(t, conn, status(1))
	handled(t, conn)
	require.True(t, written(), "the session's first status, never written before")

	// The same status on a new session: skipped.
	conn = reconnect(conn, 0)
	reportedLongAgo()
	send(t, conn, status(1))
	handled(t, conn)
	assert.False(t, written(), "the same status as the node's last one is not written again")

	// A changed one is written.
	send(t, conn, status(2))
	handled(t, conn)
	assert.True(t, written(), "a changed status")
	var avail int64
	require.NoError(t, pool.QueryRow(t.Context(), `select volume_available_bytes from nodes where node_id = $1`, n.nodeID).Scan(&avail))
	assert.EqualValues(t, 2, avail)
	// The same one again on this session (a heartbeat, its frame repeated):
	// skipped; then the first again, changed: written.
	reportedLongAgo()
	send(t, conn, status(2))
	handled(t, conn)
	assert.False(t, written(), "a heartbeat repeating the status")
	send(t, conn, status(1))
	handled(t, conn)
	assert.True(t, written(), "changed back")
	send(t, conn, status(2))
	handled(t, conn)

	// A hello naming another observed generation than the row's: the row
	// holds the hello's now, so the same status is written again.
	conn = reconnect(conn, 7)
	reportedLongAgo()
	send(t, conn, status(2))
	handled(t, conn)
	assert.True(t, written(), "after a hello with another observed generation")
	var gen int64
	require.NoError(t, pool.QueryRow(t.Context(), `select observed_generation from nodes where node_id = $1`, n.nodeID).Scan(&gen))
	assert.Zero(t, gen, "the status's generation, not the hello's")

	// A node marked down loses its hash: its first status back is written.
	conn = reconnect(conn, 0)
	send(t, conn, status(2))
	handled(t, conn)
	_ = conn.CloseNow()
	require.Eventually(t, func() bool { _, gw := w.sessionEpoch(t, n.nodeID); return gw == "" }, 10*time.Second, 20*time.Millisecond)
	sw := &gateway.Sweeper{Store: w.env.Store, Notifier: w.env.Host.Notifier(), DownAfter: time.Second, Log: discard()}
	require.Eventually(t, func() bool {
		require.NoError(t, sw.Pass(t.Context(), noFence))
		return w.nodeStateDB(t, n.nodeID) == "down"
	}, 10*time.Second, 100*time.Millisecond)
	conn = reconnect(nil, 0)
	assert.Equal(t, "ready", w.nodeStateDB(t, n.nodeID))
	reportedLongAgo()
	send(t, conn, status(2))
	handled(t, conn)
	assert.True(t, written(), "the first status after the node was down")
}

// A hello whose session row the database does not write in time is
// refused with UNAVAILABLE and a retry delay, and the gateway goes on: the
// next hello is welcomed.
func TestAHelloTheDatabaseStallsIsRefusedUnavailable(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	w.session(t, n).CloseNow()
	require.Eventually(t, func() bool { _, gw := w.sessionEpoch(t, n.nodeID); return gw == "" }, 10*time.Second, 20*time.Millisecond)

	// Hold the node's row locked past the gateway's write timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tx, err := w.env.Store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `select 1 from nodes where node_id = $1 for update`, n.nodeID)
	require.NoError(t, err)

	conn, err := w.dial(t.Context(), n.cert, n.key)
	require.NoError(t, err)
	defer conn.CloseNow()
	send(t, conn, hello(n.nodeID, 0))
	// The gateway answers after its write timeout (10 s).
	rctx, rcancel := context.WithTimeout(t.Context(), 25*time.Second)
	defer rcancel()
	_, b, err := conn.Read(rctx)
	require.NoError(t, err)
	m, err := agentproto.Decode(b)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeError, m.Type)
	assert.Equal(t, "UNAVAILABLE", m.Error.Code, m.Error.Message)
	assert.Positive(t, m.Error.RetryAfterMS)

	require.NoError(t, tx.Rollback(ctx))
	// The batch's statement, if it wrote the row after the hello gave up,
	// does not leave the row naming this gateway for a session it does
	// not hold (the sweeper would never mark the node down).
	require.Eventually(t, func() bool { _, gw := w.sessionEpoch(t, n.nodeID); return gw == "" }, 25*time.Second, 50*time.Millisecond)
	w.session(t, n)
}

// A hello whose row the database refuses (here an inventory PostgreSQL's
// jsonb cannot hold: a NUL in a string) fails alone: the other hellos of
// its batch open their sessions. Not parallel: it reads the process's
// counters.
func TestAHelloTheDatabaseRefusesFailsAlone(t *testing.T) {
	w := setup(t)
	const nodes = 4
	var ns []joined
	for range nodes {
		n := w.newNode(t)
		w.session(t, n).CloseNow() // joining -> ready
		ns = append(ns, n)
	}
	require.Eventually(t, func() bool { return w.gw.Sessions() == 0 }, 10*time.Second, 20*time.Millisecond)

	conns := make([]*websocket.Conn, nodes)
	for i, n := range ns {
		conn, err := w.dial(t.Context(), n.cert, n.key)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.CloseNow() })
		conns[i] = conn
	}
	batches0 := gatewayStat("helloBatches")
	replies := make([]agentproto.Message, nodes)
	errs := make([]error, nodes)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ns {
		wg.Go(func() {
			h := hello(ns[i].nodeID, 0)
			if i == 0 {
				h.Hello.Inventory.Hostname = "bad\x00host"
			}
			<-start
			send(t, conns[i], h)
			replies[i], errs[i] = recv(t.Context(), conns[i])
		})
	}
	close(start)
	wg.Wait()
	assert.Positive(t, gatewayStat("helloBatches")-batches0, "the hellos went through a batch")
	for i := range ns {
		require.NoError(t, errs[i], "node %d", i)
		if i == 0 {
			require.Equal(t, agentproto.TypeError, replies[i].Type, "the refused hello: %+v", replies[i])
			assert.Equal(t, "INVALID_INPUT", replies[i].Error.Code, "a retry would fail the same way: %+v", replies[i].Error)
			continue
		}
		assert.Equal(t, agentproto.TypeWelcome, replies[i].Type, "node %d, in a batch with the refused hello: %+v", i, replies[i].Error)
	}
}

// A session that opens has its node's pending spec and commands sent, read
// for that node alone: the sessions of a storm of reconnects do not each
// run the read of every session of the gateway (PendingSpecs, whose join
// grows with the sessions). Only the loop's tick (every Poll) reads them
// all. Not parallel: it reads the process's counters.
func TestOpeningSessionsReadsTheirOwnPendingWorkNotEverySessions(t *testing.T) {
	w := setup(t)
	const nodes = 8
	var ns []joined
	for range nodes {
		n := w.newNode(t)
		w.session(t, n).CloseNow() // joining -> ready
		ns = append(ns, n)
	}
	require.Eventually(t, func() bool { return w.gw.Sessions() == 0 }, 10*time.Second, 20*time.Millisecond)

	// While the first node is out of session: a spec and a command for it.
	var gen int64
	var cmdID string
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		if gen, _, err = nodework.PutSpec(ctx, tx, ns[0].nodeID, agentproto.SpecBody{}); err != nil {
			return err
		}
		c, _, err := nodework.EnqueueCommand(ctx, tx, ns[0].nodeID, agentproto.CommandEcho, json.RawMessage(`{"say":"hi"}`), "test", time.Minute, time.Now())
		cmdID = c.CommandID
		return err
	}))

	all0, opened0 := gatewayStat("dispatches"), gatewayStat("dispatchesOpened")
	start := time.Now()
	conns := make([]*websocket.Conn, nodes)
	for i, n := range ns {
		conns[i] = w.session(t, n)
		if i > 0 {
			handled(t, conns[i]) // the session is open and its wake-up given
		}
	}
	time.Sleep(100 * time.Millisecond) // the dispatch loop's turn
	elapsed := time.Since(start)
	all, opened := gatewayStat("dispatches")-all0, gatewayStat("dispatchesOpened")-opened0
	t.Logf("%d sessions opened one after another in %v: %d reads of every session, %d of the opened ones", nodes, elapsed, all, opened)
	assert.LessOrEqual(t, all, int64(elapsed/gateway.Poll)+1, "only the loop's ticks read every session")
	assert.Positive(t, opened)

	// The first node's spec and command reached it.
	var gotSpec, gotCmd bool
	for !gotSpec || !gotCmd {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		m, err := recv(ctx, conns[0])
		cancel()
		require.NoError(t, err)
		switch m.Type {
		case agentproto.TypeSpec:
			assert.Equal(t, gen, m.Spec.Generation)
			gotSpec = true
		case agentproto.TypeCommand:
			assert.Equal(t, cmdID, m.Command.ID)
			gotCmd = true
		}
	}
}

// The renewal's touch does not write the row of a session opened since
// the touch before (its open wrote last_seen_at); the next touch does.
// After a restart, every session is such a session.
func TestATouchSkipsTheRowsOfSessionsOpenedSinceTheLastOne(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	conn := w.session(t, n)
	rowVersion := func() string {
		var xmin string
		require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select xmin::text from nodes where node_id = $1`, n.nodeID).Scan(&xmin))
		return xmin
	}
	handled(t, conn)
	v0 := rowVersion()
	w.gw.Touch(t.Context())
	assert.Equal(t, v0, rowVersion(), "opened since the last touch: not written")
	handled(t, conn) // heard from
	w.gw.Touch(t.Context())
	assert.NotEqual(t, v0, rowVersion(), "opened before the last touch and heard from: written")
}
