// Package admission sheds load in front of the RPC envelope: a call that
// would only queue is answered RATE_LIMITED with retryAfterMs before any
// work is done for it (no decision, no transaction, no connection).
//
// The limits, each optional:
//
//   - calls in flight in this api process (concurrency-based, in the
//     manner of Netflix's concurrency-limits): past the point where the
//     database pool and the CPUs are busy, another call in flight only
//     adds to everyone's latency, so the call beyond the limit is refused
//     at once and the admitted ones keep their latency. The limit adapts
//     to the wait for a database connection (waitlimit.go: the store
//     reports each acquire's wait, store.AcquireObserver) between a floor
//     and a ceiling, or is fixed;
//     with a slot wait (room.go), a call over the limit first waits a
//     little for a slot, newest first, so that a burst is not refused;
//   - the wait before admission (queue.go, in the manner of CoDel and
//     PIE): while calls keep waiting in the socket and for the CPU past a
//     target, a share of those that did is refused, as large as the
//     server needs to keep up;
//   - the queue bound: an admitted call that waits longer than this for a
//     database connection is shed too (store.WithAcquireRules), instead
//     of queueing for the store's full AcquireTimeout;
//   - calls per second per tenant (a token bucket per tenant and api
//     process, golang.org/x/time/rate, with per-tenant overrides): one
//     tenant's burst cannot take the whole process;
//   - calls per second in this api process (one global token bucket).
//
// The specification leaves a general request rate limit "not shown"; the
// option is ours (docs/protocol.md, "Admission").
package admission

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"computeplane/gen/api"
	"computeplane/internal/store"
)

// Limits configures a Controller. A zero field turns its limit off.
type Limits struct {
	// MaxInFlight is the most calls this process runs at once: the
	// limit itself, or with Adaptive its ceiling.
	MaxInFlight int
	// Adaptive lets the in-flight limit follow the wait for a database
	// connection between MinInFlight and MaxInFlight (waitlimit.go): it
	// shrinks while every acquire of two intervals in a row waited past
	// AcquireTarget (0 means DefaultAcquireTarget), and grows after an
	// interval in which some acquire did not.
	Adaptive      bool
	MinInFlight   int
	AcquireTarget time.Duration
	// SlotWait is how long a call over the in-flight limit waits for a
	// slot (newest first) before it is refused; 0 refuses it at once.
	// SlotWaiters bounds the calls waiting (default 4 x MaxInFlight: a
	// burst of a few ms at the peak rate); past it a call is refused at
	// once.
	SlotWait    time.Duration
	SlotWaiters int
	// MaxQueue bounds an admitted call's wait for a database connection;
	// 0 leaves the store's AcquireTimeout.
	MaxQueue time.Duration
	// QueueTarget turns on the check of a call's wait before admission
	// (queue.go): while a queue stands past QueueTarget, judged over each
	// QueueInterval, a share of the calls that waited past it is refused.
	// 0: no check. QueueInterval
	// 0 means DefaultQueueInterval.
	QueueTarget   time.Duration
	QueueInterval time.Duration
	// TenantRate is calls per second per tenant; TenantBurst the bucket's
	// size (at least 1 when TenantRate is set). Tenants overrides both
	// for the tenants it names.
	TenantRate  float64
	TenantBurst int
	Tenants     map[string]Bucket
	// GlobalRate and GlobalBurst are the bucket of the whole process.
	GlobalRate  float64
	GlobalBurst int
}

// Bucket is one token bucket's rate (per second) and size.
type Bucket struct {
	Rate  float64
	Burst int
}

// DefaultAcquireTarget is the wait for a database connection the
// adaptive limit lets stand: a few calls' worth of queue at the pool, so
// that a connection given back is taken at once, not after a new call
// is read and decided.
const DefaultAcquireTarget = 5 * time.Millisecond

// DefaultQueueInterval is the interval over which the wait check judges a
// standing queue and moves its share: CoDel's 100 ms.
const DefaultQueueInterval = 100 * time.Millisecond

// maxTenants bounds the buckets kept; past it, buckets that are full
// (their tenant idle for at least a bucket's refill) are dropped.
const maxTenants = 10000

// InFlightRetryAfter is the retry hint of a call refused for the
// in-flight limit or the queue bound: calls last milliseconds, so a slot
// frees soon.
const InFlightRetryAfter = 50 * time.Millisecond

// Controller admits calls. The zero value and nil admit everything.
type Controller struct {
	limits   Limits
	inFlight atomic.Int64
	limit    atomic.Int64 // the in-flight limit now; 0: none
	adapt    *waitLimit   // nil: the limit is fixed
	queue    *queueCheck  // nil: no check of the wait before admission
	room     *room        // nil: a call over the limit is refused at once
	global   *rate.Limiter

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time // the slot wait's timer

	refusalsMu sync.RWMutex
	refusals   map[refusalKey]*api.Error // see refusal
}

// New returns a controller for limits.
func New(l Limits) *Controller {
	if l.TenantRate > 0 && l.TenantBurst < 1 {
		l.TenantBurst = 1
	}
	if l.AcquireTarget <= 0 {
		l.AcquireTarget = DefaultAcquireTarget
	}
	if l.QueueTarget > 0 && l.QueueInterval <= 0 {
		l.QueueInterval = DefaultQueueInterval
	}
	c := &Controller{limits: l, buckets: map[string]*rate.Limiter{}, now: time.Now, after: time.After}
	if l.QueueTarget > 0 {
		c.queue = newQueueCheck(l.QueueTarget, l.QueueInterval, c.now())
	}
	if l.MaxInFlight > 0 {
		c.limit.Store(int64(l.MaxInFlight))
		if l.Adaptive {
			c.adapt = newWaitLimit(max(1, l.MinInFlight), l.MaxInFlight, l.AcquireTarget, c.now())
			c.limit.Store(c.adapt.current())
		}
	}
	if l.MaxInFlight > 0 && l.SlotWait > 0 {
		if l.SlotWaiters <= 0 {
			l.SlotWaiters = 4 * l.MaxInFlight
			c.limits.SlotWaiters = l.SlotWaiters
		}
		c.room = newRoom(l.SlotWait, l.SlotWaiters)
	}
	if l.GlobalRate > 0 {
		c.global = rate.NewLimiter(rate.Limit(l.GlobalRate), max(1, l.GlobalBurst))
	}
	return c
}

// Ticket is an admitted call's slot, to give back with Leave.
type Ticket struct{ held bool }

// Enter takes an in-flight slot, to give back with Leave once the call's
// work is done, or answers RATE_LIMITED (and holds nothing). EnterAt is
// Enter for a call whose wait before admission is judged.
func (c *Controller) Enter() (Ticket, error) {
	if !c.admits() {
		return Ticket{}, nil
	}
	return c.enter()
}

// admits reports whether Enter has anything to check.
func (c *Controller) admits() bool {
	return c != nil && (c.limits.MaxInFlight > 0 || c.queue != nil)
}

// EnterAt is Enter for a call that arrived at arrived (Arrived). With the
// wait check on (QueueTarget), a call that waited too long since it
// arrived may be refused (queue.go).
func (c *Controller) EnterAt(arrived time.Time) (Ticket, error) {
	if !c.admits() {
		return Ticket{}, nil
	}
	if c.queue != nil {
		now := c.now()
		if bound, ok := c.queue.admit(now, now.Sub(arrived), c.inFlight.Load() > 0); !ok {
			return Ticket{}, c.refusal(refusedWait, bound.Milliseconds())
		}
	}
	return c.enter()
}

// EnterChecked is EnterAt for a call whose wait CheckWait already
// admitted (ArrivedChecked): the wait is not judged twice.
func (c *Controller) EnterChecked(arrived time.Time) (Ticket, error) {
	if !c.admits() {
		return Ticket{}, nil
	}
	return c.enter()
}

// CheckWait judges the wait of a call that arrived at arrived, for the
// early path (rpc.Handler.RefuseEarly: before routing, the request id's
// context, the body): the refusal, or false when the call may go on (to
// EnterChecked). With the wait check off it admits everything.
func (c *Controller) CheckWait(arrived time.Time) (*api.Error, bool) {
	if c == nil || c.queue == nil {
		return nil, false
	}
	now := c.now()
	if bound, ok := c.queue.admit(now, now.Sub(arrived), c.inFlight.Load() > 0); !ok {
		return c.refusal(refusedWait, bound.Milliseconds()), true
	}
	return nil, false
}

// ChecksWait reports whether the wait check is on.
func (c *Controller) ChecksWait() bool { return c != nil && c.queue != nil }

// enter takes an in-flight slot.
func (c *Controller) enter() (Ticket, error) {
	n := c.inFlight.Add(1)
	if limit := c.limit.Load(); limit > 0 && n > limit {
		c.inFlight.Add(-1)
		if c.room == nil || !c.room.enter(&c.inFlight, &c.limit, c.after) {
			return Ticket{}, c.refusal(refusedInFlight, limit)
		}
	}
	return Ticket{held: true}, nil
}

// Full reports whether a call arriving now would be refused for the
// in-flight limit, and the refusal it would get, so that it can be
// answered before anything is done for it (rpc.Handler.RefuseEarly:
// before routing, the request id's context, the body): the limit is
// reached and, with a slot wait, the room is full too. Full takes no
// slot; a call it lets through is admitted or refused by EnterAt (or
// EnterChecked) as before.
func (c *Controller) Full() (*api.Error, bool) {
	if c == nil {
		return nil, false
	}
	limit := c.limit.Load()
	if limit <= 0 || c.inFlight.Load() < limit || (c.room != nil && !c.room.full()) {
		return nil, false
	}
	return c.refusal(refusedInFlight, limit), true
}

// Waiting is the number of calls waiting for a slot (Limits.SlotWait).
func (c *Controller) Waiting() int {
	if c == nil || c.room == nil {
		return 0
	}
	return c.room.len()
}

// Refusals of EnterAt, cached by refusal: the in-flight limit's by the
// limit, the wait check's by its bound in ms.
const (
	refusedInFlight = iota
	refusedWait
)

type refusalKey struct {
	kind int
	n    int64
}

// refusal is the refusal of kind for n, built once (the adaptive limit
// takes a few dozen values, the wait bound two): a refusal costs no
// formatting or allocation. Shared: callers must not modify it.
func (c *Controller) refusal(kind int, n int64) *api.Error {
	k := refusalKey{kind, n}
	c.refusalsMu.RLock()
	e, ok := c.refusals[k]
	c.refusalsMu.RUnlock()
	if ok {
		return e
	}
	if kind == refusedWait {
		e = queued(time.Duration(n) * time.Millisecond).(*api.Error)
	} else {
		e = limited(InFlightRetryAfter, "the server is at its limit of %d calls in flight; retry later", n).(*api.Error)
	}
	c.refusalsMu.Lock()
	if c.refusals == nil {
		c.refusals = map[refusalKey]*api.Error{}
	}
	if len(c.refusals) < maxRefusals {
		c.refusals[k] = e
	}
	c.refusalsMu.Unlock()
	return e
}

// maxRefusals bounds the refusals kept.
const maxRefusals = 1024

// queued is the refusal of a call that waited past bound before admission.
// Its message names the bound only (the refusal's answer is cached by
// message: rpc.writeShed).
func queued(bound time.Duration) error {
	return limited(InFlightRetryAfter, "the server is overloaded: the call waited more than %d ms before it could start; retry later", bound.Milliseconds())
}

// Leave gives back the slot of an Enter that succeeded.
func (c *Controller) Leave(t Ticket) {
	if c == nil || !t.held {
		return
	}
	if c.room != nil {
		c.room.leave(&c.inFlight, &c.limit) // to the newest waiter, if any
	} else {
		c.inFlight.Add(-1)
	}
}

// AcquireObserver is what the store reports an admitted call's waits for
// a database connection to (store.WithAcquireRules): the controller
// with an adaptive limit, nil otherwise.
func (c *Controller) AcquireObserver() store.AcquireObserver {
	if c == nil || c.adapt == nil {
		return nil
	}
	return c
}

// Acquired moves the adaptive limit on one wait for a database
// connection (store.AcquireObserver).
func (c *Controller) Acquired(wait time.Duration) {
	if c == nil || c.adapt == nil {
		return
	}
	c.limit.Store(c.adapt.acquired(c.now(), wait, int(c.inFlight.Load())))
}

// Overloaded reports whether the wait check refuses calls now (a share
// of those that waited past QueueTarget).
func (c *Controller) Overloaded() bool {
	return c != nil && c.queue != nil && c.queue.isOverloaded()
}

// WaitShare is the share of the calls past QueueTarget the wait check
// refuses now (0 with the check off).
func (c *Controller) WaitShare() float64 {
	if c == nil || c.queue == nil {
		return 0
	}
	return c.queue.refusedShare()
}

// InFlight is the number of calls holding a slot.
func (c *Controller) InFlight() int {
	if c == nil {
		return 0
	}
	return int(c.inFlight.Load())
}

// Limit is the in-flight limit now (0: none).
func (c *Controller) Limit() int {
	if c == nil {
		return 0
	}
	return int(c.limit.Load())
}

// MaxQueue is the bound of an admitted call's wait for a database
// connection (0: the store's own).
func (c *Controller) MaxQueue() time.Duration {
	if c == nil {
		return 0
	}
	return c.limits.MaxQueue
}

// Shed turns a call's error into RATE_LIMITED when it is the queue
// bound's (store.ErrQueueBound): the call waited for a connection as long
// as it may, and nothing it did was kept. Other errors are left as they
// are.
func Shed(err error) error {
	if err != nil && errors.Is(err, store.ErrQueueBound) {
		return limited(InFlightRetryAfter, "the server is busy: no database connection came free in time; retry later")
	}
	return err
}

// Rate takes a token of tenant's bucket and of the global one, or
// answers RATE_LIMITED with the time until the refusing bucket has one.
// An empty tenant (a method that names none) meets the global bucket
// only.
func (c *Controller) Rate(tenant string) error {
	if c == nil {
		return nil
	}
	now := c.now()
	var tr *rate.Reservation
	if tenant != "" {
		b, limit := c.bucket(tenant, now)
		if b != nil {
			tr = b.ReserveN(now, 1)
			if d := tr.DelayFrom(now); d > 0 {
				tr.CancelAt(now)
				return limited(d, "tenant %s is at its limit of %g calls per second; retry later", tenant, limit)
			}
		}
	}
	if c.global != nil {
		gr := c.global.ReserveN(now, 1)
		if d := gr.DelayFrom(now); d > 0 {
			gr.CancelAt(now)
			if tr != nil {
				tr.CancelAt(now) // the tenant's token was not used
			}
			return limited(d, "the server is at its limit of %g calls per second; retry later", c.limits.GlobalRate)
		}
	}
	return nil
}

// bucket is tenant's bucket and its rate, nil when the tenant has none.
func (c *Controller) bucket(tenant string, now time.Time) (*rate.Limiter, float64) {
	spec, ok := c.limits.Tenants[tenant]
	if !ok {
		spec = Bucket{Rate: c.limits.TenantRate, Burst: c.limits.TenantBurst}
	}
	if spec.Rate <= 0 {
		return nil, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.buckets[tenant]
	if !ok {
		if len(c.buckets) >= maxTenants {
			c.dropFullLocked(now)
		}
		b = rate.NewLimiter(rate.Limit(spec.Rate), max(1, spec.Burst))
		c.buckets[tenant] = b
	}
	return b, spec.Rate
}

// dropFullLocked forgets the buckets of tenants idle long enough for
// their bucket to be full again: a new bucket starts full too, so nothing
// changes for them.
func (c *Controller) dropFullLocked(now time.Time) {
	for t, b := range c.buckets {
		if b.TokensAt(now) >= float64(b.Burst()) {
			delete(c.buckets, t)
		}
	}
}

func limited(after time.Duration, format string, args ...any) error {
	ms := max(after.Milliseconds(), 1)
	return api.Errorf(api.CodeRateLimited, format, args...).WithDetails(map[string]any{"retryAfterMs": ms})
}
