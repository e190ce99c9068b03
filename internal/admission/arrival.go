package admission

import (
	"context"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"computeplane/gen/api"
)

// Arrival timing: the wait check (queue.go) judges a call by how long it
// waited since its arrival, not since its handler started, so that time
// spent queued in the server before admission (in the socket, waiting for
// the CPU to read and parse it) counts. A call's arrival is the kernel's
// receive time of its first bytes (SO_TIMESTAMPNS on the socket, read with
// recvmsg on the first read after an answer); where the kernel gives none,
// the time of that read.

// ArrivalListener wraps ln so that each accepted connection records its
// requests' arrivals; serve with http.Server.ConnContext set to
// ArrivalContext. A connection without a socket (syscall.Conn) passes
// through unchanged.
func ArrivalListener(ln net.Listener) net.Listener { return arrivalListener{ln} }

type arrivalListener struct{ net.Listener }

func (l arrivalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c, nil
	}
	ac := &ArrivalConn{Conn: c}
	ac.armed.Store(true)
	if rc, err := sc.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1) == nil {
				ac.raw = rc
			}
		})
	}
	return ac, nil
}

// ArrivalConn is a connection that knows when its current request
// arrived. NetConn gives the connection it wraps.
type ArrivalConn struct {
	net.Conn
	raw     syscall.RawConn // nil: no kernel timestamps
	armed   atomic.Bool     // the next bytes read start a request
	arrived atomic.Int64    // unix ns of the current request's arrival, 0: taken
	checked atomic.Int64    // the same, once Controller.CheckWait admitted the request; 0: not checked
	oob     [64]byte
}

// NetConn is the connection wrapped.
func (c *ArrivalConn) NetConn() net.Conn { return c.Conn }

func (c *ArrivalConn) Read(p []byte) (int, error) {
	if !c.armed.Load() || len(p) == 0 {
		return c.Conn.Read(p)
	}
	var (
		n   int
		at  int64
		err error
	)
	if c.raw != nil {
		n, at, err = c.recv(p)
	} else {
		n, err = c.Conn.Read(p)
	}
	if n > 0 {
		if at == 0 {
			at = time.Now().UnixNano()
		}
		c.armed.Store(false)
		c.arrived.Store(at)
	}
	return n, err
}

// recv reads with recvmsg to get the kernel's receive time of the bytes.
func (c *ArrivalConn) recv(p []byte) (n int, at int64, err error) {
	var oobn int
	var serr error
	rerr := c.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, serr = syscall.Recvmsg(int(fd), p, c.oob[:], 0)
		return serr != syscall.EAGAIN
	})
	switch {
	case rerr != nil: // a deadline, or the connection closed
		return 0, 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: rerr}
	case serr != nil:
		return 0, 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("recvmsg", serr)}
	case n == 0:
		return 0, 0, io.EOF
	}
	return n, timestampNS(c.oob[:oobn]), nil
}

// timestampNS finds SCM_TIMESTAMPNS in control messages (0: none). It
// walks the headers in place: syscall.ParseSocketControlMessage allocates
// a slice per call, on every request's first read.
func timestampNS(oob []byte) int64 {
	const hdr = syscall.SizeofCmsghdr
	for len(oob) >= hdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		n := int(h.Len)
		if n < hdr || n > len(oob) {
			return 0
		}
		data := oob[syscall.CmsgLen(0):n]
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS && len(data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			return (*syscall.Timespec)(unsafe.Pointer(&data[0])).Nano()
		}
		next := syscall.CmsgSpace(n - syscall.CmsgLen(0))
		if next >= len(oob) {
			return 0
		}
		oob = oob[next:]
	}
	return 0
}

// Write sends an answer: the next bytes read start the next request.
func (c *ArrivalConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.armed.Store(true)
	return n, err
}

// take returns the current request's arrival once (zero after).
func (c *ArrivalConn) take() time.Time {
	if ns := c.arrived.Swap(0); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

type arrivalKey struct{}

// ArrivalContext is an http.Server ConnContext: it lets Arrived find the
// connection's arrivals.
func ArrivalContext(ctx context.Context, c net.Conn) context.Context {
	if ac, ok := c.(*ArrivalConn); ok {
		return context.WithValue(ctx, arrivalKey{}, ac)
	}
	return ctx
}

// Arrived is when the request served under ctx arrived, or now when its
// connection did not record it (not through ArrivalListener, or a second
// request read in the same read as the first).
func Arrived(ctx context.Context, now time.Time) time.Time {
	t, _ := ArrivedChecked(ctx, now)
	return t
}

// ArrivedChecked is Arrived, and whether Controller.CheckWait already
// judged the request's wait (then EnterChecked admits it, not EnterAt).
func ArrivedChecked(ctx context.Context, now time.Time) (time.Time, bool) {
	if ac, ok := ctx.Value(arrivalKey{}).(*ArrivalConn); ok {
		if ns := ac.checked.Swap(0); ns != 0 {
			return earlier(time.Unix(0, ns), now), true
		}
		if t := ac.take(); !t.IsZero() {
			return earlier(t, now), false
		}
	}
	return now, false
}

// earlier is t unless it is not before now (a clock step).
func earlier(t, now time.Time) time.Time {
	if t.Before(now) {
		return t
	}
	return now
}

// CheckWaitOf runs c.CheckWait on the arrival of the request served under
// ctx, taking it: a call let through is marked checked, so that the
// envelope admits it with EnterChecked (ArrivedChecked) and its wait is
// judged once. A request whose arrival was not recorded is let through
// unjudged (EnterAt times it from now, as before).
func CheckWaitOf(ctx context.Context, c *Controller, now time.Time) (*api.Error, bool) {
	ac, ok := ctx.Value(arrivalKey{}).(*ArrivalConn)
	if !ok || !c.ChecksWait() {
		return nil, false
	}
	t := ac.take()
	if t.IsZero() {
		return nil, false
	}
	t = earlier(t, now)
	if se, refused := c.CheckWait(t); refused {
		return se, true
	}
	ac.checked.Store(t.UnixNano())
	return nil, false
}
