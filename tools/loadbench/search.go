package main

import (
	"fmt"
	"time"
)

// Sustained-peak search. A rate is sustained when the server answered at
// least sustainedShare of it within the step (goodput, not calls sent) and
// p99 stayed within the bound. The search steps the rate up while it is
// sustained, tries a failing rate once more before it counts (one stall of
// a shared machine must not end the search), then bisects between the last
// sustained rate and the first that was not. Only the decisions are here
// (peakSearch, pure, unit-tested); searchPeak runs the steps.

// sustainedShare is how much of the rate asked must be served: a little
// under 1, since a step's last calls may answer just past its window.
const sustainedShare = 0.97

// maxSearchSteps bounds a search's run time whatever the server does.
const maxSearchSteps = 40

// peakSearch decides the rate of each step from the results of the ones
// before.
type peakSearch struct {
	step       float64 // the factor between rates while stepping
	bisections int     // rates tried between good and bad once stepping ends
	boundMs    float64 // p99 bound
	// good is the highest rate sustained (0: none yet), bad the lowest
	// one that failed twice (0: none yet).
	good, bad float64
	rate      float64 // the rate to try next
	failedAt  float64 // rate that failed once and is being tried again (0: none)
	bisected  int
	steps     int
	best      float64 // highest goodput of a sustained step
}

func newPeakSearch(from, step float64, bisections int, bound time.Duration) *peakSearch {
	return &peakSearch{step: step, bisections: bisections, boundMs: float64(bound.Microseconds()) / 1000, rate: from}
}

// sustained reports whether res, a step at rate, kept up with it.
func (s *peakSearch) sustained(rate float64, res Result) bool {
	return res.PerSecond >= sustainedShare*rate && res.P99Ms <= s.boundMs
}

// next is the rate to try now; ok false once the search is over.
func (s *peakSearch) next() (float64, bool) {
	if s.steps >= maxSearchSteps {
		return 0, false
	}
	return s.rate, s.rate > 0
}

// observe takes the result of a step at the rate next gave.
func (s *peakSearch) observe(res Result) {
	s.steps++
	r := s.rate
	if s.sustained(r, res) {
		s.failedAt = 0
		s.good = max(s.good, r)
		s.best = max(s.best, res.PerSecond)
	} else if s.failedAt != r {
		s.failedAt = r // once more before it counts
		return
	} else {
		s.failedAt = 0
		if s.bad == 0 || r < s.bad {
			s.bad = r
		}
	}
	switch {
	case s.bad == 0:
		s.rate = r * s.step // still stepping
	case s.bisected < s.bisections:
		s.bisected++
		s.rate = (s.good + s.bad) / 2
	default:
		s.rate = 0
	}
}

// searchPeak finds the server's sustained open-loop peak (peakSearch),
// each step run for d after the previous one's answers are all in. The
// result is the sustained step with the highest goodput, with every step
// in Steps.
func (g *generator) searchPeak(from, step float64, d, bound time.Duration) Result {
	const bisections = 2
	s := newPeakSearch(from, step, bisections, bound)
	var best Result
	var steps []Result
	cpu0 := cpuTime()
	g.openLoop(from, time.Second, false) // warm-up
	for r, ok := s.next(); ok; r, ok = s.next() {
		res := g.openLoop(r, d, false)
		steps = append(steps, res)
		sustained := s.sustained(r, res)
		if sustained && res.PerSecond > best.PerSecond {
			best = res
		}
		s.observe(res)
		if !sustained {
			// A step the server could not keep up with leaves up to
			// maxConns connections open on both sides, and the server
			// paying for each (its goroutine, its buffers, the
			// collector's mark): the next, lower step would measure a
			// server burdened by the overload before it, where each
			// run the peak is used for starts from a fresh generator
			// (2026-11-29: after a step that opened 4,096, two steps at
			// 10,133/s served 9,319 and 8,893/s where 10,729/s had been
			// served whole). Start again from no connection, warmed up
			// at the highest rate sustained so far.
			g.closeConns()
			g.openLoop(max(from, best.PerSecond), time.Second, false)
		}
	}
	var sent int64
	for _, st := range steps {
		sent += st.sent()
	}
	best.CPUUsPerCall = float64((cpuTime() - cpu0).Microseconds()) / float64(max(1, sent))
	best.Steps = steps
	best.P99BoundMs = s.boundMs
	best.PeakMethod = fmt.Sprintf("open-loop search for the sustained peak: from %.0f/s, x%.2f per %s step while sustained "+
		"(goodput at least %.2f of the rate asked and p99 within %s; a step that fails is tried once more before it counts, "+
		"and after it every connection is closed and the generator warmed up again for 1 s at the best rate sustained), "+
		"then %d bisections between the last sustained rate and the first not; peak = best goodput of a sustained step, %d steps",
		from, step, d, sustainedShare, bound, bisections, len(steps))
	return best
}
