package config

import (
	"sort"
	"time"
)

// Admission sheds load in front of the RPC envelope (internal/admission).
// The specification leaves a general request rate limit "not shown"; this
// option is ours (docs/protocol.md, "Admission").
type Admission struct {
	// MaxInFlight is the most calls one api process runs at once: the
	// ceiling of the adaptive limit, or the limit when Adaptive is off.
	// 0 turns the limit off, AutoInFlight (the default) is
	// InFlightPerConn times the api's database pool, or
	// AdaptiveInFlightPerConn times it for the adaptive limit.
	MaxInFlight int
	// Adaptive (off by default) lets the limit follow the wait for a
	// database connection between MinInFlight (AutoInFlight, the
	// default: the pool's size) and MaxInFlight: it shrinks while every
	// acquire of two intervals in a row waits past AcquireTarget, and
	// grows after an interval in which some acquire did not
	// (internal/admission waitlimit.go).
	Adaptive      bool
	MinInFlight   int
	AcquireTarget time.Duration
	// SlotWait is how long a call over the in-flight limit waits for a
	// slot, newest first, before it is refused (0, the default: refused
	// at once; internal/admission room.go). Needs an in-flight limit.
	SlotWait time.Duration
	// MaxQueue bounds an admitted call's wait for a database connection;
	// past it the call is shed. 0 (the default) leaves the store's own
	// 2 s, after which the call answers UNAVAILABLE.
	MaxQueue time.Duration
	// QueueTarget turns on the check of a call's wait before admission
	// (in the socket and for the CPU; internal/admission queue.go): while
	// a queue stands past QueueTarget (judged each QueueInterval), a share
	// of the calls that waited past it is refused, as large as the server
	// needs. 0 (the default): no check.
	QueueTarget   time.Duration
	QueueInterval time.Duration
	// TenantRate is calls per second per tenant and api process (0, the
	// default: none), TenantBurst the bucket (default twice the rate,
	// at least 1). Tenants overrides both per tenant.
	TenantRate  float64
	TenantBurst int
	Tenants     map[string]AdmissionBucket
	// GlobalRate is calls per second of the whole api process (0, the
	// default: none), GlobalBurst its bucket (default twice the rate).
	GlobalRate  float64
	GlobalBurst int
	// MaxConnections is the most client connections one api process
	// serves at once (0, the default: no cap). Past it the listener
	// stops accepting: further connections wait in the kernel's accept
	// queue, and idle ones are let go (server.ConnLimits).
	MaxConnections int
}

// DefaultMaxConnections is no cap: under an open-loop overload a cap
// turned refusals into calls waiting for a connection (seconds, and
// reconnections that cost more than the refusals they replaced;
// docs/benchmarks-notes.md, "Cheaper refusals and a cap on
// connections"), and long-lived event streams would hold slots. Set one
// to keep a flood of connections below the process's descriptors.
const DefaultMaxConnections = 0

// MaxMaxConnections bounds admission.maxConnections.
const MaxMaxConnections = 1000000

// AdmissionBucket is one tenant's token bucket.
type AdmissionBucket struct {
	Rate  float64
	Burst int
}

// AutoInFlight asks for the default in-flight limit (or floor).
const AutoInFlight = -1

// InFlightPerConn is the default in-flight ceiling per connection of the
// api's pool: a few calls decode, decide and encode while one holds the
// connection, and past that another call in flight only queues.
const InFlightPerConn = 4

// AdaptiveInFlightPerConn is the default ceiling of the adaptive limit
// per connection of the pool: the limit starts there and comes down by
// itself when a queue stands at the pool, so the ceiling only bounds a
// burst, which a shared machine's stalls make large (after a stall of
// 80 ms at 4,000 calls/s, about 250 calls are in flight at once:
// internal/admission, TestWaitLimitRefusesNothingBelowCapacity).
const AdaptiveInFlightPerConn = 64

// DefaultAcquireTargetMs and MaxAcquireTargetMs: the wait for a database
// connection the adaptive limit lets stand, and its bound (below the
// limit's 100 ms interval).
const (
	DefaultAcquireTargetMs = 5
	MaxAcquireTargetMs     = 50
)

// The wait check's bounds: the target is a few calls' worth of queue, the
// interval long enough to tell a standing queue from a burst.
const (
	MaxQueueTargetMs     = 1000
	MaxQueueIntervalMs   = 10000
	DefaultQueueInterval = 100 * time.Millisecond
)

// MaxSlotWaitMs bounds admission.slotWaitMs: a wait for a slot is a
// burst's few milliseconds, not a queue.
const MaxSlotWaitMs = 1000

// MaxQueueLimit is the store's own wait for a connection
// (store.AcquireTimeout); a queue bound must be below it.
const MaxQueueLimit = 2000

type fileAdmission struct {
	MaxInFlight      *int                           `yaml:"maxInFlight"`
	Adaptive         *bool                          `yaml:"adaptive"`
	MinInFlight      *int                           `yaml:"minInFlight"`
	LatencyTolerance *float64                       `yaml:"latencyTolerance"` // refused: see admission
	AcquireTargetMs  *int                           `yaml:"acquireTargetMs"`
	SlotWaitMs       *int                           `yaml:"slotWaitMs"`
	MaxQueueMs       *int                           `yaml:"maxQueueMs"`
	QueueTargetMs    *int                           `yaml:"queueTargetMs"`
	QueueIntervalMs  *int                           `yaml:"queueIntervalMs"`
	TenantRate       *float64                       `yaml:"tenantRate"`
	TenantBurst      *int                           `yaml:"tenantBurst"`
	Tenants          map[string]fileAdmissionBucket `yaml:"tenants"`
	GlobalRate       *float64                       `yaml:"globalRate"`
	GlobalBurst      *int                           `yaml:"globalBurst"`
	MaxConnections   *int                           `yaml:"maxConnections"`
}

type fileAdmissionBucket struct {
	Rate  *float64 `yaml:"rate"`
	Burst *int     `yaml:"burst"`
}

func (b *builder) admission(fc *fileConfig, c *Config) error {
	fa := deref(fc.Admission, fileAdmission{})
	a := &c.Admission
	a.MaxInFlight = AutoInFlight
	if fa.MaxInFlight != nil {
		if *fa.MaxInFlight < 0 {
			return b.errorf("admission.maxInFlight", "must be at least 0 (0 turns the limit off)")
		}
		a.MaxInFlight = *fa.MaxInFlight
	}
	if fa.LatencyTolerance != nil {
		// The limit that followed latency sank to its floor under CPU
		// saturation (docs/benchmarks-notes.md, 2026-11-29, wt-shed3).
		return b.errorf("admission.latencyTolerance", "is no longer an option: the adaptive limit follows the wait for a database connection (admission.acquireTargetMs), not latency")
	}
	a.Adaptive = deref(fa.Adaptive, false)
	if a.MaxInFlight == 0 || !a.Adaptive {
		// The adaptive settings mean nothing without an adaptive limit.
		for name, set := range map[string]bool{"minInFlight": fa.MinInFlight != nil, "acquireTargetMs": fa.AcquireTargetMs != nil} {
			if set {
				return b.errorf("admission."+name, "needs an adaptive in-flight limit (admission.adaptive true and admission.maxInFlight not 0)")
			}
		}
		a.Adaptive = a.Adaptive && a.MaxInFlight != 0
	}
	a.MinInFlight = AutoInFlight
	if fa.MinInFlight != nil {
		if *fa.MinInFlight < 1 {
			return b.errorf("admission.minInFlight", "must be at least 1")
		}
		if a.MaxInFlight > 0 && *fa.MinInFlight > a.MaxInFlight {
			return b.errorf("admission.minInFlight", "must be at most admission.maxInFlight (%d)", a.MaxInFlight)
		}
		a.MinInFlight = *fa.MinInFlight
	}
	acquireTarget := deref(fa.AcquireTargetMs, DefaultAcquireTargetMs)
	if acquireTarget < 1 || acquireTarget > MaxAcquireTargetMs {
		return b.errorf("admission.acquireTargetMs", "must be from 1 to %d (the wait for a database connection the adaptive limit lets stand)", MaxAcquireTargetMs)
	}
	a.AcquireTarget = time.Duration(acquireTarget) * time.Millisecond
	if fa.SlotWaitMs != nil {
		if *fa.SlotWaitMs < 0 || *fa.SlotWaitMs > MaxSlotWaitMs {
			return b.errorf("admission.slotWaitMs", "must be from 0 to %d (0: a call over the in-flight limit is refused at once)", MaxSlotWaitMs)
		}
		if a.MaxInFlight == 0 && *fa.SlotWaitMs > 0 {
			return b.errorf("admission.slotWaitMs", "needs an in-flight limit (admission.maxInFlight not 0)")
		}
		a.SlotWait = time.Duration(*fa.SlotWaitMs) * time.Millisecond
	}
	if fa.MaxQueueMs != nil {
		if *fa.MaxQueueMs < 0 || *fa.MaxQueueMs >= MaxQueueLimit {
			return b.errorf("admission.maxQueueMs", "must be from 0 to %d (0: the store's own %d ms wait for a connection)", MaxQueueLimit-1, MaxQueueLimit)
		}
		a.MaxQueue = time.Duration(*fa.MaxQueueMs) * time.Millisecond
	}
	if fa.QueueTargetMs != nil {
		if *fa.QueueTargetMs < 0 || *fa.QueueTargetMs > MaxQueueTargetMs {
			return b.errorf("admission.queueTargetMs", "must be from 0 to %d (0 turns the check of the wait before admission off)", MaxQueueTargetMs)
		}
		a.QueueTarget = time.Duration(*fa.QueueTargetMs) * time.Millisecond
	}
	if fa.QueueIntervalMs != nil {
		if a.QueueTarget == 0 {
			return b.errorf("admission.queueIntervalMs", "needs admission.queueTargetMs")
		}
		if *fa.QueueIntervalMs <= int(a.QueueTarget.Milliseconds()) || *fa.QueueIntervalMs > MaxQueueIntervalMs {
			return b.errorf("admission.queueIntervalMs", "must be above admission.queueTargetMs (%d) and at most %d", a.QueueTarget.Milliseconds(), MaxQueueIntervalMs)
		}
		a.QueueInterval = time.Duration(*fa.QueueIntervalMs) * time.Millisecond
	} else if a.QueueTarget > 0 {
		a.QueueInterval = DefaultQueueInterval
		if a.QueueTarget >= a.QueueInterval {
			return b.errorf("admission.queueTargetMs", "must be below admission.queueIntervalMs (default %d)", DefaultQueueInterval.Milliseconds())
		}
	}
	a.MaxConnections = DefaultMaxConnections
	if fa.MaxConnections != nil {
		if *fa.MaxConnections < 0 || *fa.MaxConnections > MaxMaxConnections {
			return b.errorf("admission.maxConnections", "must be from 0 to %d (0: no cap)", MaxMaxConnections)
		}
		a.MaxConnections = *fa.MaxConnections
	}
	var err error
	if a.TenantRate, a.TenantBurst, err = b.bucket("admission.tenantRate", "admission.tenantBurst", fa.TenantRate, fa.TenantBurst, true); err != nil {
		return err
	}
	if a.GlobalRate, a.GlobalBurst, err = b.bucket("admission.globalRate", "admission.globalBurst", fa.GlobalRate, fa.GlobalBurst, true); err != nil {
		return err
	}
	if len(fa.Tenants) > 0 {
		a.Tenants = map[string]AdmissionBucket{}
		names := make([]string, 0, len(fa.Tenants))
		for name := range fa.Tenants {
			names = append(names, name)
		}
		sort.Strings(names) // the first bad entry is the same each start
		for _, name := range names {
			fb := fa.Tenants[name]
			prefix := "admission.tenants." + name
			if name == "" {
				return b.errorf("admission.tenants", "a tenant id must not be empty")
			}
			r, burst, err := b.bucket(prefix+".rate", prefix+".burst", fb.Rate, fb.Burst, false)
			if err != nil {
				return err
			}
			a.Tenants[name] = AdmissionBucket{Rate: r, Burst: burst}
		}
	}
	return nil
}

// bucket validates one token bucket's rate and burst: a rate of 0 turns
// it off when zeroOff, the burst needs a rate and defaults to twice it.
func (b *builder) bucket(rateName, burstName string, rate *float64, burst *int, zeroOff bool) (float64, int, error) {
	if rate == nil && !zeroOff {
		return 0, 0, b.errorf(rateName, "is required")
	}
	r := deref(rate, 0)
	switch {
	case zeroOff && r < 0:
		return 0, 0, b.errorf(rateName, "must be at least 0 (0 turns the limit off)")
	case !zeroOff && r <= 0:
		return 0, 0, b.errorf(rateName, "must be above 0")
	}
	if burst == nil {
		if r == 0 {
			return 0, 0, nil
		}
		return r, max(1, int(2*r)), nil
	}
	if r == 0 {
		return 0, 0, b.errorf(burstName, "needs %s", rateName)
	}
	if *burst < 1 {
		return 0, 0, b.errorf(burstName, "must be at least 1")
	}
	return r, *burst, nil
}
