package notify_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/notify"
	"computeplane/internal/store"
	"computeplane/internal/uow"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var postgres = &config.Notifier{Kind: config.NotifierPostgres}

// open starts a notifier on its own pool to the database at url, as one
// process would, and closes it when the test ends.
func open(t testing.TB, url string, cfg *config.Notifier) *notify.Notifier {
	t.Helper()
	st, err := store.Open(t.Context(), url)
	require.NoError(t, err)
	n := notify.New(cfg, st.Pool(), nil)
	n.Start()
	t.Cleanup(func() {
		n.Close()
		st.Close()
	})
	select {
	case <-n.Listening():
	case <-time.After(10 * time.Second):
		t.Fatal("the notifier did not LISTEN")
	}
	return n
}

// listener LISTENs on the notifier's channel and collects the payloads.
type listener struct {
	mu  sync.Mutex
	got []string
}

func listen(t *testing.T, url string) *listener {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), "LISTEN "+notify.Channel)
	require.NoError(t, err)
	l := &listener{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nt, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			l.mu.Lock()
			l.got = append(l.got, nt.Payload)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return l
}

func (l *listener) count(topic string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range l.got {
		if p == topic {
			n++
		}
	}
	return n
}

func received(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

func TestInProcessWakeIsImmediateAndCoalesced(t *testing.T) {
	t.Parallel()
	n := notify.New(nil, nil, nil)
	n.Start() // nothing to start in-process
	defer n.Close()
	assert.False(t, n.CrossProcess())
	ch, cancel := n.Subscribe("t")
	other, cancelOther := n.Subscribe("other")
	defer cancelOther()

	var lat []time.Duration
	for range 1000 {
		start := time.Now()
		n.Wake("t")
		<-ch
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("in-process wake latency: p50 %v, p99 %v", lat[500], lat[990])
	// Microseconds when idle; the bound leaves room for a machine busy
	// with other test packages, and is still far below any poll.
	assert.Less(t, lat[990], 5*time.Millisecond)

	for range 10 {
		n.Wake("t")
	}
	assert.True(t, received(ch, 0), "a pending wake")
	assert.False(t, received(ch, 10*time.Millisecond), "ten wakes coalesce into one")
	assert.False(t, received(other, 0), "other topics are not woken")

	cancel()
	cancel()
	n.Wake("t")
	assert.False(t, received(ch, 10*time.Millisecond), "no wake after cancel")
}

func TestNoneKindStaysInProcess(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	l := listen(t, url)
	n := open(t, url, &config.Notifier{Kind: config.NotifierNone})
	assert.False(t, n.CrossProcess())
	ch, cancel := n.Subscribe("t")
	defer cancel()
	n.Wake("t")
	assert.True(t, received(ch, time.Second))
	time.Sleep(100 * time.Millisecond)
	assert.Zero(t, l.count("t"), "no NOTIFY")
}

func TestWakeReachesOtherProcesses(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	a := open(t, url, postgres)
	b := open(t, url, postgres)
	require.True(t, a.CrossProcess())
	chA, cancelA := a.Subscribe(notify.TopicOutbox)
	defer cancelA()
	chB, cancelB := b.Subscribe(notify.TopicOutbox)
	defer cancelB()

	var lat []time.Duration
	for range 20 {
		start := time.Now()
		a.Wake(notify.TopicOutbox)
		require.True(t, received(chB, 2*time.Second), "the other process is woken")
		lat = append(lat, time.Since(start))
		require.True(t, received(chA, 0), "and this one at once")
		assert.False(t, received(chA, 30*time.Millisecond), "not a second time by its own NOTIFY")
	}
	slices.Sort(lat)
	t.Logf("cross-process wake latency: p50 %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
	assert.Less(t, lat[len(lat)/2], 50*time.Millisecond)
}

func TestBurstOfWakesCoalesces(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	l := listen(t, url)
	n := open(t, url, postgres)
	start := time.Now()
	for range 1000 {
		n.Wake("burst")
	}
	n.Wake("other")
	elapsed := time.Since(start)
	require.Eventually(t, func() bool { return l.count("burst") >= 1 && l.count("other") >= 1 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	t.Logf("1000 wakes in %v: %d NOTIFYs", elapsed, l.count("burst"))
	assert.LessOrEqual(t, l.count("burst"), 2+int(elapsed/notify.SendInterval), "one NOTIFY per topic per interval")

	// Spread over 200 ms, still at most one per interval.
	before := l.count("spread")
	start = time.Now()
	for range 1000 {
		n.Wake("spread")
		time.Sleep(200 * time.Microsecond)
	}
	elapsed = time.Since(start)
	time.Sleep(100 * time.Millisecond)
	sent := l.count("spread") - before
	t.Logf("1000 wakes over %v: %d NOTIFYs", elapsed, sent)
	assert.GreaterOrEqual(t, sent, 1)
	assert.LessOrEqual(t, sent, 2+int(elapsed/notify.SendInterval))
}

// Wake called inside an open transaction (which the envelope never does)
// still does not put a NOTIFY into it: the NOTIFY is delivered while the
// transaction is open, and survives its rollback.
func TestNotifyIsNeverInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	l := listen(t, url)
	n := open(t, url, postgres)
	st := dbtest.NewStore(t)
	boom := errors.New("roll back")
	err := st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('k', 'v')"); err != nil {
			return err
		}
		n.Wake("in-tx")
		require.Eventually(t, func() bool { return l.count("in-tx") == 1 }, 5*time.Second, 5*time.Millisecond,
			"delivered while the transaction is open: not part of it")
		return boom
	})
	require.ErrorIs(t, err, boom)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 1, l.count("in-tx"))
}

// The listener reconnects after losing its connection; subscribers are
// woken once on reconnection, since notifications may have been missed.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	a := open(t, url, postgres)
	b := open(t, url, postgres)
	ch, cancel := b.Subscribe("t")
	defer cancel()

	admin, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer func() { _ = admin.Close(context.Background()) }()
	var killed int
	require.NoError(t, admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'computed-notify-listen'`).Scan(&killed))
	require.Equal(t, 2, killed, "both listeners")
	assert.True(t, received(ch, 5*time.Second), "woken on reconnection")

	require.Eventually(t, func() bool {
		a.Wake("t")
		return received(ch, 50*time.Millisecond)
	}, 10*time.Second, time.Millisecond, "wakes arrive again")
}

// A value offered in a unit of work reaches the topic's taker only once
// the unit committed (WakeUnit), before the wake; a cancelled taker gets
// nothing, and a rolled-back attempt's offers are forgotten.
func TestOfferReachesTheTakerAfterTheCommit(t *testing.T) {
	n := open(t, dbtest.URL(t), &config.Notifier{Kind: config.NotifierNone})
	var got []any
	cancel := n.Take("gateway/g1", func(v any) { got = append(got, v) })
	wake, stop := n.Subscribe("gateway/g1")
	defer stop()
	st := dbtest.NewStore(t)
	u, err := uow.Run(t.Context(), st, false, func(ctx context.Context, u *uow.Unit) error {
		notify.OfferLater(ctx, u.Tx, "gateway/g1", "spec 1")
		notify.OfferLater(ctx, u.Tx, "gateway/other", "not ours")
		notify.Later(ctx, "gateway/g1")
		assert.Empty(t, got, "nothing before the commit")
		return nil
	})
	require.NoError(t, err)
	n.WakeUnit(u)
	assert.Equal(t, []any{"spec 1"}, got)
	select {
	case <-wake:
	case <-time.After(time.Second):
		t.Fatal("the topic was not woken")
	}
	cancel()
	u, err = uow.Run(t.Context(), st, false, func(ctx context.Context, u *uow.Unit) error {
		notify.OfferLater(ctx, u.Tx, "gateway/g1", "spec 2")
		return nil
	})
	require.NoError(t, err)
	n.WakeUnit(u)
	assert.Equal(t, []any{"spec 1"}, got, "no taker any more")
}

// Every taker of a topic gets its offers (a gateway and the calls waiting
// on a row may take one topic each, two waits the same one), and a
// cancel ends only its own taker.
func TestEveryTakerGetsTheOffer(t *testing.T) {
	n := open(t, dbtest.URL(t), &config.Notifier{Kind: config.NotifierNone})
	var first, second []any
	cancelFirst := n.Take("instance/i1", func(v any) { first = append(first, v) })
	cancelSecond := n.Take("instance/i1", func(v any) { second = append(second, v) })
	defer cancelSecond()
	st := dbtest.NewStore(t)
	offer := func(v string) {
		u, err := uow.Run(t.Context(), st, false, func(ctx context.Context, u *uow.Unit) error {
			notify.OfferLater(ctx, u.Tx, "instance/i1", v)
			return nil
		})
		require.NoError(t, err)
		n.WakeUnit(u)
	}
	offer("running")
	assert.Equal(t, []any{"running"}, first)
	assert.Equal(t, []any{"running"}, second)
	cancelFirst()
	cancelFirst() // twice is once
	offer("paused")
	assert.Equal(t, []any{"running"}, first, "cancelled")
	assert.Equal(t, []any{"running", "paused"}, second, "the other taker's cancel left it")
}

// A value offered from a savepoint is not handed on: the savepoint's
// rollback would undo the write and not the offer. The wake still comes.
func TestNothingIsOfferedFromASavepoint(t *testing.T) {
	n := open(t, dbtest.URL(t), &config.Notifier{Kind: config.NotifierNone})
	var got []any
	defer n.Take("instance/i1", func(v any) { got = append(got, v) })()
	wake, stop := n.Subscribe("instance/i1")
	defer stop()
	u, err := uow.Run(t.Context(), dbtest.NewStore(t), false, func(ctx context.Context, u *uow.Unit) error {
		sp, err := u.Tx.Begin(ctx)
		if err != nil {
			return err
		}
		notify.OfferLater(ctx, sp, "instance/i1", "from the savepoint")
		notify.Later(ctx, "instance/i1")
		return sp.Rollback(ctx)
	})
	require.NoError(t, err)
	n.WakeUnit(u)
	assert.Empty(t, got)
	select {
	case <-wake:
	case <-time.After(time.Second):
		t.Fatal("the topic was not woken")
	}
}

// An offer made instead of a wake (OfferInstead) wakes no one when a
// taker here took it, and the topic (returned by WakeUnit, so that the
// caller may wake it elsewhere) when none did; one made from a savepoint
// is not offered and the topic is woken.
func TestAnOfferInsteadOfAWake(t *testing.T) {
	n := open(t, dbtest.URL(t), &config.Notifier{Kind: config.NotifierNone})
	st := dbtest.NewStore(t)
	wake, stop := n.Subscribe("gateway/g1")
	defer stop()
	woken := func() bool {
		select {
		case <-wake:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}
	offer := func(v string, savepoint bool) []string {
		u, err := uow.Run(t.Context(), st, false, func(ctx context.Context, u *uow.Unit) error {
			if !savepoint {
				notify.OfferInstead(ctx, u.Tx, "gateway/g1", v)
				return nil
			}
			sp, err := u.Tx.Begin(ctx)
			if err != nil {
				return err
			}
			notify.OfferInstead(ctx, sp, "gateway/g1", v)
			return sp.Commit(ctx)
		})
		require.NoError(t, err)
		return n.WakeUnit(u)
	}

	var got []any
	cancel := n.Take("gateway/g1", func(v any) { got = append(got, v) })
	assert.Empty(t, offer("spec 1", false), "taken: no topic to wake")
	assert.Equal(t, []any{"spec 1"}, got)
	assert.False(t, woken(), "taken: not woken")

	assert.Equal(t, []string{"gateway/g1"}, offer("spec 2", true))
	assert.Equal(t, []any{"spec 1"}, got, "nothing offered from a savepoint")
	assert.True(t, woken(), "from a savepoint: woken")

	cancel()
	assert.Equal(t, []string{"gateway/g1"}, offer("spec 3", false))
	assert.True(t, woken(), "no taker: woken")
}
