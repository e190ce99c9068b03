package admission

import (
	"sync"
	"sync/atomic"
	"time"
)

// room is where a call over the in-flight limit waits for a slot, for at
// most wait, instead of being refused at once (Limits.SlotWait). On a
// shared machine the process is descheduled for milliseconds at a time;
// the calls that arrived meanwhile are all read at once when it runs
// again, and an in-flight limit of a few dozen refused the burst although
// the process served the same rate whole without a limit: at a rate it
// sustained, it refused 6 to 42 % of the calls (docs/benchmarks-notes.md,
// "Sustained peak and the slot wait"). Every such refusal had already
// cost its read and costs its answer, and saved the process nothing but
// the call's own work, which the burst's few milliseconds had room for.
//
// The newest waiter gets the next slot (last in, first out): under a
// lasting overload the room stays full and the calls served are those
// that waited least, while the oldest run out their wait and are refused;
// after a burst the room empties within the wait. A full room (as many
// waiters as size) refuses at the door, cheaply (Controller.Full). Off by
// default: on a loaded machine it did not reliably raise goodput (same
// notes); a slot handed over idles until its waiter is scheduled.
type room struct {
	wait time.Duration
	size int

	mu      sync.Mutex
	waiters []*waiter // oldest first
}

// waiter is one call waiting in the room; its channel receives the slot.
type waiter struct{ slot chan struct{} }

func newRoom(wait time.Duration, size int) *room {
	return &room{wait: wait, size: max(1, size)}
}

// len is the number of calls waiting.
func (r *room) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters)
}

// full reports whether a call over the limit would be refused at once.
func (r *room) full() bool { return r.len() >= r.size }

// enter waits for one of limit's slots, inFlight counting those taken: a
// free one is taken under the room's lock first (freed since the caller
// found none), then the call waits, newest first, until leave hands it a
// slot or wait passes. It reports whether the call holds a slot. after is
// the timer, a parameter so that tests decide when the wait passes.
func (r *room) enter(inFlight, limit *atomic.Int64, after func(time.Duration) <-chan time.Time) bool {
	r.mu.Lock()
	if takeSlot(inFlight, limit) {
		r.mu.Unlock()
		return true
	}
	if len(r.waiters) >= r.size {
		r.mu.Unlock()
		return false
	}
	w := &waiter{slot: make(chan struct{}, 1)}
	r.waiters = append(r.waiters, w)
	r.mu.Unlock()
	select {
	case <-w.slot:
		return true
	case <-after(r.wait):
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, o := range r.waiters {
		if o == w {
			r.waiters = append(r.waiters[:i], r.waiters[i+1:]...)
			return false
		}
	}
	// Handed a slot as the wait ran out: it is this call's.
	<-w.slot
	return true
}

// leave gives back a slot and returns the calls in flight before it
// left. The newest waiter gets the slot (it stays taken) while the count
// is within the limit (the limit may have shrunk below the calls in
// flight); otherwise it is freed, under the room's lock, so that a call
// between its check and its wait cannot miss it.
func (r *room) leave(inFlight, limit *atomic.Int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := len(r.waiters); k > 0 {
		if n := inFlight.Load(); n <= limit.Load() {
			w := r.waiters[k-1]
			r.waiters[k-1] = nil
			r.waiters = r.waiters[:k-1]
			w.slot <- struct{}{}
			return n
		}
	}
	return inFlight.Add(-1) + 1
}

// takeSlot takes one of limit's slots if one is free: never past the
// limit, whatever races it.
func takeSlot(inFlight, limit *atomic.Int64) bool {
	for {
		n, l := inFlight.Load(), limit.Load()
		if n >= l {
			return false
		}
		if inFlight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}
