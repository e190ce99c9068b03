package server

import (
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// What one client connection may hold, and how many connections the
// server takes at once, whatever the kernel's buffers do.
//
// A client that pipelines requests and never reads its answers used to be
// let go or not depending on how the socket buffers filled: with answers
// that fit in buffers grown by autotuning, every response "finished" and
// the connection sat idle, its answers unread, until the idle timeout; with
// larger ones a write blocked until the response's deadline (45 s), reset
// by every new response. ConnLimits makes the bound explicit:
//
//   - the send buffer is fixed (SO_SNDBUF, which turns autotuning off), so
//     the answers queued in the kernel for a connection are at most
//     SendBuffer plus the peer's receive window;
//   - a write that makes no progress for Stall fails, however long the
//     response's own deadline (writes go to the kernel in chunks, each
//     with its own deadline);
//   - an idle connection whose answers the peer has not taken (bytes
//     still unacknowledged in the send queue) and whose queue does not
//     shrink between two checks Stall apart is closed: within 2 x Stall
//     of its last answer. The check runs on a timer per connection, at
//     most once per Stall, not per call: asking the kernel for the send
//     queue (SIOCOUTQ) after every answer cost 7 % of the server's CPU
//     at an overload (docs/benchmarks-notes.md, "Cheaper refusals");
//   - with MaxConns, at most that many connections are served at once:
//     past it one accepted connection waits for a served one to end and
//     the listener accepts no more, so that further connections wait in
//     the kernel's accept queue (costing the server nothing); while one
//     waits, idle connections are let go and answers ask their clients
//     to close (Connection: close), so that a pool of idle keep-alive
//     connections cannot lock others out.
type ConnLimits struct {
	// Stall is the longest a connection may go without its peer taking
	// any of what was written to it; default DefaultStall.
	Stall time.Duration
	// SendBuffer is the socket's send buffer in bytes; default
	// DefaultSendBuffer.
	SendBuffer int
	// MaxConns is the most connections served at once; 0: no cap.
	// Hijacked connections (WebSocket sessions, tunnels) leave the count
	// when hijacked: they are bounded by their own subsystem.
	MaxConns int
}

// Defaults of ConnLimits.
const (
	DefaultStall      = 10 * time.Second
	DefaultSendBuffer = 256 << 10
	// writeChunk is the most handed to the kernel under one deadline.
	writeChunk = 64 << 10
)

func (l ConnLimits) withDefaults() ConnLimits {
	if l.Stall <= 0 {
		l.Stall = DefaultStall
	}
	if l.SendBuffer <= 0 {
		l.SendBuffer = DefaultSendBuffer
	}
	return l
}

// Bounded is a listener under ConnLimits.
type Bounded struct {
	net.Listener
	limits ConnLimits
	slots  chan struct{} // one per connection served; nil: no cap
	done   chan struct{} // closed by Close: a waiting Accept returns
	close  sync.Once

	waiting atomic.Int32 // Accepts waiting for a slot

	mu   sync.Mutex
	idle map[*boundedConn]struct{} // served connections idle now (with a cap only)
}

// BoundConns wraps ln so that its connections keep to limits, and
// returns the ConnState hook the http.Server must install (it chains to
// next, which may be nil). With a cap (MaxConns), serve with the handler
// wrapped by Bounded.Handler too, so that answers ask their clients to
// close while connections wait.
func BoundConns(ln net.Listener, limits ConnLimits, next func(net.Conn, http.ConnState)) (*Bounded, func(net.Conn, http.ConnState)) {
	bl := &Bounded{Listener: ln, limits: limits.withDefaults(), done: make(chan struct{})}
	if limits.MaxConns > 0 {
		bl.slots = make(chan struct{}, limits.MaxConns)
		bl.idle = map[*boundedConn]struct{}{}
	}
	return bl, func(c net.Conn, s http.ConnState) {
		if w, ok := c.(interface{ NetConn() net.Conn }); ok {
			c = w.NetConn() // wrapped outside (admission.ArrivalListener)
		}
		if bc, ok := c.(*boundedConn); ok {
			bc.setState(s)
		}
		if next != nil {
			next(c, s)
		}
	}
}

// Accept takes the next connection. At the cap, the connection taken
// waits for a served one to end (idle ones are let go meanwhile), and the
// connections behind it stay in the kernel's accept queue.
func (l *Bounded) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.slots != nil {
		select {
		case l.slots <- struct{}{}:
		default:
			l.waiting.Add(1)
			l.closeIdle()
			select {
			case l.slots <- struct{}{}:
				l.waiting.Add(-1)
			case <-l.done:
				l.waiting.Add(-1)
				_ = c.Close()
				return nil, net.ErrClosed
			}
		}
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return &slotConn{Conn: c, l: l}, nil
	}
	// Fixed, not autotuned: the queued answers' ceiling.
	_ = tc.SetWriteBuffer(l.limits.SendBuffer)
	return &boundedConn{TCPConn: tc, l: l, stall: l.limits.Stall}, nil
}

// Close stops accepting, also an Accept waiting at the cap.
func (l *Bounded) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Waiting reports whether a connection waits for a slot (at the cap).
func (l *Bounded) Waiting() bool { return l.slots != nil && l.waiting.Load() > 0 }

// Served is the number of connections holding a slot (0 without a cap).
func (l *Bounded) Served() int { return len(l.slots) }

// Handler wraps h: while connections wait at the cap, each answer asks
// its client to close its connection (and net/http closes it after the
// answer), handing the slot to a waiting one.
func (l *Bounded) Handler(h http.Handler) http.Handler {
	if l.slots == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.Waiting() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

func (l *Bounded) release() {
	if l.slots != nil {
		<-l.slots
	}
}

// closeIdle lets the idle connections go (a request arriving at this
// moment meets a closed connection, as with the server's idle timeout).
func (l *Bounded) closeIdle() {
	l.mu.Lock()
	idle := make([]*boundedConn, 0, len(l.idle))
	for c := range l.idle {
		idle = append(idle, c)
	}
	l.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}

// setIdle records whether c is idle; while connections wait at the cap,
// a connection going idle is let go at once.
func (l *Bounded) setIdle(c *boundedConn, idle bool) {
	if l.slots == nil {
		return
	}
	if idle && l.Waiting() {
		_ = c.Close()
		return
	}
	l.mu.Lock()
	if c.gone {
		// closed already (a late idle after another goroutine closed it)
	} else if idle {
		l.idle[c] = struct{}{}
	} else {
		delete(l.idle, c)
	}
	l.mu.Unlock()
}

// slotConn gives a connection's slot back once, when it closes.
type slotConn struct {
	net.Conn
	l    *Bounded
	once sync.Once
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// boundedConn is an accepted connection under ConnLimits.
type boundedConn struct {
	*net.TCPConn
	l     *Bounded
	stall time.Duration
	freed sync.Once // the slot given back (closed or hijacked)
	gone  bool      // freed; under the listener's mu

	mu       sync.Mutex
	deadline time.Time // the caller's write deadline (zero: none)
	state    http.ConnState
	idles    uint64      // transitions to idle so far
	idle     *time.Timer // the idle check (created on the first idle)
	armed    bool        // the idle check is pending
	checked  uint64      // idles at the last check
	queued   int         // send queue at the last check
}

// free gives the connection's slot back, once.
func (c *boundedConn) free() {
	c.freed.Do(func() {
		if c.l.slots != nil {
			c.l.mu.Lock()
			c.gone = true
			delete(c.l.idle, c)
			c.l.mu.Unlock()
		}
		c.l.release()
	})
}

func (c *boundedConn) Close() error {
	err := c.TCPConn.Close()
	c.free()
	return err
}

// SetWriteDeadline records the caller's deadline; each chunk's own is
// the earlier of it and the stall bound.
func (c *boundedConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.TCPConn.SetWriteDeadline(t)
}

func (c *boundedConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.TCPConn.SetDeadline(t)
}

func (c *boundedConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		chunk := p[written:min(len(p), written+writeChunk)]
		c.mu.Lock()
		d := time.Now().Add(c.stall)
		if !c.deadline.IsZero() && c.deadline.Before(d) {
			d = c.deadline
		}
		c.mu.Unlock()
		if err := c.TCPConn.SetWriteDeadline(d); err != nil {
			return written, err
		}
		n, err := c.TCPConn.Write(chunk)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// setState follows the server's view of the connection. Going idle arms
// the idle check when it is not pending already; nothing else is done
// per call.
func (c *boundedConn) setState(s http.ConnState) {
	switch s {
	case http.StateHijacked, http.StateClosed:
		c.mu.Lock()
		c.state = s
		if c.idle != nil {
			c.idle.Stop()
		}
		c.armed = false
		c.mu.Unlock()
		c.free() // a hijacked connection is its handler's now
		return
	}
	c.mu.Lock()
	c.state = s
	if s == http.StateIdle {
		c.idles++
		if !c.armed {
			c.armed = true
			if c.idle == nil {
				c.idle = time.AfterFunc(c.stall, c.checkIdle)
			} else {
				c.idle.Reset(c.stall)
			}
		}
	}
	c.mu.Unlock()
	if c.l.slots != nil && (s == http.StateIdle || s == http.StateActive) {
		c.l.setIdle(c, s == http.StateIdle)
	}
}

// checkIdle closes an idle connection whose peer stopped taking what was
// sent: bytes still queued, and no fewer than at the previous check with
// no answer between the two.
func (c *boundedConn) checkIdle() {
	c.mu.Lock()
	if c.state != http.StateIdle {
		c.armed = false // armed again when it next goes idle
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	q, err := c.sendQueue()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed || c.state != http.StateIdle {
		c.armed = false
		return
	}
	if err != nil || q == 0 {
		c.armed = false // nothing held: the server's idle timeout applies
		return
	}
	if c.checked == c.idles && q >= c.queued {
		c.armed = false
		go c.Close() // not under c.mu
		return
	}
	c.checked, c.queued = c.idles, q
	c.idle.Reset(c.stall)
}

// sendQueue is the number of bytes written but not yet acknowledged by
// the peer (SIOCOUTQ).
func (c *boundedConn) sendQueue() (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var q int
	var qerr error
	if err := rc.Control(func(fd uintptr) {
		q, qerr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
	}); err != nil {
		return 0, err
	}
	if errors.Is(qerr, os.ErrClosed) {
		return 0, nil
	}
	return q, qerr
}
