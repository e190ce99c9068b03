package admission

import (
	"sync"
	"time"
)

// queueCheck refuses calls that waited too long before admission, but only
// as many as the server cannot serve. A call's sojourn is the time from
// its arrival on its socket (Arrived) to its admission: time in the socket
// buffer and waiting for the CPU, which no in-flight limit can shorten.
//
// Whether a queue stands is judged as CoDel (Nichols and Jacobson) does:
// by the shortest sojourn of an interval. A burst, a collection or the
// process descheduled for a few milliseconds makes calls wait, but the
// server catches up within the interval and some call in it waits less
// than the target; only a server that cannot keep up keeps every call of
// an interval waiting past the target.
//
// How many calls are refused follows that judgement, in the manner of
// PIE's drop probability (RFC 8033): a share of the calls that waited past
// the target is refused, raised after each interval in which a queue
// stood (more for a longer queue) and lowered after each in which none
// did. A call within the target is never refused. So at a lasting
// overload the share settles where the refusals, whose reads and answers
// cost CPU too, leave the server exactly the calls it can serve, with a
// queue of about the target; at half load, with the process descheduled
// now and then, the share stays 0 and nothing is refused. The first law
// refused every call past the target once a queue had stood one interval
// (and every call past the interval always): a stall of 80 ms at half load
// was enough (docs/benchmarks-notes.md, "Shedding only the excess").
//
// A call is never refused for its wait while nothing is in flight: then
// the server is not serving anything (its CPU goes to reading and
// refusing), and refusing could only starve it.
type queueCheck struct {
	target, interval time.Duration

	mu         sync.Mutex
	end        time.Time     // the current interval's end
	minSojourn time.Duration // the shortest sojourn in the current interval
	seen       bool          // a call arrived in the current interval
	prevMin    time.Duration // the previous interval's shortest sojourn; 0: no queue stood in it
	share      float64       // of the calls past the target, the share refused
	credit     float64       // refusals owed: share added per call past the target
}

// The share's steps per interval: up by shareRaise times how many targets
// the queue stood past the target (at most maxRaiseSteps of them: a share
// of 1 within about a second of a heavy overload), down by shareLower.
// Lowering is slow on purpose: a share too high for the load refuses
// nothing once the queue is within the target, while one lowered too fast
// lets the queue stand again.
const (
	shareRaise    = 0.05
	maxRaiseSteps = 4
	shareLower    = 0.05
)

func newQueueCheck(target, interval time.Duration, now time.Time) *queueCheck {
	return &queueCheck{target: target, interval: interval, end: now.Add(interval)}
}

// admit records a call that waited sojourn before admission and reports
// the wait past which calls are refused now and whether this call is
// admitted. busy is whether another call is in flight.
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
	if sojourn <= q.target || q.share == 0 {
		return q.target, true
	}
	q.credit += q.share
	if q.credit < 1 || !busy {
		return q.target, true
	}
	q.credit--
	return q.target, false
}

// closeInterval judges the interval that ended and starts the next. The
// share rises only after two intervals in a row in which a queue stood,
// the second's no shorter than the first's: a stall at half load (the
// process descheduled for 80 ms) leaves a queue that stands for about one
// interval and drains, and a share already high enough drains the queue
// too; in both, raising it would refuse calls the server can serve.
func (q *queueCheck) closeInterval(now time.Time) {
	stood := q.seen && q.minSojourn > q.target
	switch {
	case stood && q.prevMin > 0 && q.minSojourn >= q.prevMin:
		steps := min(float64(q.minSojourn-q.target)/float64(q.target), maxRaiseSteps)
		q.share = min(1, q.share+shareRaise*max(steps, 1))
	case !stood:
		q.share = max(0, q.share-shareLower)
	}
	q.prevMin = 0
	if stood {
		q.prevMin = q.minSojourn
	}
	if q.share == 0 {
		q.credit = 0
	}
	q.seen, q.minSojourn = false, 0
	q.end = q.end.Add(q.interval)
	if !now.Before(q.end) {
		// A whole interval without a call: no queue stood.
		q.share, q.credit, q.prevMin = 0, 0, 0
		q.end = now.Add(q.interval)
	}
}

// isOverloaded reports whether calls past the target are being refused.
func (q *queueCheck) isOverloaded() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.share > 0
}

// refusedShare is the share of the calls past the target refused now.
func (q *queueCheck) refusedShare() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.share
}
