// Package workers runs the background work of the worker roles (interface
// specification, Process roles; Limits: Shards, Leases, Worker liveness,
// Retry timing). A Runner per process registers in the workers table and
// heartbeats; it holds the shard leases (shard/0..shard/255) and singleton
// job leases (job/<name>) that rendezvous hashing over the live workers
// gives it, and runs under each lease the work registered for it: a
// singleton job, or the reconcilers' keys of a shard. Every lease decision
// is taken by the database with its own clock; a write done under a lease
// is fenced by the lease's epoch (Lease.Fence) in its own transaction.
// See docs/workers.md.
package workers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/config"
	"computeplane/internal/store"
)

// Timing of leases, liveness and retries. The zero value of a field takes
// the specification's value; tests scale them down.
type Timing struct {
	LeaseTTL  time.Duration // lease lifetime from its last renewal: 15 s
	Renew     time.Duration // renewal and heartbeat period: 5 s
	Liveness  time.Duration // a worker is live while its heartbeat is younger: 30 s
	SyncAgain time.Duration // SyncAgain requeues a key after: 1 s
	RetryMin  time.Duration // first backoff after a failure: 1 s, doubling
	RetryMax  time.Duration // longest backoff: 5 min
}

// DefaultTiming is the specification's timing.
func DefaultTiming() Timing {
	return Timing{
		LeaseTTL:  15 * time.Second,
		Renew:     5 * time.Second,
		Liveness:  30 * time.Second,
		SyncAgain: time.Second,
		RetryMin:  time.Second,
		RetryMax:  5 * time.Minute,
	}
}

func (t Timing) withDefaults() Timing {
	d := DefaultTiming()
	for _, f := range []struct{ v, def *time.Duration }{
		{&t.LeaseTTL, &d.LeaseTTL}, {&t.Renew, &d.Renew}, {&t.Liveness, &d.Liveness},
		{&t.SyncAgain, &d.SyncAgain}, {&t.RetryMin, &d.RetryMin}, {&t.RetryMax, &d.RetryMax},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return t
}

// backoff is the delay after n failures in a row: lo doubling, at most hi.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// Result says what to do with a key after a successful Sync.
type Result int

const (
	// Done leaves the key until the next resync or Enqueue.
	Done Result = iota
	// SyncAgain syncs the key again after Timing.SyncAgain (1 s).
	SyncAgain
)

// Reconciler brings the keys of a shard to their desired state. Keys lists
// the keys of one shard (each key k with ShardOf(k) == shard; others are
// ignored); Sync reconciles one key under the shard's lease, fencing its
// writes with l.Fence. ctx of Sync ends when the lease is lost or released.
// A key is never synced by two workers at a time within a process, nor in
// two processes while the lease is held.
type Reconciler interface {
	Keys(ctx context.Context, shard int) ([]string, error)
	Sync(ctx context.Context, l Lease, key string) (Result, error)
}

// JobFunc is a singleton job. It is called while the job's lease is held
// and should run until ctx ends, which happens as soon as the lease is lost
// (context.Cause is then ErrLeaseLost) or released. Returning nil calls it
// again after the poll interval; an error backs off 1 s doubling to 5 min.
type JobFunc func(ctx context.Context, l Lease) error

// Options configure a Runner.
type Options struct {
	// Workers are the worker tuning options; zero fields take the
	// specification's defaults. ID empty derives host-pid-random.
	Workers config.Workers
	Timing  Timing
	Log     *slog.Logger
}

// Runner is the worker of one process. Register jobs and reconcilers, then
// Start; Stop releases every lease and leaves the workers table.
type Runner struct {
	st          *store.Store
	q           *db.Queries
	id, host    string
	pid         int32
	t           Timing
	concurrency int
	resync      time.Duration
	poll        time.Duration
	log         *slog.Logger

	mu       sync.Mutex
	started  bool
	jobs     map[string]JobFunc
	recs     map[string]Reconciler
	held     map[string]*held // by lease name; written by the loop goroutine
	queue    *queue
	base     context.Context // parent of all work; cancelled by Stop
	stopWork context.CancelCauseFunc
	stopLoop context.CancelFunc
	loopDone chan struct{}
	bg       sync.WaitGroup // queue workers and goroutines winding down a lease
}

var (
	errReleased = errors.New("workers: lease released")
	errStopped  = errors.New("workers: runner stopped")
)

// New returns a Runner on st; nothing runs before Start.
func New(st *store.Store, opt Options) *Runner {
	w := opt.Workers
	if w.Concurrency <= 0 {
		w.Concurrency = 4
	}
	if w.ResyncMs <= 0 {
		w.ResyncMs = 300_000
	}
	if w.PollMs <= 0 {
		w.PollMs = 1_000
	}
	host, _ := os.Hostname()
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{
		st: st, q: db.New(st.Pool()),
		host: host, pid: int32(os.Getpid()),
		t:           opt.Timing.withDefaults(),
		concurrency: w.Concurrency,
		resync:      time.Duration(w.ResyncMs) * time.Millisecond,
		poll:        time.Duration(w.PollMs) * time.Millisecond,
		jobs:        map[string]JobFunc{},
		recs:        map[string]Reconciler{},
		held:        map[string]*held{},
	}
	r.id = w.ID
	if r.id == "" {
		r.id = deriveID(host, os.Getpid())
	}
	r.log = log.With("worker", r.id)
	r.queue = newQueue(r.t)
	return r
}

// deriveID makes a worker id of the host name, the pid and a random part,
// within the id's alphabet and 128 characters.
func deriveID(host string, pid int) string {
	clean := strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:-", c) {
			return c
		}
		return '-'
	}, host)
	if clean == "" {
		clean = "worker"
	}
	if len(clean) > 64 {
		clean = clean[:64]
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", clean, pid, hex.EncodeToString(b))
}

// ID is the worker id: the holder of its leases.
func (r *Runner) ID() string { return r.id }

// RegisterSingleton adds a job run under the lease job/<name> by one live
// worker at a time. Register before Start; a name is registered once.
func (r *Runner) RegisterSingleton(name string, run JobFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || name == "" || run == nil || r.jobs[name] != nil {
		panic(fmt.Sprintf("workers: RegisterSingleton(%q): empty, nil, duplicate or after Start", name))
	}
	r.jobs[name] = run
}

// RegisterReconciler adds a reconciler run on the shards this worker holds.
// Register before Start; a name is registered once. Every process that
// runs reconcilers must register the same ones: shards are split over all
// the workers that registered any.
func (r *Runner) RegisterReconciler(name string, rec Reconciler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || name == "" || rec == nil || r.recs[name] != nil {
		panic(fmt.Sprintf("workers: RegisterReconciler(%q): empty, nil, duplicate or after Start", name))
	}
	r.recs[name] = rec
}

// Enqueue asks for a Sync of key by the reconciler name soon, when this
// worker holds the key's shard; otherwise it does nothing (the holder
// finds the key at its next resync).
func (r *Runner) Enqueue(name, key string) {
	r.mu.Lock()
	_, ok := r.recs[name]
	h := r.held[ShardLease(ShardOf(key))]
	r.mu.Unlock()
	if ok && h != nil {
		r.queue.add(item{rec: name, key: key})
	}
}

// Resync lists the keys of every shard held now, as the periodic resync
// does.
func (r *Runner) Resync() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.held {
		if h.relist != nil {
			select {
			case h.relist <- struct{}{}:
			default:
			}
		}
	}
}

// Held returns the leases this worker holds now, by name.
func (r *Runner) Held() []Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Lease, 0, len(r.held))
	for _, h := range r.held {
		out = append(out, h.lease)
	}
	slices.SortFunc(out, func(a, b Lease) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Start registers the worker and starts holding leases in the background.
// ctx bounds the registration only; the Runner runs until Stop.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return errors.New("workers: already started")
	}
	r.started = true
	r.mu.Unlock()
	if err := r.q.RegisterWorker(ctx, db.RegisterWorkerParams{
		ID: r.id, Host: r.host, Pid: r.pid, Jobs: r.jobNames(), Reconcilers: r.recNames(),
	}); err != nil {
		return fmt.Errorf("workers: register: %w", err)
	}
	loopCtx, stopLoop := context.WithCancel(context.Background())
	r.mu.Lock()
	r.base, r.stopWork = context.WithCancelCause(context.Background())
	r.stopLoop = stopLoop
	r.loopDone = make(chan struct{})
	r.mu.Unlock()
	if len(r.recs) > 0 {
		for range r.concurrency {
			r.bg.Go(r.work)
		}
	}
	go r.loop(loopCtx)
	r.log.Info("worker started", "jobs", r.jobNames(), "reconcilers", r.recNames())
	return nil
}

// Stop ends all work, releases every lease (another worker can take it at
// once) and deletes the worker's row. It waits for the work to end until
// ctx is done, then releases anyway: fencing keeps late writes out.
func (r *Runner) Stop(ctx context.Context) error {
	leases := r.halt(ctx)
	// The caller's context may be done already: release anyway, briefly.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.t.Renew)
	defer cancel()
	err := r.release(cctx, leases)
	if rerr := r.q.ReleaseHolder(cctx, r.id); rerr != nil {
		err = errors.Join(err, fmt.Errorf("workers: release: %w", rerr))
	}
	if derr := r.q.DeleteWorker(cctx, r.id); derr != nil {
		err = errors.Join(err, fmt.Errorf("workers: leave: %w", derr))
	}
	r.log.Info("worker stopped", "released", len(leases))
	return err
}

// halt stops the loop and all work and returns the leases still held,
// without releasing them (a killed process would leave them so).
func (r *Runner) halt(ctx context.Context) []Lease {
	r.mu.Lock()
	started := r.started && r.stopLoop != nil
	r.mu.Unlock()
	if !started {
		return nil
	}
	r.stopLoop()
	<-r.loopDone
	r.mu.Lock()
	var leases []Lease
	var hs []*held
	for name, h := range r.held {
		leases = append(leases, h.lease)
		hs = append(hs, h)
		delete(r.held, name)
	}
	r.mu.Unlock()
	r.stopWork(errStopped)
	r.queue.close()
	done := make(chan struct{})
	go func() {
		for _, h := range hs {
			h.close(errStopped)
		}
		r.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		r.log.Warn("worker stopping: work did not end in time")
	}
	return leases
}

func (r *Runner) jobNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.jobs))
	for n := range r.jobs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (r *Runner) recNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.recs))
	for n := range r.recs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// held is a lease this worker holds and the work running under it.
type held struct {
	lease     Lease
	renewedAt time.Time // process clock before the last successful renewal
	ctx       context.Context
	cancel    context.CancelCauseFunc
	relist    chan struct{} // shards: list the keys now

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// enter counts one goroutine working under the lease; false once closed.
func (h *held) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.wg.Add(1)
	return true
}

func (h *held) exit() { h.wg.Done() }

// close cancels the work under the lease and waits for it to end.
func (h *held) close(cause error) {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel(cause)
	h.wg.Wait()
}

// loop keeps the leases: each tick renews, heartbeats and rebalances.
func (r *Runner) loop(ctx context.Context) {
	defer close(r.loopDone)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(r.tick(ctx))
	}
}

// tick does one round and returns the delay before the next: the renewal
// period, or a quarter of it while leases this worker should hold are
// still held by others (they release them at their next tick).
func (r *Runner) tick(ctx context.Context) time.Duration {
	r.dropExpired()
	r.renew(ctx)
	if err := r.call(ctx, func(ctx context.Context) error {
		return r.q.HeartbeatWorker(ctx, db.HeartbeatWorkerParams{
			ID: r.id, Host: r.host, Pid: r.pid, Jobs: r.jobNames(), Reconcilers: r.recNames(),
		})
	}); err != nil {
		r.logErr(ctx, "heartbeat", err)
	}
	_ = r.call(ctx, func(ctx context.Context) error {
		return r.q.DeleteStaleWorkers(ctx, db.DeleteStaleWorkersParams{OlderThanMs: (10 * r.t.Liveness).Milliseconds()})
	})
	var live []db.ListLiveWorkersRow
	if err := r.call(ctx, func(ctx context.Context) (err error) {
		live, err = r.q.ListLiveWorkers(ctx, db.ListLiveWorkersParams{
			LiveMs: r.t.Liveness.Milliseconds(), ResponsiveMs: r.t.LeaseTTL.Milliseconds(),
		})
		return err
	}); err != nil {
		r.logErr(ctx, "list workers", err)
		return r.t.Renew / 4
	}
	want := r.wanted(live)
	r.mu.Lock()
	var drop []*held
	for name, h := range r.held {
		if !want[name] {
			drop = append(drop, h)
			delete(r.held, name)
		}
	}
	r.mu.Unlock()
	for _, h := range drop {
		r.log.Debug("releasing lease", "lease", h.lease.Name, "epoch", h.lease.Epoch)
		r.windDown(h, errReleased, true)
	}
	missing := 0
	for name := range want {
		if ctx.Err() != nil {
			break // stopping: acquire no more
		}
		r.mu.Lock()
		_, have := r.held[name]
		r.mu.Unlock()
		if have {
			continue
		}
		if ok, err := r.acquire(ctx, name); err != nil {
			r.logErr(ctx, "acquire "+name, err)
			missing++
		} else if !ok {
			missing++
		}
	}
	if missing > 0 {
		return r.t.Renew / 4
	}
	return r.t.Renew
}

// call runs one statement of the loop, bounded by the renewal period so
// that a slow database cannot hold the loop past the leases' lifetime.
func (r *Runner) call(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.t.Renew)
	defer cancel()
	return fn(ctx)
}

func (r *Runner) logErr(ctx context.Context, what string, err error) {
	if ctx.Err() == nil {
		r.log.Warn("worker: "+what, "error", err.Error())
	}
}

// wanted returns the leases this worker should hold: each lease goes to the
// live worker with the highest rendezvous weight among those able to do
// its work. Live workers whose heartbeat is older than a lease lifetime are
// passed over: they heartbeat when they renew, so their leases have lapsed
// too (a killed worker's leases are taken over after 15 s, not 30).
func (r *Runner) wanted(live []db.ListLiveWorkersRow) map[string]bool {
	var shardWorkers []string
	jobWorkers := map[string][]string{}
	for _, w := range live {
		if !w.Responsive || w.ID == r.id {
			continue
		}
		if len(w.Reconcilers) > 0 {
			shardWorkers = append(shardWorkers, w.ID)
		}
		for _, j := range w.Jobs {
			jobWorkers[j] = append(jobWorkers[j], w.ID)
		}
	}
	want := map[string]bool{}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) > 0 {
		cands := append(shardWorkers, r.id)
		for s := range NumShards {
			if name := ShardLease(s); owner(name, cands) == r.id {
				want[name] = true
			}
		}
	}
	for j := range r.jobs {
		name := JobLease(j)
		if owner(name, append(jobWorkers[j], r.id)) == r.id {
			want[name] = true
		}
	}
	return want
}

// acquire takes the lease name when it is free or expired and starts its
// work.
func (r *Runner) acquire(ctx context.Context, name string) (bool, error) {
	before := time.Now()
	var row db.AcquireLeaseRow
	// Not cancelled by a stop: a statement cancelled in flight may still
	// commit, leaving a lease held that this worker does not know of and
	// so would not release. It finishes (bounded), the lease is recorded,
	// and the stop releases it with the others.
	err := r.call(context.WithoutCancel(ctx), func(ctx context.Context) (err error) {
		row, err = r.q.AcquireLease(ctx, db.AcquireLeaseParams{Name: name, Holder: r.id, TtlMs: r.t.LeaseTTL.Milliseconds()})
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	hctx, cancel := context.WithCancelCause(r.base)
	h := &held{lease: Lease{Name: name, Holder: r.id, Epoch: row.Epoch}, renewedAt: before, ctx: hctx, cancel: cancel}
	r.log.Debug("acquired lease", "lease", name, "epoch", row.Epoch)
	// Held before its work starts: the work looks its lease up.
	var start func()
	if job, ok := strings.CutPrefix(name, "job/"); ok {
		run := r.jobs[job]
		start = func() { r.runJob(h, run) }
	} else {
		var shard int
		_, _ = fmt.Sscanf(name, "shard/%d", &shard)
		h.relist = make(chan struct{}, 1)
		start = func() { r.runShard(h, shard) }
	}
	h.enter()
	r.mu.Lock()
	r.held[name] = h
	r.mu.Unlock()
	go start()
	return true, nil
}

// renew extends every lease held in one statement; a lease missing from
// the answer is lost and its work is cancelled at once.
func (r *Runner) renew(ctx context.Context) {
	r.mu.Lock()
	names := make([]string, 0, len(r.held))
	epochs := make([]int64, 0, len(r.held))
	for name, h := range r.held {
		names = append(names, name)
		epochs = append(epochs, h.lease.Epoch)
	}
	r.mu.Unlock()
	if len(names) == 0 {
		return
	}
	before := time.Now()
	var rows []db.RenewLeasesRow
	err := r.call(ctx, func(ctx context.Context) (err error) {
		rows, err = r.q.RenewLeases(ctx, db.RenewLeasesParams{
			Names: names, Epochs: epochs, Holder: r.id, TtlMs: r.t.LeaseTTL.Milliseconds(),
		})
		return err
	})
	if err != nil {
		r.logErr(ctx, "renew leases", err)
		return // dropExpired gives them up when their time is over
	}
	kept := make(map[string]bool, len(rows))
	for _, row := range rows {
		kept[row.Name] = true
	}
	r.mu.Lock()
	var lost []*held
	for _, name := range names {
		h := r.held[name]
		if h == nil {
			continue
		}
		if kept[name] {
			h.renewedAt = before
		} else {
			lost = append(lost, h)
			delete(r.held, name)
		}
	}
	r.mu.Unlock()
	for _, h := range lost {
		r.log.Warn("lease lost", "lease", h.lease.Name, "epoch", h.lease.Epoch)
		r.windDown(h, ErrLeaseLost, false)
	}
}

// dropExpired gives up the leases whose last successful renewal is a lease
// lifetime ago by the process clock: the database may have let another
// worker take them. The process clock only ever gives a lease up sooner.
func (r *Runner) dropExpired() {
	r.mu.Lock()
	var lost []*held
	for name, h := range r.held {
		if time.Since(h.renewedAt) >= r.t.LeaseTTL {
			lost = append(lost, h)
			delete(r.held, name)
		}
	}
	r.mu.Unlock()
	for _, h := range lost {
		r.log.Warn("lease expired without renewal", "lease", h.lease.Name, "epoch", h.lease.Epoch)
		r.windDown(h, ErrLeaseLost, false)
	}
}

// windDown cancels the work of a lease no longer held and, for a release,
// frees the lease once that work has ended, so the next holder never
// overlaps with it.
func (r *Runner) windDown(h *held, cause error, release bool) {
	r.bg.Go(func() {
		h.close(cause)
		if release {
			ctx, cancel := context.WithTimeout(context.Background(), r.t.Renew)
			defer cancel()
			if err := r.release(ctx, []Lease{h.lease}); err != nil {
				r.log.Warn("worker: release", "lease", h.lease.Name, "error", err.Error())
			}
		}
	})
}

func (r *Runner) release(ctx context.Context, leases []Lease) error {
	if len(leases) == 0 {
		return nil
	}
	names := make([]string, len(leases))
	epochs := make([]int64, len(leases))
	for i, l := range leases {
		names[i], epochs[i] = l.Name, l.Epoch
	}
	if err := r.q.ReleaseLeases(ctx, db.ReleaseLeasesParams{Names: names, Epochs: epochs, Holder: r.id}); err != nil {
		return fmt.Errorf("workers: release: %w", err)
	}
	return nil
}

// runJob calls the job while its lease is held.
func (r *Runner) runJob(h *held, run JobFunc) {
	defer h.exit()
	fails := 0
	for h.ctx.Err() == nil {
		began := time.Now()
		err := safely(func() error { return run(h.ctx, h.lease) })
		if h.ctx.Err() != nil {
			return
		}
		delay := r.poll
		if err != nil {
			if time.Since(began) >= r.t.RetryMax {
				fails = 0 // it ran well for a long time first
			}
			fails++
			delay = backoff(fails, r.t.RetryMin, r.t.RetryMax)
			r.log.Warn("job failed", "lease", h.lease.Name, "error", err.Error(), "retryIn", delay.String())
		} else {
			fails = 0
		}
		if !sleep(h.ctx, delay) {
			return
		}
	}
}

// runShard lists the keys of the shard for every reconciler, at once and
// then every resync period plus a random jitter of up to that period.
func (r *Runner) runShard(h *held, shard int) {
	defer h.exit()
	names := r.recNames()
	fails := 0
	for {
		ok := true
		for _, name := range names {
			keys, err := r.recs[name].Keys(h.ctx, shard)
			if err != nil {
				if h.ctx.Err() != nil {
					return
				}
				r.log.Warn("reconciler keys", "reconciler", name, "shard", shard, "error", err.Error())
				ok = false
				continue
			}
			for _, k := range keys {
				if ShardOf(k) == shard {
					r.queue.add(item{rec: name, key: k})
				}
			}
		}
		delay := r.resync + time.Duration(mrand.Int64N(int64(r.resync)+1))
		if ok {
			fails = 0
		} else {
			fails++
			delay = backoff(fails, r.t.RetryMin, r.t.RetryMax)
		}
		t := time.NewTimer(delay)
		select {
		case <-h.ctx.Done():
			t.Stop()
			return
		case <-h.relist:
		case <-t.C:
		}
		t.Stop()
	}
}

// work syncs queued keys until the queue closes.
func (r *Runner) work() {
	for {
		it, ok := r.queue.pop()
		if !ok {
			return
		}
		r.mu.Lock()
		h := r.held[ShardLease(ShardOf(it.key))]
		rec := r.recs[it.rec]
		r.mu.Unlock()
		if h == nil || !h.enter() {
			r.queue.drop(it)
			continue
		}
		var res Result
		err := safely(func() (err error) {
			res, err = rec.Sync(h.ctx, h.lease, it.key)
			return err
		})
		h.exit()
		if h.ctx.Err() != nil {
			r.queue.drop(it) // the next holder lists it again
			continue
		}
		if err != nil {
			r.log.Warn("sync failed", "reconciler", it.rec, "key", it.key, "error", err.Error())
		}
		r.queue.done(it, res, err)
	}
}

// safely runs fn, turning a panic into an error so that one bad job or key
// does not end the process.
func safely(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return fn()
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
