package admission

import (
	"sync"
	"time"
)

// queueCheck refuses calls that waited too long before admission, in the
// manner of CoDel (Nichols and Jacobson) as servers use it for requests
// (the "adaptive" queue timeout of Facebook's "Fail at Scale"). A call's
// sojourn is the time from its arrival on its socket (Arrived) to its
// admission: time in the socket buffer and waiting for the CPU, which no
// in-flight limit can shorten, since every arrival costs its read and its
// answer whether served or refused.
//
// The check has two modes. Normally only a call that waited longer than
// the interval is refused: a burst or a stall (a collection, the thread
// descheduled) makes a queue that drains by itself, and refusing then would
// shed calls the server can serve. Once the queue has stood for a whole
// interval (its shortest sojourn in the interval above the target) the
// server is overloaded: from then on a call that waited longer than the
// target is refused. Refusing is cheaper than serving, so the standing
// queue drains within milliseconds and the calls served are the ones that
// arrived last (with a FIFO queue in front, refusing the stale ones is
// serving the newest: adaptive LIFO's effect). It stays overloaded until an
// interval passes in which no call waited longer than the target.
//
// A call is never refused for its wait while nothing is in flight: then
// the server is not serving anything (its CPU goes to reading and
// refusing), and refusing could only starve it, as a fixed bound on the
// wait did on a machine short of CPU (every call waited past it, 99 % were
// refused and the queue never drained).
type queueCheck struct {
	target, interval time.Duration

	mu         sync.Mutex
	end        time.Time     // the current interval's end
	minSojourn time.Duration // the shortest sojourn in the current interval
	above      bool          // a call in the current interval waited longer than target
	seen       bool          // a call arrived in the current interval
	overloaded bool
}

func newQueueCheck(target, interval time.Duration, now time.Time) *queueCheck {
	return &queueCheck{target: target, interval: interval, end: now.Add(interval)}
}

// admit records a call that waited sojourn before admission and reports
// the longest wait allowed now and whether this call is within it.
// busy is whether another call is in flight.
func (q *queueCheck) admit(now time.Time, sojourn time.Duration, busy bool) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !now.Before(q.end) {
		q.closeInterval(now)
	}
	if !q.seen || sojourn < q.minSojourn {
		q.minSojourn = sojourn
	}
	q.seen = true
	q.above = q.above || sojourn > q.target
	bound := q.interval
	if q.overloaded {
		bound = q.target
	}
	return bound, sojourn <= bound || !busy
}

// closeInterval judges the interval that ended and starts the next.
func (q *queueCheck) closeInterval(now time.Time) {
	switch {
	case !q.overloaded && q.seen && q.minSojourn > q.target:
		q.overloaded = true // a queue stood for the whole interval
	case q.overloaded && !q.above:
		q.overloaded = false // no call waited past the target: drained
	}
	q.seen, q.above, q.minSojourn = false, false, 0
	q.end = q.end.Add(q.interval)
	if !now.Before(q.end) {
		// A whole interval without a call: no queue stood.
		q.overloaded = false
		q.end = now.Add(q.interval)
	}
}

// isOverloaded reports the mode, for tests and metrics.
func (q *queueCheck) isOverloaded() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.overloaded
}
