package admission

import (
	"math"
	"sync"
	"time"
)

// waitLimit adapts the in-flight limit to the wait for a database
// connection (store.AcquireObserver), judged as CoDel judges a queue: by
// the shortest wait of an interval. The pool is where admitted calls
// queue; the limit decides how long that queue gets, so it moves on that
// queue alone. While some acquire of an interval is quick (within the
// target), no queue stands: the limit grows by a tenth, and so goes back
// to its ceiling once a burst has drained. When every acquire of two
// intervals in a row waited past the target, the second's shortest wait
// no shorter than the first's, a queue stands and is not draining: the
// limit is cut to the calls then in flight times target / shortest wait
// (at most halving), which shortens the queue to about the target. One
// interval is not enough (as in queue.go): a process short of CPU (a
// shared machine) holds its connections longer while it waits to run,
// and a burst after it was descheduled makes every acquire wait for a
// while; both drain by themselves, and cutting then refused calls at
// half load.
//
// The limit it replaces followed each call's whole latency (Gradient2 of
// Netflix's concurrency-limits). Under CPU saturation every call's
// latency rises, queue or not, so that limit sank to its floor (the
// pool's size) within 2 s and refused every call that found the pool
// busy for a moment, capping throughput at pool / latency
// (docs/benchmarks-notes.md, "Shedding only the excess"). A call's own
// latency is not what the limit can shorten; the wait for a connection
// is.
type waitLimit struct {
	min, max float64
	target   time.Duration

	mu      sync.Mutex
	limit   float64
	end     time.Time     // the current interval's end
	minWait time.Duration // the shortest acquire wait of the interval
	seen    bool          // an acquire ended in the interval
	busiest int           // the most calls in flight at an acquire of the interval
	prevMin time.Duration // the previous interval's shortest wait; 0: no queue stood in it
}

// acquireInterval is the interval over which a standing queue is judged:
// CoDel's 100 ms, long enough that a burst after a stall drains within it.
const acquireInterval = 100 * time.Millisecond

// growth is the share by which the limit grows after an interval without
// a standing queue; maxCut the most it is cut by after one with.
const (
	growth = 0.1
	maxCut = 0.5
)

// newWaitLimit starts at the ceiling: an idle process has no queue, and a
// burst is let in whole.
func newWaitLimit(lo, hi int, target time.Duration, now time.Time) *waitLimit {
	lo = max(1, min(lo, hi))
	return &waitLimit{min: float64(lo), max: float64(hi), target: target, limit: float64(hi), end: now.Add(acquireInterval)}
}

// current is the limit as a whole number of calls.
func (w *waitLimit) current() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(w.limit)
}

// acquired records one acquire that waited wait with inFlight calls in
// flight, and returns the limit after it.
func (w *waitLimit) acquired(now time.Time, wait time.Duration, inFlight int) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !now.Before(w.end) {
		w.closeInterval(now)
	}
	if !w.seen || wait < w.minWait {
		w.minWait = wait
	}
	w.seen = true
	w.busiest = max(w.busiest, inFlight)
	return int64(w.limit)
}

// closeInterval moves the limit after the interval that ended and starts
// the next.
func (w *waitLimit) closeInterval(now time.Time) {
	stood := w.seen && w.minWait > w.target
	switch {
	case !w.seen:
		// No acquire ended: an idle process, or every call stuck on
		// its connection or waiting for one. Either way, no news.
	case stood && w.prevMin > 0 && w.minWait >= w.prevMin:
		used := math.Min(w.limit, float64(w.busiest))
		cut := math.Max(maxCut, float64(w.target)/float64(w.minWait))
		w.limit = math.Max(w.min, math.Min(w.limit, used*cut))
	case !stood:
		w.limit = math.Min(w.max, w.limit+math.Max(1, w.limit*growth))
	}
	w.prevMin = 0
	if stood {
		w.prevMin = w.minWait
	}
	w.seen, w.minWait, w.busiest = false, 0, 0
	w.end = w.end.Add(acquireInterval)
	if !now.Before(w.end) {
		w.end = now.Add(acquireInterval) // the intervals between saw no acquire
		w.prevMin = 0
	}
}
