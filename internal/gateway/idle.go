package gateway

import (
	"bufio"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// An idle mutual-TLS session waits for its next message at a shallow
// stack depth, on the TCP socket itself, instead of inside the frame read
// (coder/websocket's frame header read, inside crypto/tls's record read,
// about 5 KiB deep). The session's one long-lived goroutine then stays at
// the runtime's initial 2 KiB stack instead of 8 KiB; each burst of
// messages is read and handled on a short-lived goroutine whose grown stack
// goes back to the runtime when it exits.
//
// Waiting on the socket is only correct when no layer above it holds bytes
// of a message already received:
//   - recordConn, under crypto/tls, never hands it bytes beyond the TLS
//     record it is reading, so crypto/tls holds no raw bytes between
//     records (its record read consumes the whole record);
//   - plainConn, over crypto/tls, knows when crypto/tls holds no decrypted
//     bytes of the record it read: its last Read returned less than asked
//     for (crypto/tls's Read copies all it has, up to the caller's buffer),
//     or the plaintext returned since that record came reaches the record's
//     length less TLS 1.3's least overhead (a 16-byte tag and the content
//     type byte; a longer overhead, padding or a record crypto/tls keeps for
//     itself only make it wait inside the frame read, as before);
//   - the upgrade's bufio.Reader, which coder/websocket reads frames
//     through, has nothing buffered.
// Between messages coder/websocket keeps no bytes of its own (it reads a
// message to its end, and no compression is negotiated).

// tlsRecordHeader is a TLS record's header: type, version, length.
const tlsRecordHeader = 5

// recordConn is the raw connection under crypto/tls: a Read never goes
// past the end of the current TLS record.
type recordConn struct {
	net.Conn
	header  [tlsRecordHeader]byte
	got     uint8 // bytes of the current header read
	left    int32 // bytes of the current record's body still to read
	length  int32 // the current record's body length
	records int   // headers read: which record is the current one
	// turn is the connection's part in the handshakes' turns while its
	// handshake runs (handshakes.go), nil after.
	turn *handshakeTurn
	// held is what the handshake wrote after its flight (the session
	// ticket, or an alert), sent with the next write (Write); nil when
	// nothing is held. A pointer: the connection lives as long as its
	// session, and 64 bytes is its size class.
	held *[]byte
}

// recordApplicationData is the type of a TLS record that is encrypted
// under TLS 1.3 (every record after the ServerHello's, whatever it holds).
const recordApplicationData = 23

// Write holds, while the handshake runs, a write that is all encrypted
// records: crypto/tls writes the server's flight in one write that
// starts with the plaintext ServerHello (or HelloRetryRequest), so such a
// write comes after the flight, which the daemon needs; what comes after
// it (the session ticket of a full handshake, written when the client's
// certificate is in, or an alert) the daemon does not wait for. It goes
// out with the next write, the upgrade's answer (one write and one
// segment less a full handshake), or when the handshake fails (release),
// before the close. A resumed handshake's ticket is in its flight.
func (c *recordConn) Write(b []byte) (int, error) {
	if c.turn != nil && len(b) > 0 && b[0] == recordApplicationData {
		if c.held == nil {
			c.held = new([]byte)
		}
		*c.held = append(*c.held, b...)
		return len(b), nil
	}
	if c.held == nil {
		return c.Conn.Write(b)
	}
	held := *c.held
	c.held = nil
	n, err := c.Conn.Write(append(held, b...))
	return max(0, n-len(held)), err
}

// release writes what the handshake held (a failed handshake's alert).
func (c *recordConn) release() {
	if c.held != nil {
		_, _ = c.Write(nil)
	}
}

func (c *recordConn) Read(b []byte) (int, error) {
	if c.turn == nil {
		return c.read(b)
	}
	c.turn.beforeRead()
	n, err := c.read(b)
	if err == nil {
		err = c.turn.afterRead()
	}
	return n, err
}

func (c *recordConn) read(b []byte) (int, error) {
	if c.left == 0 {
		// The next record's header, alone: its length bounds the reads
		// that follow.
		n, err := c.Conn.Read(b[:min(len(b), tlsRecordHeader-int(c.got))])
		copy(c.header[c.got:], b[:n])
		c.got += uint8(n)
		if c.got == tlsRecordHeader {
			c.got = 0
			c.left = int32(c.header[3])<<8 | int32(c.header[4])
			c.records++
			c.length = c.left
		}
		return n, err
	}
	n, err := c.Conn.Read(b[:min(len(b), int(c.left))])
	c.left -= int32(n)
	return n, err
}

// tls13Overhead is the least a TLS 1.3 record adds to its plaintext: the
// AEAD tag (16 bytes for every suite crypto/tls offers) and the inner
// content type.
const tls13Overhead = 16 + 1

// plainConn is crypto/tls's connection as the upgrade and coder/websocket
// read it; drained says crypto/tls's last Read left none of its record's
// plaintext unread.
type plainConn struct {
	net.Conn
	rec      *recordConn // under crypto/tls: read by it within this Read, on this goroutine
	seen     int         // rec.records at the last Read
	consumed int         // plaintext returned since that record came
	drained  atomic.Bool
}

func (c *plainConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.rec.records != c.seen {
		c.seen, c.consumed = c.rec.records, 0
	}
	c.consumed += n
	c.drained.Store(n < len(b) || err != nil || c.consumed >= int(c.rec.length)-tls13Overhead)
	return n, err
}

// idleWait is what a session needs to wait on its socket.
type idleWait struct {
	raw   syscall.RawConn
	plain *plainConn
	br    *bufio.Reader // the upgrade's reader, which coder/websocket reads through

	mu      sync.Mutex
	closing bool // the session is ending: its close handshake may read now
}

// newIdleWait answers nil when raw is no socket (then the session waits
// inside the frame read, as the fallback's do).
func newIdleWait(raw net.Conn, plain *plainConn, br *bufio.Reader) *idleWait {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &idleWait{raw: rc, plain: plain, br: br}
}

// quiet says that no layer above the socket holds received bytes. The
// caller reads no more (its burst is over) and nobody else reads unless
// the session is closing, in which case quiet says false and wait ends.
func (w *idleWait) quiet() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.closing && w.plain.drained.Load() && w.br.Buffered() == 0
}

// wait returns when the socket has bytes (or has ended, or was closed); it
// answers false when the session is closing. Called only after quiet.
func (w *idleWait) wait() bool {
	// An error (closed, a deadline) is for the frame read to report. The
	// socket is peeked at once, before the first wait; after a wait the
	// poller's word is taken (a spurious wake-up only means the burst's
	// frame read waits instead).
	looked := false
	_ = w.raw.Read(func(fd uintptr) bool {
		if looked {
			return true
		}
		looked = true
		return readable(fd)
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.closing
}

// close marks the session as ending, before its connection's close
// handshake reads from it.
func (w *idleWait) close() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
}

// readable peeks at the socket without taking a byte: true when it has
// data, has ended or has failed (the frame read finds out which); false
// makes the runtime wait until the poller says readable. The peek is
// needed because the runtime clears the socket's readiness before the
// first call: data that came before it would wake no one.
func readable(fd uintptr) bool {
	var b [1]byte
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return errno != syscall.EAGAIN
}
