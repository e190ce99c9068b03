package server

import (
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// What one client connection may hold, whatever the kernel's buffers do.
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
//     shrink for Stall is closed.
type ConnLimits struct {
	// Stall is the longest a connection may go without its peer taking
	// any of what was written to it; default DefaultStall.
	Stall time.Duration
	// SendBuffer is the socket's send buffer in bytes; default
	// DefaultSendBuffer.
	SendBuffer int
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

// BoundConns wraps ln so that its connections keep to limits, and
// returns the ConnState hook the http.Server must install for the idle
// check (it chains to next, which may be nil).
func BoundConns(ln net.Listener, limits ConnLimits, next func(net.Conn, http.ConnState)) (net.Listener, func(net.Conn, http.ConnState)) {
	bl := &boundedListener{Listener: ln, limits: limits.withDefaults()}
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

type boundedListener struct {
	net.Listener
	limits ConnLimits
}

func (l *boundedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	// Fixed, not autotuned: the queued answers' ceiling.
	_ = tc.SetWriteBuffer(l.limits.SendBuffer)
	return &boundedConn{TCPConn: tc, stall: l.limits.Stall}, nil
}

// boundedConn is an accepted connection under ConnLimits.
type boundedConn struct {
	*net.TCPConn
	stall time.Duration

	mu       sync.Mutex
	deadline time.Time // the caller's write deadline (zero: none)
	idle     *time.Timer
	queued   int // send queue at the last idle check
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

// setState follows the server's view of the connection: while idle it is
// checked every stall period.
func (c *boundedConn) setState(s http.ConnState) {
	q := 0
	if s == http.StateIdle {
		q, _ = c.sendQueue()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle != nil {
		c.idle.Stop()
		c.idle = nil
	}
	if s != http.StateIdle || q == 0 {
		// Nothing unacknowledged: the server's idle timeout applies.
		return
	}
	c.queued = q
	c.idle = time.AfterFunc(c.stall, c.checkIdle)
}

// checkIdle closes an idle connection whose peer stopped taking what was
// sent: bytes still queued, and no fewer than at the last check.
func (c *boundedConn) checkIdle() {
	q, err := c.sendQueue()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle == nil { // no longer idle
		return
	}
	if err != nil || q == 0 {
		c.idle = nil // nothing held: the server's idle timeout applies
		return
	}
	if q >= c.queued {
		c.idle = nil
		_ = c.TCPConn.Close()
		return
	}
	c.queued = q
	c.idle = time.AfterFunc(c.stall, c.checkIdle)
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
