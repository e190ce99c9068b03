package admission

import (
	"math"
	"sync"
	"time"
)

// gradient adapts the in-flight limit to latency, in the manner of the
// Gradient2 limiter of Netflix's concurrency-limits: it compares the
// average latency of the last window of calls (short) with a slow
// exponential average of those windows (long, the latency the process
// has when it is not queueing). While short stays within tolerance x long
// the limit grows by a small queue allowance; past it the limit shrinks
// by the ratio (at most halving per window), smoothed so that one noisy
// window moves it little. A call shed for waiting on the database pool
// past the queue bound is a drop: the limit shrinks by 10 % at once.
//
// The limit only grows while it is used (at least half of it in flight
// during the window): an idle process learns nothing about its capacity.
type gradient struct {
	mu        sync.Mutex
	min, max  float64
	tolerance float64
	limit     float64
	long      float64 // exponential average of window latencies, in seconds
	windows   int     // windows seen, for the average's warm-up

	// The window being filled.
	winStart    time.Time
	winSum      time.Duration
	winN        int
	winDrop     bool
	winInFlight int // the most calls in flight seen in the window
}

const (
	// A window closes once it holds minWindowCalls calls and lasted
	// minWindowTime: a few hundred calls under load, enough to average.
	minWindowCalls = 10
	minWindowTime  = 100 * time.Millisecond
	// warmupWindows start the baseline with their quickest.
	warmupWindows = 10
	// longWindows is the memory of the long average (about a minute of
	// 100 ms windows under load).
	longWindows = 600
	// smoothing is the weight of a window's new limit.
	smoothing = 0.2
	// dropFactor shrinks the limit after a window with a drop.
	dropFactor = 0.9
)

func newGradient(lo, hi int, tolerance float64, now time.Time) *gradient {
	lo = max(1, min(lo, hi))
	return &gradient{
		min: float64(lo), max: float64(hi), tolerance: tolerance,
		// Start between floor and ceiling: the first windows move it.
		limit:    math.Max(float64(lo), float64(hi)/2),
		winStart: now,
	}
}

// current is the limit as a whole number of calls.
func (g *gradient) current() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return int64(g.limit)
}

// sample records one call that took rtt with inFlight calls in flight
// (itself included) when it left, and returns the limit after it.
func (g *gradient) sample(now time.Time, rtt time.Duration, inFlight int, dropped bool) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.winSum += rtt
	g.winN++
	g.winDrop = g.winDrop || dropped
	g.winInFlight = max(g.winInFlight, inFlight)
	if g.winN >= minWindowCalls && now.Sub(g.winStart) >= minWindowTime {
		g.update(g.winSum.Seconds()/float64(g.winN), g.winInFlight, g.winDrop)
		g.winStart, g.winSum, g.winN, g.winDrop, g.winInFlight = now, 0, 0, false, 0
	}
	return int64(g.limit)
}

// update moves the limit after a window whose average latency was short
// seconds.
func (g *gradient) update(short float64, inFlight int, dropped bool) {
	g.windows++
	switch {
	case g.windows == 1:
		g.long = short
	case g.windows <= warmupWindows:
		g.long = math.Min(g.long, short) // the quickest window to start: no queue in it
	case short <= g.tolerance*g.long:
		g.long += (short - g.long) / longWindows
	default:
		// A congested window teaches the baseline little: it follows a
		// lasting change (a slower machine, a larger table) over minutes,
		// not the queue the limit is there to keep short.
		g.long += (short - g.long) / (10 * longWindows)
	}
	// After a latency drop (the queue drained, a slow dependency came
	// back) the baseline would lag: let it follow fast.
	if g.long/short > 2 {
		g.long *= 0.95
	}
	if dropped {
		g.limit = math.Max(g.min, g.limit*dropFactor)
		return
	}
	if float64(inFlight) < g.limit/2 {
		return // not used: no signal
	}
	ratio := math.Max(0.5, math.Min(1, g.tolerance*g.long/short))
	queue := math.Max(1, math.Sqrt(g.limit)) // room to grow, larger for larger limits
	next := g.limit*ratio + queue
	g.limit = math.Min(g.max, math.Max(g.min, g.limit*(1-smoothing)+next*smoothing))
}
