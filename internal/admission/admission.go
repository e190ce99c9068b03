// Package admission sheds load in front of the RPC envelope: a call that
// would only queue is answered RATE_LIMITED with retryAfterMs before any
// work is done for it (no decision, no transaction, no connection).
//
// Two limits, each optional:
//
//   - calls in flight in this api process (concurrency-based, the manner
//     of Netflix's concurrency-limits with a fixed limit): past the point
//     where the database pool and the CPUs are busy, another call in
//     flight only adds to everyone's latency, so the call beyond the limit
//     is refused at once and the admitted ones keep their latency;
//   - calls per second per tenant (a token bucket per tenant and api
//     process, golang.org/x/time/rate): one tenant's burst cannot take
//     the whole process.
//
// The specification leaves a general request rate limit "not shown"; the
// option is ours (docs/protocol.md, "Admission").
package admission

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"computeplane/gen/api"
)

// Limits configures a Controller. A zero field turns its limit off.
type Limits struct {
	// MaxInFlight is the most calls this process runs at once.
	MaxInFlight int
	// TenantRate is calls per second per tenant; TenantBurst the bucket's
	// size (at least 1 when TenantRate is set).
	TenantRate  float64
	TenantBurst int
}

// maxTenants bounds the buckets kept; past it, buckets that are full
// (their tenant idle for at least a bucket's refill) are dropped.
const maxTenants = 10000

// InFlightRetryAfter is the retry hint of a call refused for the
// in-flight limit: calls last milliseconds, so a slot frees soon.
const InFlightRetryAfter = 50 * time.Millisecond

// Controller admits calls. The zero value and nil admit everything.
type Controller struct {
	limits   Limits
	inFlight atomic.Int64

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	now     func() time.Time
}

// New returns a controller for limits.
func New(l Limits) *Controller {
	if l.TenantRate > 0 && l.TenantBurst < 1 {
		l.TenantBurst = 1
	}
	return &Controller{limits: l, buckets: map[string]*rate.Limiter{}, now: time.Now}
}

// Enter takes an in-flight slot, to give back with Leave once the call's
// work is done, or answers RATE_LIMITED (and holds nothing).
func (c *Controller) Enter() error {
	if c == nil || c.limits.MaxInFlight <= 0 {
		return nil
	}
	if c.inFlight.Add(1) > int64(c.limits.MaxInFlight) {
		c.inFlight.Add(-1)
		return limited(InFlightRetryAfter, "the server is at its limit of %d calls in flight; retry later", c.limits.MaxInFlight)
	}
	return nil
}

// Leave gives back the slot of an Enter that succeeded.
func (c *Controller) Leave() {
	if c == nil || c.limits.MaxInFlight <= 0 {
		return
	}
	c.inFlight.Add(-1)
}

// InFlight is the number of calls holding a slot.
func (c *Controller) InFlight() int {
	if c == nil {
		return 0
	}
	return int(c.inFlight.Load())
}

// Tenant takes a token of tenant's bucket, or answers RATE_LIMITED with
// the time until one is there. An empty tenant (a method that names
// none) is not limited.
func (c *Controller) Tenant(tenant string) error {
	if c == nil || c.limits.TenantRate <= 0 || tenant == "" {
		return nil
	}
	now := c.now()
	c.mu.Lock()
	b, ok := c.buckets[tenant]
	if !ok {
		if len(c.buckets) >= maxTenants {
			c.dropFullLocked(now)
		}
		b = rate.NewLimiter(rate.Limit(c.limits.TenantRate), c.limits.TenantBurst)
		c.buckets[tenant] = b
	}
	c.mu.Unlock()
	r := b.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return limited(d, "tenant %s is at its limit of %g calls per second; retry later", tenant, c.limits.TenantRate)
	}
	return nil
}

// dropFullLocked forgets the buckets of tenants idle long enough for
// their bucket to be full again: a new bucket starts full too, so nothing
// changes for them.
func (c *Controller) dropFullLocked(now time.Time) {
	for t, b := range c.buckets {
		if b.TokensAt(now) >= float64(c.limits.TenantBurst) {
			delete(c.buckets, t)
		}
	}
}

func limited(after time.Duration, format string, args ...any) error {
	ms := max(after.Milliseconds(), 1)
	return api.Errorf(api.CodeRateLimited, format, args...).WithDetails(map[string]any{"retryAfterMs": ms})
}
