package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runSearch drives a peakSearch against a server model: serve(rate, try)
// is the result of the try-th step at rate (0 first). It returns the rates
// tried in order and the search.
func runSearch(t *testing.T, from float64, serve func(rate float64, try int) Result) ([]float64, *peakSearch) {
	t.Helper()
	s := newPeakSearch(from, 1.25, 2, 100*time.Millisecond)
	var rates []float64
	tries := map[float64]int{}
	for r, ok := s.next(); ok; r, ok = s.next() {
		rates = append(rates, r)
		res := serve(r, tries[r])
		tries[r]++
		s.observe(res)
		require.Less(t, len(rates), 100, "the search must end")
	}
	return rates, s
}

// capacity serves every rate up to c whole with a short p99, and above it
// c with a p99 past the bound (a queue).
func capacity(c float64) func(float64, int) Result {
	return func(r float64, _ int) Result {
		if r <= c {
			return Result{PerSecond: r, P99Ms: 2}
		}
		return Result{PerSecond: c, P99Ms: 900}
	}
}

func TestSearchStepsWhileSustainedThenBisects(t *testing.T) {
	rates, s := runSearch(t, 1000, capacity(2100))
	// 1000, 1250, 1562.5, 1953.125 sustained; 2441.4 fails twice; then
	// two bisections: 2197.3 fails twice, 2075.2 holds.
	assert.InDeltaSlice(t, []float64{1000, 1250, 1562.5, 1953.125, 2441.40625, 2441.40625, 2197.265625, 2197.265625, 2075.1953125}, rates, 0.01)
	assert.InDelta(t, 2075.2, s.best, 0.1)
	assert.InDelta(t, 2075.2, s.good, 0.1)
	assert.InDelta(t, 2197.3, s.bad, 0.1)
}

func TestOneStallDoesNotEndTheSearch(t *testing.T) {
	// The first try at 1562.5 is a stall of the machine (p99 past the
	// bound, goodput short); its second try holds, so stepping goes on.
	c := capacity(3000)
	rates, s := runSearch(t, 1000, func(r float64, try int) Result {
		if r == 1562.5 && try == 0 {
			return Result{PerSecond: 1200, P99Ms: 400}
		}
		return c(r, try)
	})
	assert.Equal(t, []float64{1000, 1250, 1562.5, 1562.5, 1953.125}, rates[:5])
	assert.Greater(t, s.best, 2500.0, "the peak found is past the stall")
	assert.LessOrEqual(t, s.best, 3000.0)
}

func TestGoodputShortOfTheRateIsNotSustained(t *testing.T) {
	// p99 within the bound, but only 90 % of the calls served (the rest
	// late or errors): that rate is past the peak, whatever the latency.
	rates, s := runSearch(t, 1000, func(r float64, _ int) Result {
		if r <= 1300 {
			return Result{PerSecond: r, P99Ms: 3}
		}
		return Result{PerSecond: 0.9 * r, P99Ms: 3}
	})
	assert.Equal(t, 1562.5, rates[3], "1562.5 is tried again")
	assert.InDelta(t, 1250, s.good, 0.01)
	assert.Less(t, s.best, 1300.0)
	// A goodput just under the rate (the step's last answers past its
	// window) still counts as sustained.
	assert.True(t, s.sustained(1000, Result{PerSecond: 975, P99Ms: 3}))
	assert.False(t, s.sustained(1000, Result{PerSecond: 960, P99Ms: 3}))
	assert.False(t, s.sustained(1000, Result{PerSecond: 1000, P99Ms: 101}))
}

func TestAFailedFirstRateBisectsBelowIt(t *testing.T) {
	rates, s := runSearch(t, 1000, capacity(600))
	assert.Equal(t, []float64{1000, 1000, 500, 750, 750}, rates)
	assert.InDelta(t, 500, s.best, 0.01)
}

func TestTheSearchIsBoundedInSteps(t *testing.T) {
	rates, _ := runSearch(t, 1000, func(r float64, _ int) Result { return Result{PerSecond: r, P99Ms: 1} })
	assert.Len(t, rates, maxSearchSteps)
}
