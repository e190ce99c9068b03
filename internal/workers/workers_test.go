package workers_test

// Tests of workers against a real PostgreSQL (interface specification,
// Process roles; Limits: Shards, Leases, Worker liveness, Retry timing),
// with several Runners in one process and the timing scaled down.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"computeplane/gen/db"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fast is the test timing: the specification's 15 s / 5 s / 30 s scaled
// down by 10.
var fast = workers.Timing{
	LeaseTTL:  1500 * time.Millisecond,
	Renew:     500 * time.Millisecond,
	Liveness:  3 * time.Second,
	SyncAgain: 100 * time.Millisecond,
	RetryMin:  50 * time.Millisecond,
	RetryMax:  400 * time.Millisecond,
}

func TestDefaultTimingIsTheSpecifications(t *testing.T) {
	t.Parallel()
	d := workers.DefaultTiming()
	assert.Equal(t, 15*time.Second, d.LeaseTTL)
	assert.Equal(t, 5*time.Second, d.Renew)
	assert.Equal(t, 30*time.Second, d.Liveness)
	assert.Equal(t, time.Second, d.SyncAgain)
	assert.Equal(t, time.Second, d.RetryMin)
	assert.Equal(t, 5*time.Minute, d.RetryMax)
	assert.Equal(t, 256, workers.NumShards)
}

func TestBackoffDoublesFromOneSecondToFiveMinutes(t *testing.T) {
	t.Parallel()
	d := workers.DefaultTiming()
	var got []time.Duration
	for n := 1; n <= 11; n++ {
		got = append(got, workers.Backoff(n, d.RetryMin, d.RetryMax))
	}
	s := time.Second
	assert.Equal(t, []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 64 * s, 128 * s, 256 * s, 300 * s, 300 * s}, got)
}

// ShardOf is part of the stored data's meaning: it must never change.
func TestShardOfIsStable(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 0xe3, workers.ShardOf(""))    // SHA-256("") = e3b0...
	assert.Equal(t, 0xba, workers.ShardOf("abc")) // SHA-256("abc") = ba78...
	counts := make([]int, workers.NumShards)
	for i := range 25600 {
		counts[workers.ShardOf(fmt.Sprintf("key-%d", i))]++
	}
	assert.Greater(t, slices.Min(counts), 50, "keys spread over every shard")
	assert.Less(t, slices.Max(counts), 160)
}

// testLog logs warnings to the test's output.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newRunner(t *testing.T, st *store.Store, id string, setup func(*workers.Runner)) *workers.Runner {
	t.Helper()
	r := workers.New(st, workers.Options{
		Workers: config.Workers{ID: id, Concurrency: 4, ResyncMs: 60_000, PollMs: 20},
		Timing:  fast,
		Log:     testLog(t),
	})
	if setup != nil {
		setup(r)
	}
	require.NoError(t, r.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, r.Stop(ctx))
	})
	return r
}

// noKeys is a reconciler with nothing to do: it makes a runner take shards.
type noKeys struct{}

func (noKeys) Keys(context.Context, int) ([]string, error) { return nil, nil }
func (noKeys) Sync(context.Context, workers.Lease, string) (workers.Result, error) {
	return workers.Done, nil
}

func withShards(r *workers.Runner) { r.RegisterReconciler("none", noKeys{}) }

func shardsOf(r *workers.Runner) map[string]int64 {
	out := map[string]int64{}
	for _, l := range r.Held() {
		if len(l.Name) > 6 && l.Name[:6] == "shard/" {
			out[l.Name] = l.Epoch
		}
	}
	return out
}

// expected is the rendezvous split of the shards over ids.
func expected(ids ...string) map[string][]string {
	out := map[string][]string{}
	for s := range workers.NumShards {
		name := workers.ShardLease(s)
		o := workers.Owner(name, ids)
		out[o] = append(out[o], name)
	}
	return out
}

// split waits until the runners hold exactly the rendezvous split.
func split(t *testing.T, rs ...*workers.Runner) {
	t.Helper()
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID()
	}
	want := expected(ids...)
	require.Eventually(t, func() bool {
		for _, r := range rs {
			got := shardsOf(r)
			if len(got) != len(want[r.ID()]) {
				return false
			}
			for _, name := range want[r.ID()] {
				if _, ok := got[name]; !ok {
					return false
				}
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "the shards are split by rendezvous over %v", ids)
}

func TestShardsSplitEvenlyAndRebalance(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	for _, ids := range [][]string{{"w-a", "w-b"}, {"w-a", "w-b", "w-c"}} {
		for id, shards := range expected(ids...) {
			assert.InDelta(t, float64(workers.NumShards)/float64(len(ids)), len(shards), 0.25*float64(workers.NumShards)/float64(len(ids)),
				"%s gets about its share among %v", id, ids)
		}
	}

	a := newRunner(t, st, "w-a", withShards)
	b := newRunner(t, st, "w-b", withShards)
	split(t, a, b)

	// A third worker joins: each keeps what it still wins, the newcomer
	// gets its share.
	c := newRunner(t, st, "w-c", withShards)
	split(t, a, b, c)
	before := shardsOf(b)

	// One leaves: its shards go to the others at once (Stop releases them),
	// each under a higher epoch.
	require.NoError(t, b.Stop(t.Context()))
	split(t, a, c)
	after := map[string]int64{}
	for k, v := range shardsOf(a) {
		after[k] = v
	}
	for k, v := range shardsOf(c) {
		after[k] = v
	}
	for name, epoch := range before {
		assert.Greater(t, after[name], epoch, "%s was taken over with a new epoch", name)
	}
	var rows int
	require.NoError(t, st.Pool().QueryRow(t.Context(), "SELECT count(*) FROM workers WHERE id = 'w-b'").Scan(&rows))
	assert.Zero(t, rows, "a stopped worker leaves the workers table")
}

// A killed worker's leases are taken over once they expire (a lease
// lifetime), with a higher epoch, and the old grant can no longer write.
func TestKilledWorkerLeasesAreTakenOverAndFenced(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	_, err := st.Pool().Exec(t.Context(), "CREATE TABLE fenced_writes (lease text, epoch bigint)")
	require.NoError(t, err)
	var jobRuns atomic.Int32
	job := func(r *workers.Runner) {
		withShards(r)
		r.RegisterSingleton("sweeper", func(ctx context.Context, l workers.Lease) error {
			jobRuns.Add(1)
			<-ctx.Done()
			return nil
		})
	}
	a := newRunner(t, st, "k-a", job)
	b := newRunner(t, st, "k-b", job)
	split(t, a, b)

	old := a.Held()
	require.NotEmpty(t, old)
	// The old grant can write while it holds.
	write := func(l workers.Lease) error {
		return st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
			if err := l.Fence(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO fenced_writes VALUES ($1, $2)", l.Name, l.Epoch)
			return err
		})
	}
	require.NoError(t, write(old[0]))

	killed := time.Now()
	a.Kill()
	require.Eventually(t, func() bool { return len(shardsOf(b)) == workers.NumShards }, 10*time.Second, 10*time.Millisecond)
	took := time.Since(killed)
	assert.GreaterOrEqual(t, took, fast.LeaseTTL-fast.Renew, "not before the killed worker's leases expired")
	assert.Less(t, took, fast.LeaseTTL+2*fast.Renew, "within the lease lifetime and a tick or two")

	now := map[string]workers.Lease{}
	for _, l := range b.Held() {
		now[l.Name] = l
	}
	for _, l := range old {
		n, ok := now[l.Name]
		if !ok {
			continue // a job of a's might have gone to b already
		}
		assert.Greater(t, n.Epoch, l.Epoch, "%s has a new epoch", l.Name)
		assert.Equal(t, "k-b", n.Holder)
		assert.ErrorIs(t, write(l), workers.ErrLeaseLost, "the old grant of %s cannot write", l.Name)
	}
	require.NoError(t, write(now[old[0].Name]), "the new grant can")
	var n int
	require.NoError(t, st.Pool().QueryRow(t.Context(), "SELECT count(*) FROM fenced_writes").Scan(&n))
	assert.Equal(t, 2, n, "the refused write left nothing")
	assert.Contains(t, leaseNames(b.Held()), "job/sweeper")
}

func leaseNames(ls []workers.Lease) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name)
	}
	return out
}

// Lease semantics in SQL, with the database time given as an input.
func TestLeaseStatements(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	q := st.Queries()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := t0.Add(d); return &x }
	acquire := func(holder string, when time.Duration) (int64, bool) {
		row, err := q.AcquireLease(ctx, db.AcquireLeaseParams{Name: "job/x", Holder: holder, TtlMs: 15_000, Now: at(when)})
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false
		}
		require.NoError(t, err)
		return row.Epoch, true
	}
	renew := func(holder string, epoch int64, when time.Duration) bool {
		rows, err := q.RenewLeases(ctx, db.RenewLeasesParams{Names: []string{"job/x"}, Epochs: []int64{epoch}, Holder: holder, TtlMs: 15_000, Now: at(when)})
		require.NoError(t, err)
		return len(rows) == 1
	}
	fence := func(holder string, epoch int64, when time.Duration) error {
		return st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
			_, err := db.New(tx).FenceLease(ctx, db.FenceLeaseParams{Name: "job/x", Holder: holder, Epoch: epoch, Now: at(when)})
			return err
		})
	}

	e, ok := acquire("a", 0)
	require.True(t, ok)
	assert.Equal(t, int64(1), e)
	_, ok = acquire("b", 10*time.Second)
	assert.False(t, ok, "held and unexpired")
	assert.True(t, renew("a", 1, 10*time.Second), "renewed to 25 s")
	_, ok = acquire("b", 20*time.Second)
	assert.False(t, ok, "the renewal extended it")
	assert.False(t, renew("a", 2, 20*time.Second), "wrong epoch")
	assert.False(t, renew("b", 1, 20*time.Second), "wrong holder")

	e, ok = acquire("b", 25*time.Second)
	require.True(t, ok, "expired at 25 s")
	assert.Equal(t, int64(2), e)
	assert.False(t, renew("a", 1, 26*time.Second), "the old holder cannot renew")
	assert.ErrorIs(t, fence("a", 1, 26*time.Second), pgx.ErrNoRows)
	assert.NoError(t, fence("b", 2, 26*time.Second))
	assert.ErrorIs(t, fence("b", 2, 41*time.Second), pgx.ErrNoRows, "expired")

	// The old holder's release does nothing; the holder's frees it at once.
	require.NoError(t, q.ReleaseLeases(ctx, db.ReleaseLeasesParams{Names: []string{"job/x"}, Epochs: []int64{1}, Holder: "a", Now: at(27 * time.Second)}))
	_, ok = acquire("c", 27*time.Second)
	assert.False(t, ok)
	require.NoError(t, q.ReleaseLeases(ctx, db.ReleaseLeasesParams{Names: []string{"job/x"}, Epochs: []int64{2}, Holder: "b", Now: at(28 * time.Second)}))
	e, ok = acquire("c", 28*time.Second)
	require.True(t, ok)
	assert.Equal(t, int64(3), e)
}

// A transaction that fenced its lease holds off a takeover until it ends:
// the write and the takeover are ordered.
func TestFenceHoldsOffTakeover(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	q := st.Queries()
	_, err := q.AcquireLease(ctx, db.AcquireLeaseParams{Name: "shard/7", Holder: "a", TtlMs: 60_000})
	require.NoError(t, err)
	l := workers.Lease{Name: "shard/7", Holder: "a", Epoch: 1}
	later := time.Now().Add(time.Hour)

	fenced := make(chan struct{})
	commit := make(chan struct{})
	txDone := make(chan error, 1)
	go func() {
		txDone <- st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
			if err := l.Fence(ctx, tx); err != nil {
				return err
			}
			close(fenced)
			<-commit
			return nil
		})
	}()
	<-fenced
	took := make(chan int64, 1)
	go func() {
		row, err := q.AcquireLease(ctx, db.AcquireLeaseParams{Name: "shard/7", Holder: "b", TtlMs: 60_000, Now: &later})
		assert.NoError(t, err)
		took <- row.Epoch
	}()
	select {
	case <-took:
		t.Fatal("took over while the fenced transaction was open")
	case <-time.After(300 * time.Millisecond):
	}
	close(commit)
	require.NoError(t, <-txDone)
	select {
	case e := <-took:
		assert.Equal(t, int64(2), e)
	case <-time.After(5 * time.Second):
		t.Fatal("the takeover did not proceed after the commit")
	}
}

func TestSingletonRunsOnExactlyOneWorker(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	var active, maxActive, runs atomic.Int32
	var mu sync.Mutex
	ranOn := map[string]bool{}
	job := func(r *workers.Runner) {
		r.RegisterSingleton("dispatch", func(ctx context.Context, l workers.Lease) error {
			n := active.Add(1)
			defer active.Add(-1)
			for {
				m := maxActive.Load()
				if n <= m || maxActive.CompareAndSwap(m, n) {
					break
				}
			}
			runs.Add(1)
			mu.Lock()
			ranOn[l.Holder] = true
			mu.Unlock()
			assert.Equal(t, "job/dispatch", l.Name)
			<-ctx.Done()
			assert.Error(t, context.Cause(ctx))
			return nil
		})
	}
	rs := []*workers.Runner{newRunner(t, st, "s-a", job), newRunner(t, st, "s-b", job), newRunner(t, st, "s-c", job)}
	holder := func() *workers.Runner {
		var h []*workers.Runner
		for _, r := range rs {
			if slices.Contains(leaseNames(r.Held()), "job/dispatch") {
				h = append(h, r)
			}
		}
		if len(h) != 1 {
			return nil
		}
		return h[0]
	}
	// The runners start one after the other: the job settles on the
	// rendezvous owner of the three and stays there.
	owner := workers.Owner("job/dispatch", []string{"s-a", "s-b", "s-c"})
	require.Eventually(t, func() bool {
		h := holder()
		return h != nil && h.ID() == owner && active.Load() == 1
	}, 10*time.Second, 10*time.Millisecond)
	first := holder()
	settled := runs.Load()
	assert.Never(t, func() bool { return active.Load() != 1 || runs.Load() != settled }, 4*fast.Renew, 10*time.Millisecond)

	// Its worker stops: another one takes it over, never overlapping.
	require.NoError(t, first.Stop(t.Context()))
	require.Eventually(t, func() bool { return runs.Load() == settled+1 && active.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	second := holder()
	require.NotNil(t, second)
	assert.NotEqual(t, first.ID(), second.ID())
	// Killed, then taken over after expiry.
	second.Kill()
	require.Eventually(t, func() bool { return runs.Load() == settled+2 && active.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, int32(1), maxActive.Load(), "never on two workers at a time")
	mu.Lock()
	assert.Len(t, ranOn, 3)
	mu.Unlock()
}

func TestJobBackoffAndPoll(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	var mu sync.Mutex
	var failing, fine []time.Time
	newRunner(t, st, "b-a", func(r *workers.Runner) {
		r.RegisterSingleton("failing", func(ctx context.Context, l workers.Lease) error {
			mu.Lock()
			defer mu.Unlock()
			failing = append(failing, time.Now())
			return errors.New("boom")
		})
		r.RegisterSingleton("fine", func(ctx context.Context, l workers.Lease) error {
			mu.Lock()
			defer mu.Unlock()
			fine = append(fine, time.Now())
			return nil
		})
	})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(failing) >= 7 }, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	want := []time.Duration{50, 100, 200, 400, 400, 400}
	for i, w := range want {
		gap := failing[i+1].Sub(failing[i])
		w *= time.Millisecond
		assert.GreaterOrEqual(t, gap, w, "retry %d", i+1)
		assert.Less(t, gap, w+slack, "retry %d", i+1)
	}
	// A job that returns nil runs again after the poll interval (20 ms).
	require.Greater(t, len(fine), 10)
	for i := 1; i < len(fine); i++ {
		assert.GreaterOrEqual(t, fine[i].Sub(fine[i-1]), 20*time.Millisecond)
	}
}

// recorder is a reconciler over fixed keys, recording each Sync.
type recorder struct {
	keys   []string
	result func(key string, n int) (workers.Result, error)
	delay  time.Duration

	mu       sync.Mutex
	syncs    map[string][]time.Time
	lists    map[int][]time.Time
	active   int
	maxAct   int
	badLease int
}

func (r *recorder) Keys(ctx context.Context, shard int) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists[shard] = append(r.lists[shard], time.Now())
	var out []string
	for _, k := range r.keys {
		if workers.ShardOf(k) == shard {
			out = append(out, k)
		}
	}
	return out, nil
}

func (r *recorder) Sync(ctx context.Context, l workers.Lease, key string) (workers.Result, error) {
	r.mu.Lock()
	if l.Name != workers.ShardLease(workers.ShardOf(key)) {
		r.badLease++
	}
	r.syncs[key] = append(r.syncs[key], time.Now())
	n := len(r.syncs[key])
	r.active++
	r.maxAct = max(r.maxAct, r.active)
	r.mu.Unlock()
	if r.delay > 0 {
		time.Sleep(r.delay)
	}
	r.mu.Lock()
	r.active--
	r.mu.Unlock()
	if r.result == nil {
		return workers.Done, nil
	}
	return r.result(key, n)
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.syncs[key])
}

func TestReconcilerRetryTiming(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	rec := &recorder{
		keys:  []string{"again", "fail", "ok"},
		syncs: map[string][]time.Time{}, lists: map[int][]time.Time{},
		result: func(key string, n int) (workers.Result, error) {
			switch {
			case key == "again" && n < 4:
				return workers.SyncAgain, nil
			case key == "fail":
				return workers.Done, errors.New("boom")
			}
			return workers.Done, nil
		},
	}
	r := newRunner(t, st, "r-a", func(r *workers.Runner) { r.RegisterReconciler("rec", rec) })
	require.Eventually(t, func() bool { return rec.count("again") >= 4 && rec.count("fail") >= 6 }, 10*time.Second, 10*time.Millisecond)
	// Nothing more for the settled keys (the resync is a minute away).
	time.Sleep(300 * time.Millisecond)
	rec.mu.Lock()
	assert.Len(t, rec.syncs["ok"], 1)
	assert.Len(t, rec.syncs["again"], 4, "SyncAgain three times, then done")
	for i := 1; i < 4; i++ {
		gap := rec.syncs["again"][i].Sub(rec.syncs["again"][i-1])
		assert.GreaterOrEqual(t, gap, fast.SyncAgain)
		assert.Less(t, gap, fast.SyncAgain+slack)
	}
	for i, w := range []time.Duration{50, 100, 200, 400, 400} {
		gap := rec.syncs["fail"][i+1].Sub(rec.syncs["fail"][i])
		w *= time.Millisecond
		assert.GreaterOrEqual(t, gap, w, "retry %d", i+1)
		assert.Less(t, gap, w+slack, "retry %d", i+1)
	}
	assert.Zero(t, rec.badLease, "each key syncs under its shard's lease")
	rec.mu.Unlock()

	// Enqueue syncs a settled key again at once.
	r.Enqueue("rec", "ok")
	require.Eventually(t, func() bool { return rec.count("ok") == 2 }, 2*time.Second, 5*time.Millisecond)
	r.Enqueue("other", "ok") // no such reconciler: nothing
	r.Resync()
	require.Eventually(t, func() bool { return rec.count("ok") == 3 }, 2*time.Second, 5*time.Millisecond)
}

func TestReconcilerConcurrencyAndResyncJitter(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	rec := &recorder{syncs: map[string][]time.Time{}, lists: map[int][]time.Time{}, delay: 20 * time.Millisecond}
	for i := range 40 {
		rec.keys = append(rec.keys, fmt.Sprintf("key-%d", i))
	}
	r := workers.New(st, workers.Options{
		Workers: config.Workers{ID: "c-a", Concurrency: 3, ResyncMs: 300},
		Timing:  fast,
	})
	r.RegisterReconciler("rec", rec)
	require.NoError(t, r.Start(t.Context()))
	defer func() { require.NoError(t, r.Stop(context.Background())) }()

	// Every key synced at least three times: the first listing and resyncs.
	require.Eventually(t, func() bool {
		for _, k := range rec.keys {
			if rec.count(k) < 3 {
				return false
			}
		}
		return true
	}, 15*time.Second, 10*time.Millisecond)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Equal(t, 3, rec.maxAct, "at most Concurrency syncs at a time, and that many")
	// Each shard lists its keys every 300 ms plus a jitter of up to 300 ms.
	var gaps []time.Duration
	for _, times := range rec.lists {
		for i := 1; i < len(times); i++ {
			gaps = append(gaps, times[i].Sub(times[i-1]))
		}
	}
	require.NotEmpty(t, gaps)
	// Most gaps, not all: on a loaded machine a listing can run late, and a
	// shard whose lease was lost and taken again is listed at once.
	slices.Sort(gaps)
	inRange := 0
	for _, g := range gaps {
		if g >= 300*time.Millisecond && g < 800*time.Millisecond {
			inRange++
		}
	}
	assert.GreaterOrEqual(t, float64(inRange), 0.8*float64(len(gaps)), "resync every 300 ms plus up to 300 ms: %v", gaps)
	p10, p90 := gaps[len(gaps)/10], gaps[len(gaps)*9/10]
	assert.Greater(t, p90-p10, 100*time.Millisecond, "jittered, not in lockstep: %v", gaps)
}

func TestDerivedIDAndRegistration(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	r := workers.New(st, workers.Options{Timing: fast})
	assert.Regexp(t, `^[A-Za-z0-9._:-]{1,128}$`, r.ID())
	assert.Regexp(t, `-[0-9]+-[0-9a-f]{8}$`, r.ID(), "host-pid-random")
	assert.NotEqual(t, r.ID(), workers.New(st, workers.Options{}).ID())
	r.RegisterSingleton("j", func(ctx context.Context, l workers.Lease) error { <-ctx.Done(); return nil })
	assert.Panics(t, func() { r.RegisterSingleton("j", func(context.Context, workers.Lease) error { return nil }) })
	require.NoError(t, r.Start(t.Context()))
	assert.Panics(t, func() { r.RegisterReconciler("late", noKeys{}) })

	var jobs []string
	require.NoError(t, st.Pool().QueryRow(t.Context(), "SELECT jobs FROM workers WHERE id = $1", r.ID()).Scan(&jobs))
	assert.Equal(t, []string{"j"}, jobs)
	require.Eventually(t, func() bool { return len(r.Held()) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, r.Stop(t.Context()))
	assert.Empty(t, r.Held())
	var active bool
	require.NoError(t, st.Pool().QueryRow(t.Context(), "SELECT expires_at > now() FROM leases WHERE name = 'job/j'").Scan(&active))
	assert.False(t, active, "released on Stop")
	require.NoError(t, r.Stop(t.Context()), "Stop twice is harmless")
}

// slack is how late a retry may run on a machine busy with other test
// packages; the lower bounds (each retry waits its backoff) are exact.
const slack = 250 * time.Millisecond
