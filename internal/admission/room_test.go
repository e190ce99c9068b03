package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeTimers lets a test decide when a slot wait passes: every wait's
// channel is kept, and expire fires them all.
type fakeTimers struct {
	mu sync.Mutex
	ch []chan time.Time
}

func (f *fakeTimers) after(time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	f.ch = append(f.ch, c)
	return c
}

func (f *fakeTimers) expire() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.ch {
		select {
		case c <- time.Time{}:
		default:
		}
	}
	f.ch = nil
}

func withSlotWait(l Limits) (*Controller, *fakeTimers) {
	c := New(l)
	f := &fakeTimers{}
	c.after = f.after
	return c, f
}

type entered struct {
	name string
	tk   Ticket
	err  error
}

// enterAsync starts a call that may wait for a slot and waits until it is
// admitted, refused or waiting (the room holds one more).
func enterAsync(t *testing.T, c *Controller, name string, out chan<- entered) {
	t.Helper()
	before := c.Waiting()
	go func() {
		tk, err := c.Enter()
		out <- entered{name, tk, err}
	}()
	require.Eventually(t, func() bool { return c.Waiting() > before || len(out) > 0 }, 5*time.Second, time.Millisecond)
}

// TestACallOverTheLimitWaitsForASlotNewestFirst: with a slot wait, the
// call beyond the limit is not refused at once (a burst the process
// serves within the wait is served whole), and the slot given back goes
// to the newest waiter.
func TestACallOverTheLimitWaitsForASlotNewestFirst(t *testing.T) {
	c, _ := withSlotWait(Limits{MaxInFlight: 1, SlotWait: time.Hour})
	held := enter(t, c)
	out := make(chan entered, 2)
	enterAsync(t, c, "older", out)
	enterAsync(t, c, "newer", out)
	require.Equal(t, 2, c.Waiting(), "both wait: neither is refused")
	require.Empty(t, out)

	c.Leave(held)
	got := <-out
	require.NoError(t, got.err)
	assert.Equal(t, "newer", got.name, "last in, first out")
	assert.Equal(t, 1, c.InFlight(), "the slot was handed over, not freed")
	assert.Equal(t, 1, c.Waiting())

	c.Leave(got.tk)
	got = <-out
	require.NoError(t, got.err)
	assert.Equal(t, "older", got.name)
	c.Leave(got.tk)
	assert.Zero(t, c.InFlight())
	assert.Zero(t, c.Waiting())
}

// TestASlotWaitEndsInARefusal: a call that got no slot within its wait is
// refused as the limit refuses, leaves the room, and the slot later given
// back is freed, not handed to it.
func TestASlotWaitEndsInARefusal(t *testing.T) {
	c, timers := withSlotWait(Limits{MaxInFlight: 1, SlotWait: 20 * time.Millisecond})
	held := enter(t, c)
	out := make(chan entered, 1)
	enterAsync(t, c, "waiter", out)
	timers.expire()
	got := <-out
	requireLimited(t, got.err, InFlightRetryAfter.Milliseconds())
	assert.Zero(t, c.Waiting())
	c.Leave(held)
	assert.Zero(t, c.InFlight())
}

// TestAFullRoomRefusesAtTheDoor: past SlotWaiters waiting, a call over the
// limit is refused at once, and Full says so (the early refusal in front
// of the HTTP surface); while the room has space, Full lets calls through
// to wait.
func TestAFullRoomRefusesAtTheDoor(t *testing.T) {
	c, timers := withSlotWait(Limits{MaxInFlight: 1, SlotWait: time.Hour, SlotWaiters: 1})
	held := enter(t, c)
	_, full := c.Full()
	assert.False(t, full, "the limit is reached but a call may still wait")
	out := make(chan entered, 2)
	enterAsync(t, c, "waiter", out)
	se, full := c.Full()
	require.True(t, full)
	requireLimited(t, se, InFlightRetryAfter.Milliseconds())
	_, err := c.Enter()
	requireLimited(t, err, InFlightRetryAfter.Milliseconds())
	timers.expire()
	<-out
	c.Leave(held)
	assert.Zero(t, c.InFlight())
}

// TestNoSlotWaitRefusesAtOnce: without SlotWait the limit refuses the call
// beyond it at once, as before, and nothing waits.
func TestNoSlotWaitRefusesAtOnce(t *testing.T) {
	c := New(Limits{MaxInFlight: 1})
	held := enter(t, c)
	_, err := c.Enter()
	requireLimited(t, err, InFlightRetryAfter.Milliseconds())
	assert.Zero(t, c.Waiting())
	_, full := c.Full()
	assert.True(t, full)
	c.Leave(held)
}

// TestSlotWaitHoldsTheLimitUnderRacingCallers: however callers race with
// the room, never more than the limit are inside, every waiter ends
// (admitted or refused) and every slot comes back.
func TestSlotWaitHoldsTheLimitUnderRacingCallers(t *testing.T) {
	const limit = 4
	c := New(Limits{MaxInFlight: limit, SlotWait: time.Second, SlotWaiters: 8})
	var inside, most, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 300 {
				tk, err := c.Enter()
				if err != nil {
					refused.Add(1)
					continue
				}
				n := inside.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				admitted.Add(1)
				inside.Add(-1)
				c.Leave(tk)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int64(limit))
	assert.Equal(t, int64(32*300), admitted.Load()+refused.Load())
	assert.Zero(t, c.InFlight())
	assert.Zero(t, c.Waiting())
}

// TestAShrunkenLimitIsNotHandedOver: when the adaptive limit fell below
// the calls in flight, a slot given back is freed rather than handed to a
// waiter, until the count is within the limit again.
func TestAShrunkenLimitIsNotHandedOver(t *testing.T) {
	c, timers := withSlotWait(Limits{MaxInFlight: 2, SlotWait: time.Hour})
	a, b := enter(t, c), enter(t, c)
	out := make(chan entered, 1)
	enterAsync(t, c, "waiter", out)
	c.limit.Store(1) // as the gradient would
	c.Leave(a)
	assert.Equal(t, 1, c.InFlight(), "freed: 2 in flight was over the limit of 1")
	assert.Equal(t, 1, c.Waiting())
	c.Leave(b)
	got := <-out
	require.NoError(t, got.err, "the count is within the limit: handed over")
	assert.Equal(t, 1, c.InFlight())
	c.Leave(got.tk)
	timers.expire()
	assert.Zero(t, c.InFlight())
}

// TestASlotWaitCostsNothingWhileNoneWaits: with the room on, a call that
// finds a slot allocates nothing (the path of every call below the limit).
func TestASlotWaitCostsNothingWhileNoneWaits(t *testing.T) {
	c := New(Limits{MaxInFlight: 4, Adaptive: true, SlotWait: time.Second})
	arrived := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		tk, err := c.EnterAt(arrived)
		if err != nil {
			t.Fatal(err)
		}
		c.Leave(tk)
	})
	assert.Zero(t, allocs)
}
