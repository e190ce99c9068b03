// Package tunnel is the data path of tunnels (docs/tunnels.md): the frames
// every hop relays (client <-> api <-> gateway over WebSockets, one frame
// per binary message; gateway <-> daemon on a yamux stream, length
// prefixed) and the stream multiplexing beside a daemon session's control
// messages. Both the gateway and compute-agent import it.
package tunnel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"
)

// Frame kinds: the first byte of every frame.
const (
	FrameOpen   byte = 'o' // JSON Open: the first frame towards the daemon
	FrameStdin  byte = 0
	FrameStdout byte = 1
	FrameStderr byte = 2
	FrameExit   byte = 3 // JSON Exit: the last frame from the daemon
	FrameEOF    byte = 4 // the client closed stdin
	FrameResize byte = 5 // JSON Size: the client's terminal's new size (exec with tty)
	FrameSignal byte = 6 // JSON Signal: a signal for the program (exec)
)

// Size is a terminal's size in characters (FrameResize).
type Size struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Signal names a signal without its SIG prefix (FrameSignal): HUP, INT,
// QUIT, KILL, USR1, USR2, TERM, CONT, STOP or WINCH.
type Signal struct {
	Signal string `json:"signal"`
}

// FromClient reports whether a frame kind is one a client may send.
func FromClient(kind byte) bool {
	switch kind {
	case FrameStdin, FrameEOF, FrameResize, FrameSignal:
		return true
	}
	return false
}

// MaxFrame bounds one frame's payload.
const MaxFrame = 64 << 10

// Kinds of tunnel: a program (exec), a TCP connection to a guest port
// (tcp; stdin and stdout frames carry its bytes), an instance's serial
// console (console; likewise).
const (
	KindExec    = "exec"
	KindTCP     = "tcp"
	KindConsole = "console"
	// KindSSH carries an SSH connection (stdin frames to the server,
	// stdout frames from it) to the guest's SSH server (ssh.go).
	KindSSH = "ssh"
	// KindNodeConsole is a shell on a pseudo-terminal that the node's
	// daemon runs itself (its --node-console-command): the frames of exec
	// with a terminal.
	KindNodeConsole = "node-console"
)

// TargetNode is Open.Target for a tunnel to the node itself (node-console,
// or ssh to the daemon's own SSH server); empty for an instance's.
const TargetNode = "node"

// Open asks the daemon for a tunnel into an instance's guest.
type Open struct {
	TunnelID   string            `json:"tunnelId"`
	Kind       string            `json:"kind"`
	InstanceID string            `json:"instanceId"`
	Argv       []string          `json:"argv,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	TTY        bool              `json:"tty,omitempty"`
	// Size is the terminal's size at the start (tty); FrameResize
	// changes it.
	Size *Size `json:"size,omitempty"`
	Port int   `json:"port,omitempty"`
	// SSH is set for KindSSH.
	SSH *SSH `json:"ssh,omitempty"`
	// Target is TargetNode for a tunnel to the node (InstanceID empty).
	Target string `json:"target,omitempty"`
}

// Exit ends a tunnel: the program's exit code, or why it could not run.
type Exit struct {
	ExitCode int    `json:"exitCode"`
	Error    string `json:"error,omitempty"`
}

// Busy is a gateway's refusal of a tunnel beyond its limits (open
// tunnels per node or per gateway, tunnels.limits): the api answers
// UNAVAILABLE with RetryAfter as retryAfterMs.
type Busy struct {
	Why        string
	RetryAfter time.Duration
}

func (b *Busy) Error() string { return b.Why }

// WriteFrame writes one length-prefixed frame to a stream, in one Write
// (one yamux or HTTP/2 data frame rather than a header and a body apart).
func WriteFrame(w io.Writer, kind byte, p []byte) error {
	if len(p) > MaxFrame {
		return fmt.Errorf("tunnel: a frame of %d bytes (at most %d)", len(p), MaxFrame)
	}
	b := frames.Get().(*frameBuf)
	defer frames.Put(b)
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:headerLen], uint32(len(p)))
	n := copy(b[headerLen:], p)
	_, err := w.Write(b[:headerLen+n])
	return err
}

// ReadFrame reads one length-prefixed frame from a stream into a buffer
// of its own (NextFrame reads into a pooled one).
func ReadFrame(r io.Reader) (byte, []byte, error) {
	kind, n, err := readHeader(r)
	if err != nil {
		return 0, nil, err
	}
	p := make([]byte, n)
	_, err = io.ReadFull(r, p)
	return kind, p, err
}

// StreamsYamux is what a daemon's hello names when it accepts yamux
// streams in the session's binary messages.
const StreamsYamux = "yamux/1"

// MuxConfig is the yamux configuration of both ends: no keepalive (the
// session has its heartbeat), quiet, the default 256 KiB window per
// stream (its flow control keeps one busy tunnel from holding the
// session's reader).
func MuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.LogOutput = io.Discard
	c.StreamOpenTimeout = 10 * time.Second
	c.ConnectionWriteTimeout = 10 * time.Second
	return c
}

// Conn is a net.Conn over a WebSocket's binary messages, beside the text
// messages of its owner: the owner's read loop hands each binary message
// to Feed; Write sends binary messages (coder/websocket writes are safe
// from several goroutines).
type Conn struct {
	ws     *websocket.Conn
	pr     *io.PipeReader
	pw     *io.PipeWriter
	closed chan struct{}
	once   sync.Once
	// hdr is a yamux data frame's header waiting for its body (Write).
	hdr    []byte
	hdrBuf [yamuxHeader]byte
}

// NewConn wraps ws.
func NewConn(ws *websocket.Conn) *Conn {
	pr, pw := io.Pipe()
	return &Conn{ws: ws, pr: pr, pw: pw, closed: make(chan struct{})}
}

// Feed passes one binary message to the reader (yamux's receive loop,
// which never waits on a slow stream: the window bounds what it buffers).
func (c *Conn) Feed(b []byte) error {
	_, err := c.pw.Write(b)
	return err
}

func (c *Conn) Read(p []byte) (int, error) { return c.pr.Read(p) }

// yamuxHeader is the size of a yamux frame's header.
const yamuxHeader = 12

func (c *Conn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	// yamux writes a data frame as two Writes, its header and then its
	// body (one goroutine, its send loop, writes): the header waits here
	// and both go as one message (one flush, one TLS record) rather than
	// two.
	if c.hdr == nil && len(p) == yamuxHeader && p[1] == 0 /* data */ && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.hdrBuf = [yamuxHeader]byte(p)
		c.hdr = c.hdrBuf[:]
		return len(p), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c.hdr == nil {
		if err := c.ws.Write(ctx, websocket.MessageBinary, p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	hdr := c.hdr
	c.hdr = nil
	w, err := c.ws.Writer(ctx, websocket.MessageBinary)
	if err != nil {
		return 0, err
	}
	if _, err := w.Write(hdr); err != nil {
		_ = w.Close()
		return 0, err
	}
	if _, err := w.Write(p); err != nil {
		_ = w.Close()
		return 0, err
	}
	if err := w.Close(); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close ends the reader; the WebSocket stays its owner's.
func (c *Conn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		_ = c.pw.CloseWithError(io.EOF)
		_ = c.pr.Close()
	})
	return nil
}

type addr struct{}

func (addr) Network() string { return "websocket" }
func (addr) String() string  { return "session" }

func (c *Conn) LocalAddr() net.Addr              { return addr{} }
func (c *Conn) RemoteAddr() net.Addr             { return addr{} }
func (c *Conn) SetDeadline(time.Time) error      { return nil }
func (c *Conn) SetReadDeadline(time.Time) error  { return nil }
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

// Mux is one end of a session's streams, made at the first use: idle
// sessions (thousands per gateway) hold none.
type Mux struct {
	mu     sync.Mutex
	ws     *websocket.Conn
	client bool
	conn   *Conn
	sess   *yamux.Session
	done   bool
	// accept runs each stream the peer opens (the daemon's side).
	accept func(net.Conn)
}

// NewMux returns the gateway's end (client true: it opens streams) or the
// daemon's (accept runs each stream the gateway opens).
func NewMux(ws *websocket.Conn, client bool, accept func(net.Conn)) *Mux {
	return &Mux{ws: ws, client: client, accept: accept}
}

var errMuxClosed = errors.New("tunnel: the session ended")

func (m *Mux) session() (*yamux.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return nil, errMuxClosed
	}
	if m.sess != nil {
		return m.sess, nil
	}
	m.conn = NewConn(m.ws)
	var err error
	if m.client {
		m.sess, err = yamux.Client(m.conn, MuxConfig())
	} else {
		m.sess, err = yamux.Server(m.conn, MuxConfig())
		if err == nil {
			go func(s *yamux.Session) {
				for {
					st, err := s.Accept()
					if err != nil {
						return
					}
					go m.accept(st)
				}
			}(m.sess)
		}
	}
	return m.sess, err
}

// Feed hands a binary message of the session to the multiplexer.
func (m *Mux) Feed(b []byte) error {
	if _, err := m.session(); err != nil {
		return err
	}
	return m.conn.Feed(b)
}

// Open opens a stream (the gateway's side).
func (m *Mux) Open() (net.Conn, error) {
	s, err := m.session()
	if err != nil {
		return nil, err
	}
	return s.Open()
}

// Close ends every stream with the session.
func (m *Mux) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done = true
	if m.sess != nil {
		_ = m.sess.Close()
		_ = m.conn.Close()
	}
}
