package tunnel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/coder/websocket"
)

// headerLen is a frame's header on a stream: its kind and its payload's
// length (big endian).
const headerLen = 5

// frameBuf holds a whole frame as a stream carries it.
type frameBuf = [headerLen + MaxFrame]byte

// frames pools frame buffers: a relay takes one when a frame's header has
// arrived and gives it back once the frame is passed on, so an idle tunnel
// holds none (memory per open tunnel at the gateway; docs/benchmarks.md).
var frames = sync.Pool{New: func() any { return new(frameBuf) }}

// readHeader waits for a frame's header and checks its length.
func readHeader(r io.Reader) (kind byte, n int, err error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, err
	}
	size := binary.BigEndian.Uint32(h[1:])
	if size > MaxFrame {
		return 0, 0, fmt.Errorf("tunnel: a frame of %d bytes (at most %d)", size, MaxFrame)
	}
	return h[0], int(size), nil
}

// CopyFrame waits for the next frame on r and writes it whole to w in one
// Write (header and payload: one yamux or HTTP/2 data frame), through a
// pooled buffer held only while the frame passes. It returns the frame's
// kind. A relay that does not read frames (the gateway) loops on it.
func CopyFrame(w io.Writer, r io.Reader) (byte, error) {
	kind, n, err := readHeader(r)
	if err != nil {
		return 0, err
	}
	b := frames.Get().(*frameBuf)
	defer frames.Put(b)
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:headerLen], uint32(n))
	if _, err := io.ReadFull(r, b[headerLen:headerLen+n]); err != nil {
		return 0, err
	}
	_, err = w.Write(b[:headerLen+n])
	return kind, err
}

// Frame is one frame read by NextFrame: B[0] its kind, B[1:] its payload
// (a binary WebSocket message as a client sends and receives it). Release
// gives its buffer back.
type Frame struct {
	B   []byte
	buf *frameBuf
}

// Release returns the frame's buffer to the pool; B is not to be used
// afterwards.
func (f Frame) Release() {
	if f.buf != nil {
		frames.Put(f.buf)
	}
}

// NextFrame waits for the next frame on r and reads it into a pooled
// buffer.
func NextFrame(r io.Reader) (Frame, error) {
	kind, n, err := readHeader(r)
	if err != nil {
		return Frame{}, err
	}
	b := frames.Get().(*frameBuf)
	// The payload lands after the header's place, one byte before it
	// the kind: the frame is then contiguous.
	f := Frame{B: b[headerLen-1 : headerLen+n], buf: b}
	f.B[0] = kind
	if _, err := io.ReadFull(r, f.B[1:]); err != nil {
		f.Release()
		return Frame{}, err
	}
	return f, nil
}

// Upstream is the api's end of one tunnel through a gateway's internal
// API: a request to the gateway whose body carries the frames towards the
// daemon and whose response's body carries the daemon's (HTTP/2, so that
// every tunnel to a gateway shares one connection: no TLS handshake per
// tunnel, no connection held per tunnel).
type Upstream struct {
	in   io.ReadCloser  // the response's body
	out  *io.PipeWriter // the request's body
	end  context.CancelFunc
	wmu  sync.Mutex
	once sync.Once
}

// NewUpstream is the upstream of a request whose body reads from out's
// pipe and whose response's body is in; end cancels the request.
func NewUpstream(in io.ReadCloser, out *io.PipeWriter, end context.CancelFunc) *Upstream {
	return &Upstream{in: in, out: out, end: end}
}

// WriteFrame sends one frame towards the daemon; it waits while the
// tunnel's flow-control window (HTTP/2, then yamux) is full, until Close.
func (u *Upstream) WriteFrame(kind byte, p []byte) error {
	u.wmu.Lock()
	defer u.wmu.Unlock()
	return WriteFrame(u.out, kind, p)
}

// NextFrame reads the daemon's next frame into a pooled buffer (Release
// it).
func (u *Upstream) NextFrame() (Frame, error) { return NextFrame(u.in) }

// ReadFrame reads the daemon's next frame into a buffer of its own.
func (u *Upstream) ReadFrame() (byte, []byte, error) { return ReadFrame(u.in) }

// Close ends the tunnel's request: the gateway's side of the stream
// ends, and a waiting WriteFrame or NextFrame returns.
func (u *Upstream) Close() error {
	u.once.Do(func() {
		_ = u.out.CloseWithError(io.ErrClosedPipe)
		u.end()
		_ = u.in.Close()
	})
	return nil
}

// errNoStreams is a binary message on a session without streams.
var errNoStreams = errors.New("tunnel: a binary message, and no streams were offered")

// ReadMessage reads a session's next message: a text message (a control
// message) is returned whole; a binary one (tunnel streams' bytes) is fed
// to mux as it arrives, through a pooled buffer, rather than gathered in
// a buffer of its own first (a session's reader is the path of every
// tunnel of its node). A binary message without mux is an error.
func ReadMessage(ctx context.Context, ws *websocket.Conn, mux *Mux) (websocket.MessageType, []byte, error) {
	typ, r, err := ws.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	if typ == websocket.MessageText {
		b, err := io.ReadAll(r)
		return typ, b, err
	}
	if mux == nil {
		return typ, nil, errNoStreams
	}
	return typ, nil, mux.feedFrom(r)
}

// feedFrom hands a binary message of the session to the multiplexer.
func (m *Mux) feedFrom(r io.Reader) error {
	if _, err := m.session(); err != nil {
		return err
	}
	b := frames.Get().(*frameBuf)
	defer frames.Put(b)
	for {
		n, err := r.Read(b[:])
		if n > 0 {
			if err := m.conn.Feed(b[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
