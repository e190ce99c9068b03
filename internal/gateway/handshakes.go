package gateway

import (
	"context"
	"runtime"
	"sync"
)

// The gateway bounds the TLS handshakes computing at once. After a
// restart every daemon of the gateway redials within a fraction of a
// second; run together, ten thousand handshakes share the cores (processor
// sharing) and all finish late, together, past the daemons' dial timeout,
// which sends them round again. With a bound, a handshake takes a turn
// (a slot) while crypto/tls computes, and gives it back while it waits on
// the network for the daemon's next flight (recordConn.Read), so a slow or
// stalled peer holds no slot and a far one does not idle the core. A
// handshake already under way gets a turn before one that has not
// started: handshakes finish one after another at the cores' rate instead
// of all at the end. The wait for a turn is bounded by the handshake's own
// deadline (HandshakeTimeout from the accept); a connection that waited
// that long is closed, and the daemon backs off and redials.

// HandshakesPerCore is how many handshakes compute at once per core the
// Go runtime uses (GOMAXPROCS): a few, so a core never waits for work
// while another handshake's turn is being handed over, and few enough
// that each handshake has a core's share far above 1/10,000.
const HandshakesPerCore = 4

// handshakeLimit overrides the bound when positive (tests).
var handshakeLimit = 0

func handshakeBound() int {
	if handshakeLimit > 0 {
		return handshakeLimit
	}
	return HandshakesPerCore * runtime.GOMAXPROCS(0)
}

// turns is a semaphore of n slots with two queues of waiters: handshakes
// under way are served before new ones, each queue in arrival order.
type turns struct {
	mu      sync.Mutex
	n       int
	inUse   int
	peak    int                // the most slots held at once (tests)
	waiting [2][]chan struct{} // [0]: under way, [1]: new
}

func newTurns(n int) *turns { return &turns{n: n} }

// acquire waits for a slot until ctx ends.
func (t *turns) acquire(ctx context.Context, underWay bool) error {
	q := 1
	if underWay {
		q = 0
	}
	t.mu.Lock()
	if t.inUse < t.n && len(t.waiting[0]) == 0 && len(t.waiting[1]) == 0 {
		t.take()
		t.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	t.waiting[q] = append(t.waiting[q], ch)
	statHandshakeWaiting.Add(1)
	t.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, c := range t.waiting[q] {
		if c == ch {
			t.waiting[q] = append(t.waiting[q][:i], t.waiting[q][i+1:]...)
			statHandshakeWaiting.Add(-1)
			return ctx.Err()
		}
	}
	// Handed a slot as the deadline came: pass it on.
	t.releaseLocked()
	return ctx.Err()
}

func (t *turns) take() {
	t.inUse++
	t.peak = max(t.peak, t.inUse)
	statHandshaking.Add(1)
}

func (t *turns) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.releaseLocked()
}

// releaseLocked hands the slot to the first waiter, under way first.
func (t *turns) releaseLocked() {
	for q := range t.waiting {
		if len(t.waiting[q]) > 0 {
			ch := t.waiting[q][0]
			t.waiting[q] = t.waiting[q][1:]
			statHandshakeWaiting.Add(-1)
			ch <- struct{}{} // the slot changes hands: inUse stays
			return
		}
	}
	t.inUse--
	statHandshaking.Add(-1)
}

// handshakeTurn is one connection's part in the turns while its
// handshake runs (recordConn.turn).
type handshakeTurn struct {
	t        *turns
	ctx      context.Context // the handshake's: its deadline bounds the waits
	held     bool
	underWay bool // it held a slot before: served first
}

// beforeRead gives the slot back: the read may wait on the network.
func (h *handshakeTurn) beforeRead() {
	if h.held {
		h.held = false
		h.t.release()
	}
}

// afterRead takes a slot for what crypto/tls does with the bytes read.
func (h *handshakeTurn) afterRead() error {
	if err := h.t.acquire(h.ctx, h.underWay); err != nil {
		return err
	}
	h.held, h.underWay = true, true
	return nil
}

// done gives the slot back once the handshake ended.
func (h *handshakeTurn) done() {
	h.beforeRead()
}
