package admission

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testTarget   = 5 * time.Millisecond
	testInterval = 100 * time.Millisecond
)

// A burst or a stall makes calls wait past the target, but not for a whole
// interval: nothing is refused under the interval's bound.
func TestQueueCheckToleratesAQueueThatDrains(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQueueCheck(testTarget, testInterval, now)
	for i := range 300 { // three intervals: a 40 ms wait, then none, in turn
		now = now.Add(time.Millisecond)
		sojourn := 40 * time.Millisecond
		if i%50 == 49 {
			sojourn = time.Millisecond
		}
		bound, ok := q.admit(now, sojourn, true)
		require.True(t, ok, "call %d", i)
		assert.Equal(t, testInterval, bound)
	}
	assert.False(t, q.isOverloaded())
	// Past the interval a call is refused even so.
	_, ok := q.admit(now, testInterval+time.Millisecond, true)
	assert.False(t, ok)
}

// A queue that stands for a whole interval tightens the bound to the
// target; the mode lasts while calls still wait past the target and ends
// after an interval in which none did.
func TestQueueCheckTightensOnAStandingQueueUntilItDrains(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQueueCheck(testTarget, testInterval, now)
	step := func(sojourn time.Duration, busy bool) (time.Duration, bool) {
		now = now.Add(time.Millisecond)
		return q.admit(now, sojourn, busy)
	}
	for range 99 { // one interval, every call waiting 20 ms
		_, ok := step(20*time.Millisecond, true)
		require.True(t, ok)
	}
	bound, ok := step(20*time.Millisecond, true) // the interval closed
	assert.True(t, q.isOverloaded())
	assert.Equal(t, testTarget, bound)
	assert.False(t, ok, "past the target once overloaded")
	_, ok = step(3*time.Millisecond, true)
	assert.True(t, ok, "within the target")
	_, ok = step(20*time.Millisecond, false)
	assert.True(t, ok, "never refused while nothing is in flight")
	for range 150 { // calls still waiting past the target in this interval
		step(6*time.Millisecond, true)
	}
	assert.True(t, q.isOverloaded(), "calls waited past the target in the last interval")
	for range 200 { // two intervals within the target
		_, ok = step(2*time.Millisecond, true)
		require.True(t, ok)
	}
	assert.False(t, q.isOverloaded(), "an interval without a call past the target ends it")
	bound, ok = step(20*time.Millisecond, true)
	assert.True(t, ok)
	assert.Equal(t, testInterval, bound)
}

// An idle spell (no call for several intervals) ends the overloaded mode
// and starts a fresh interval.
func TestQueueCheckIdleSpellEndsOverload(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQueueCheck(testTarget, testInterval, now)
	for range 101 {
		now = now.Add(time.Millisecond)
		q.admit(now, 30*time.Millisecond, true)
	}
	require.True(t, q.isOverloaded())
	now = now.Add(time.Second)
	_, ok := q.admit(now, 30*time.Millisecond, true)
	assert.True(t, ok)
	assert.False(t, q.isOverloaded())
	assert.Equal(t, now.Add(testInterval), q.end)
}

// queueSim is a single-server FIFO queue driven at a fixed arrival rate:
// each call costs serve to serve and refuse to refuse (a refused call
// still costs its read and its answer). It returns the fraction of the
// server's capacity served as goodput and the sojourns of the calls served,
// after the first second.
func queueSim(q *queueCheck, start time.Time, load float64, serve, refuse time.Duration, d time.Duration) (goodput float64, sojourns []time.Duration) {
	gap := time.Duration(float64(serve) / load)
	clock := start // the server's time
	next := start  // the next arrival
	var queue []time.Time
	served := 0
	for clock.Sub(start) < d {
		for !next.After(clock) {
			queue = append(queue, next)
			next = next.Add(gap)
		}
		if len(queue) == 0 {
			clock = next
			continue
		}
		arrived := queue[0]
		queue = queue[1:]
		_, ok := q.admit(clock, clock.Sub(arrived), true)
		if !ok {
			clock = clock.Add(refuse)
			continue
		}
		if clock.Sub(start) >= time.Second {
			served++
			sojourns = append(sojourns, clock.Sub(arrived))
		}
		clock = clock.Add(serve)
	}
	capacity := float64(d-time.Second) / float64(serve)
	return float64(served) / capacity, sojourns
}

// At 150 % of the capacity, with refusals costing a seventh of a call
// served, the check keeps the calls served within the target (no
// oscillation between draining and a queue of an interval) and refuses no
// more than the overload: goodput is what the refusals' cost leaves,
// (1 - 1.5 x refuse/serve) / (1 - refuse/serve) of the capacity. Without
// the check (a bound of a whole interval) the calls served wait about the
// interval.
func TestQueueCheckAt150PercentServesTheNewestWithinTheTarget(t *testing.T) {
	start := time.Unix(1000, 0)
	serve, refuse := 134*time.Microsecond, 19*time.Microsecond // 7,450/s; a refusal a seventh of that
	goodput, sojourns := queueSim(newQueueCheck(testTarget, testInterval, start), start, 1.5, serve, refuse, 5*time.Second)
	x := float64(refuse) / float64(serve)
	assert.InDelta(t, (1-1.5*x)/(1-x), goodput, 0.02)
	assert.GreaterOrEqual(t, goodput, 0.9)
	slices.Sort(sojourns)
	assert.LessOrEqual(t, sojourns[len(sojourns)*99/100], testTarget)

	// The wide bound alone (a target as long as the interval).
	goodput, sojourns = queueSim(newQueueCheck(testInterval, testInterval, start), start, 1.5, serve, refuse, 5*time.Second)
	assert.InDelta(t, (1-1.5*x)/(1-x), goodput, 0.02)
	slices.Sort(sojourns)
	assert.Greater(t, sojourns[len(sojourns)/2], 90*time.Millisecond)
}

// At half the capacity the queue never stands: nothing is refused.
func TestQueueCheckAtHalfLoadRefusesNothing(t *testing.T) {
	start := time.Unix(1000, 0)
	serve := 134 * time.Microsecond
	goodput, _ := queueSim(newQueueCheck(testTarget, testInterval, start), start, 0.5, serve, serve/7, 3*time.Second)
	assert.InDelta(t, 0.5, goodput, 0.01)
}

// The controller refuses a call that waited past the bound with
// RATE_LIMITED and a retry hint, holding no slot, also without an
// in-flight limit; with the check on, the adaptive limit times an admitted
// call from its admission, not its arrival.
func TestControllerRefusesCallsThatWaitedPastTheBound(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{QueueTarget: testTarget})
	c.now = func() time.Time { return now }
	c.queue = newQueueCheck(testTarget, DefaultQueueInterval, now)
	first, err := c.EnterAt(now.Add(-time.Second))
	require.NoError(t, err, "nothing in flight: admitted whatever its wait")
	assert.Equal(t, 1, c.InFlight())
	_, err = c.EnterAt(now.Add(-time.Second))
	requireLimited(t, err, InFlightRetryAfter.Milliseconds())
	assert.Contains(t, err.Error(), "100 ms")
	assert.Equal(t, 1, c.InFlight(), "a refused call holds no slot")
	second, err := c.EnterAt(now.Add(-50 * time.Millisecond))
	require.NoError(t, err)
	c.Leave(first, nil)
	c.Leave(second, nil)
	assert.Zero(t, c.InFlight())

	a := New(Limits{MaxInFlight: 16, Adaptive: true, MinInFlight: 2, QueueTarget: testTarget})
	a.now = func() time.Time { return now }
	tk, err := a.EnterAt(now.Add(-40 * time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, now, tk.start)
	b := New(Limits{MaxInFlight: 16, Adaptive: true, MinInFlight: 2})
	b.now = func() time.Time { return now }
	tk, err = b.EnterAt(now.Add(-40 * time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, now.Add(-40*time.Millisecond), tk.start, "without the check: from arrival")
}
