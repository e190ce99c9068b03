package admission

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The limit starts at its ceiling, is cut after two intervals in a row in
// which every acquire waited past the target, the second's shortest wait
// no shorter (to the calls in flight times target / shortest wait, at
// most halving), never below the floor, is left alone while such a queue
// drains, and grows back by a tenth per interval once some acquire is
// quick again.
func TestWaitLimitFollowsAStandingQueueAtThePool(t *testing.T) {
	now := time.Unix(1000, 0)
	// Intervals end at 101 ms, 201 ms...: the first call of each
	// interval below (1 ms steps) closes the one before.
	w := newWaitLimit(8, 256, 2*time.Millisecond, now.Add(time.Millisecond))
	assert.Equal(t, int64(256), w.current(), "starts at the ceiling")
	interval := func(wait time.Duration, inFlight int) int64 {
		var l int64
		for range 100 {
			now = now.Add(time.Millisecond)
			l = w.acquired(now, wait, inFlight)
		}
		return l
	}
	// Waits past the target all interval long, 100 calls in flight.
	interval(3*time.Millisecond, 100)
	assert.Equal(t, int64(256), interval(3*time.Millisecond, 100), "one standing interval is not enough")
	// The second: cut to 100 x 2/3.
	assert.InDelta(t, 66, interval(3*time.Millisecond, 60), 1)
	// The same wait, 60 in flight: 60 x 2/3; then a long wait: halved.
	assert.InDelta(t, 40, interval(40*time.Millisecond, 60), 1)
	assert.InDelta(t, 20, interval(30*time.Millisecond, 60), 1)
	// A queue that stands but drains (each interval's shortest wait
	// shorter than the one before) is left to drain.
	assert.InDelta(t, 20, interval(20*time.Millisecond, 60), 1)
	assert.InDelta(t, 20, interval(10*time.Millisecond, 60), 1)
	for range 20 {
		interval(40*time.Millisecond, int(w.current()))
	}
	assert.Equal(t, int64(8), w.current(), "not below the floor")
	// One quick acquire per interval: no queue stood; the limit grows.
	for range 6 {
		for i := range 100 {
			now = now.Add(time.Millisecond)
			wait := 40 * time.Millisecond
			if i == 50 {
				wait = 0
			}
			w.acquired(now, wait, 8)
		}
	}
	assert.Equal(t, int64(13), w.current(), "a queue that drains within an interval does not cut: five intervals grow 8 by 1 (at least), 1, 1, a tenth, a tenth")
	for range 100 {
		interval(0, 8)
	}
	assert.Equal(t, int64(256), w.current(), "back to the ceiling, not past it")
}

// poolSim is a deterministic model of an api process in front of its pool: a
// single reader takes each call off its socket (read each, refused or
// not), now and then descheduled for a stall (nothing is read, and the
// calls that arrived meanwhile are read at once after it); an admitted
// call waits for one of conns connections, first come first served, for
// at most maxQueue (then it is shed), and holds it for hold. The
// controller sees what the api process gives it: Enter and Leave, and the
// wait of each acquire (Acquired). Time is the controller's clock.
type poolSim struct {
	rate       float64       // calls arriving per second, evenly spaced
	conns      int           // the pool
	hold       time.Duration // one call's hold of its connection
	read       time.Duration // reading one call (or refusing it)
	stallEvery time.Duration // 0: no stalls
	stall      time.Duration
	maxQueue   time.Duration
	run        time.Duration
	warmup     time.Duration // the calls arriving in it are not in p99
}

type poolSimResult struct {
	arrived, refused, shed, served int
	p99                            time.Duration // arrival to answer, of the calls served after the warm-up
}

// capacity is the calls per second the pool serves.
func (s poolSim) capacity() float64 { return float64(s.conns) / s.hold.Seconds() }

func (s poolSim) runWith(c *Controller) poolSimResult {
	base := c.now() // New started the limit's first interval on it
	var now time.Duration
	c.now = func() time.Time { return base.Add(now) }
	type call struct {
		arrived, admitted time.Duration
		ticket            Ticket
	}
	var (
		res      poolSimResult
		waiting  []call // admitted, waiting for a connection
		holding  []call // holding one, in order of release
		releases []time.Duration
		free     = s.conns
		sojourns []time.Duration
		readyAt  time.Duration
	)
	take := func(at time.Duration, k call) {
		now = at
		c.Acquired(at - k.admitted)
		free--
		holding = append(holding, k)
		releases = append(releases, at+s.hold)
	}
	// advance runs the pool up to t: releases and the queue bound's sheds,
	// in time order.
	advance := func(t time.Duration) {
		for {
			next, shedNext := time.Duration(-1), false
			if len(releases) > 0 {
				next = releases[0]
			}
			if len(waiting) > 0 {
				if d := waiting[0].admitted + s.maxQueue; next < 0 || d < next {
					next, shedNext = d, true
				}
			}
			if next < 0 || next > t {
				return
			}
			now = next
			if shedNext {
				k := waiting[0]
				waiting = waiting[1:]
				c.Acquired(s.maxQueue)
				c.Leave(k.ticket)
				res.shed++
				continue
			}
			k := holding[0]
			holding, releases = holding[1:], releases[1:]
			c.Leave(k.ticket)
			res.served++
			if k.arrived >= s.warmup {
				sojourns = append(sojourns, now-k.arrived)
			}
			free++
			if len(waiting) > 0 {
				k, waiting = waiting[0], waiting[1:]
				take(now, k)
			}
		}
	}
	gap := time.Duration(float64(time.Second) / s.rate)
	for at := time.Duration(0); at < s.run; at += gap {
		res.arrived++
		p := max(at, readyAt)
		if s.stallEvery > 0 {
			if into := p % s.stallEvery; into < s.stall {
				p += s.stall - into
			}
		}
		readyAt = p + s.read
		advance(p)
		now = p
		tk, err := c.Enter()
		if err != nil {
			res.refused++
			continue
		}
		k := call{arrived: at, admitted: p, ticket: tk}
		if free > 0 && len(waiting) == 0 {
			take(p, k)
		} else {
			waiting = append(waiting, k)
		}
	}
	advance(s.run + time.Hour)
	slices.Sort(sojourns)
	if len(sojourns) > 0 {
		res.p99 = sojourns[len(sojourns)*99/100]
	}
	return res
}

// simLimits is the adaptive limit as the api sets it up over a pool of 8
// (config.AdaptiveInFlightPerConn, the pool's size as the floor).
func simLimits() Limits {
	return Limits{MaxInFlight: 512, MinInFlight: 8, Adaptive: true, AcquireTarget: DefaultAcquireTarget}
}

// A pool of 8 serving 8,000 calls/s, a call read in 40 µs, 20 s after
// 2 s of warm-up (as scripts/bench.sh's open-loop runs).
func baseSim(share float64) poolSim {
	s := poolSim{conns: 8, hold: time.Millisecond, read: 40 * time.Microsecond, maxQueue: 100 * time.Millisecond, run: 20 * time.Second, warmup: 2 * time.Second}
	s.rate = share * s.capacity()
	return s
}

// Below capacity nothing is refused or shed, even when the process is
// descheduled for 80 ms every second (the burst read after each stall
// waits up to 40 ms for a connection, for less than an interval) or for
// 10 ms every 200 ms at 80 % of capacity.
func TestWaitLimitRefusesNothingBelowCapacity(t *testing.T) {
	stalled := baseSim(0.5)
	stalled.stallEvery, stalled.stall = time.Second, 80*time.Millisecond
	busy := baseSim(0.8)
	busy.stallEvery, busy.stall = 200*time.Millisecond, 10*time.Millisecond
	for name, s := range map[string]poolSim{"half load": baseSim(0.5), "half load, stalls": stalled, "90 %": baseSim(0.9), "80 %, stalls": busy} {
		t.Run(name, func(t *testing.T) {
			r := s.runWith(New(simLimits()))
			assert.Zero(t, r.refused, "refused")
			assert.Zero(t, r.shed, "shed at the queue bound")
			assert.Equal(t, r.arrived, r.served)
		})
	}
}

// At 150 % of capacity the limit refuses the excess and no more: the pool
// serves at least 0.95 of its capacity, the calls served after the
// warm-up wait a few targets at most (p99 within 20 ms, four times what
// the bench's half-load p99 is held to, plus a stall's length when the
// process stalls), and hardly any call reaches the queue bound.
func TestWaitLimitShedsTheExcessAboveCapacity(t *testing.T) {
	stalled := baseSim(1.5)
	stalled.stallEvery, stalled.stall = time.Second, 30*time.Millisecond
	for name, s := range map[string]poolSim{"150 %": baseSim(1.5), "150 %, stalls": stalled, "300 %": baseSim(3)} {
		t.Run(name, func(t *testing.T) {
			r := s.runWith(New(simLimits()))
			goodput := float64(r.served) / s.run.Seconds() / s.capacity()
			t.Logf("goodput %.3f of capacity, p99 %v, refused %d, shed %d of %d", goodput, r.p99, r.refused, r.shed, r.arrived)
			assert.GreaterOrEqual(t, goodput, 0.95)
			assert.LessOrEqual(t, r.p99, 20*time.Millisecond+s.stall, "a call read after a stall waited through it")
			assert.Less(t, r.shed, r.arrived/1000, "the limit refuses before the queue bound sheds")
		})
	}
}
