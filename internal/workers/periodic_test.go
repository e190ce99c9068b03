package workers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/dbtest"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/workers"
)

func waitPass(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no pass")
		return nil
	}
}

// A periodic job passes at once, on a wake-up of its topic (its interval
// is an hour), under its pass timeout, and writes fenced by its lease.
func TestPeriodicPassesAtOnceAndOnWake(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	n := notify.New(nil, nil, nil)
	var leases []string
	p := &workers.Periodic{Name: "periodic", Interval: time.Hour, Wake: "periodic-topic", PassTimeout: 3 * time.Second, Notifier: n,
		Pass: func(ctx context.Context, fence workers.Fence) error {
			dl, ok := ctx.Deadline()
			if !ok || time.Until(dl) > 3*time.Second {
				return errors.New("no pass timeout")
			}
			counting := func(ctx context.Context, tx pgx.Tx) error {
				leases = append(leases, "fenced")
				return fence(ctx, tx)
			}
			return workers.Tx(ctx, st, n, counting, func(ctx context.Context, tx pgx.Tx) error { return nil })
		}}
	passes := p.TestSignals()
	newRunner(t, st, "p-a", func(r *workers.Runner) { r.RegisterPeriodic(p) })
	require.NoError(t, waitPass(t, passes), "the first pass, at once")
	select {
	case err := <-passes:
		t.Fatalf("a pass without a wake-up: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	n.Wake("periodic-topic")
	require.NoError(t, waitPass(t, passes), "a pass on the wake-up")
	assert.Len(t, leases, 2, "each write fenced")
}

func TestPeriodicFailures(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	fail := func(context.Context, workers.Fence) error { return boom }

	// Backoff: the first failure ends the run, for the runner's backoff.
	p := &workers.Periodic{Name: "b", Interval: time.Millisecond, Backoff: true, Pass: fail}
	require.ErrorIs(t, p.Run(t.Context(), workers.Lease{}), boom)

	// Otherwise the failure is logged and the passes go on at Interval.
	p = &workers.Periodic{Name: "l", Interval: 5 * time.Millisecond, Pass: fail}
	passes := p.TestSignals()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, workers.Lease{}) }()
	for range 3 {
		require.ErrorIs(t, waitPass(t, passes), boom)
	}
	cancel()
	require.NoError(t, <-done)

	for _, bad := range []*workers.Periodic{{Interval: time.Second, Pass: fail}, {Name: "x", Pass: fail},
		{Name: "x", Interval: time.Second}, {Name: "x", Interval: time.Second, PassTimeout: -1, Pass: fail}} {
		assert.Error(t, bad.Validate())
		assert.Panics(t, func() { workers.New(dbtest.NewStore(t), workers.Options{}).RegisterPeriodic(bad) })
	}
}

// Tx is one unit of work: events written in it are held until just
// before commit, and the topics it asks for are woken after the commit
// only; a refused fence leaves nothing and wakes nothing.
func TestTxIsOneUnitOfWork(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	n := notify.New(nil, nil, nil)
	outboxWake, stop := n.Subscribe(notify.TopicOutbox)
	defer stop()
	topicWake, stop2 := n.Subscribe("thing")
	defer stop2()
	count := func() (c int) {
		require.NoError(t, st.Pool().QueryRow(t.Context(), "SELECT count(*) FROM outbox WHERE subject = 'node_tx'").Scan(&c))
		return c
	}
	write := func(ctx context.Context, tx pgx.Tx) error {
		notify.Later(ctx, "thing")
		for range 2 {
			if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventNodeDown, Subject: "node_tx", TenantID: "ten_x",
				Data: api.NodeDownPayload{NodeID: "node_tx"}}); err != nil {
				return err
			}
		}
		var held int
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE subject = 'node_tx'").Scan(&held))
		assert.Zero(t, held, "held until just before commit")
		assert.Empty(t, topicWake, "not woken before the commit")
		return nil
	}
	refuse := func(context.Context, pgx.Tx) error { return workers.ErrLeaseLost }
	require.ErrorIs(t, workers.Tx(t.Context(), st, n, refuse, write), workers.ErrLeaseLost)
	assert.Zero(t, count())
	assert.Empty(t, topicWake)
	assert.Empty(t, outboxWake)

	require.NoError(t, workers.Tx(t.Context(), st, n, nil, write))
	assert.Equal(t, 2, count())
	assert.Len(t, topicWake, 1)
	assert.Len(t, outboxWake, 1, "events written: the outbox's readers are woken")

	require.NoError(t, workers.Tx(t.Context(), st, n, nil, func(ctx context.Context, tx pgx.Tx) error { return nil }))
	assert.Len(t, outboxWake, 1, "no event, no outbox wake-up (the last one is still unread)")
}

// A job's Start runs once before its first pass; a channel of Also wakes a
// pass; Next shortens the wait after a pass (its interval is an hour).
func TestPeriodicStartAlsoAndNext(t *testing.T) {
	t.Parallel()
	var order []string
	also := make(chan struct{}, 1)
	soon := true
	p := &workers.Periodic{Name: "hooks", Interval: time.Hour, Also: []<-chan struct{}{also},
		Start: func(context.Context, workers.Fence) error { order = append(order, "start"); return nil },
		Pass:  func(context.Context, workers.Fence) error { order = append(order, "pass"); return nil },
		Next: func() time.Duration {
			if soon {
				soon = false
				return 10 * time.Millisecond
			}
			return time.Hour
		}}
	passes := p.TestSignals()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = p.RunFenced(ctx, nil); close(done) }()
	require.NoError(t, waitPass(t, passes), "the first pass")
	require.NoError(t, waitPass(t, passes), "a pass after Next's 10 ms, not the hour")
	select {
	case <-passes:
		t.Fatal("a pass without a wake-up")
	case <-time.After(100 * time.Millisecond):
	}
	also <- struct{}{}
	require.NoError(t, waitPass(t, passes), "a pass on the Also channel")
	cancel()
	<-done
	assert.Equal(t, []string{"start", "pass", "pass", "pass"}, order)
	assert.Error(t, (&workers.Periodic{Name: "x", Interval: time.Second, Pass: p.Pass,
		Also: make([]<-chan struct{}, 3)}).Validate(), "at most two Also channels")
}
