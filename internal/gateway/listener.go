package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"computeplane/internal/agentproto"
)

// The mutual-TLS listener is served without net/http's server: a
// gateway holds thousands of idle sessions, and net/http's connection
// keeps a 4 KiB reader and a 4 KiB writer per connection for as long as
// the hijacked session lives. Here the TLS handshake and the one upgrade
// request are read with small buffers, then the WebSocket library takes
// the connection over.

// HandshakeTimeout bounds a connection's TLS handshake and upgrade request.
const HandshakeTimeout = 10 * time.Second

const (
	upgradeReadBuffer  = 512 // the upgrade request's header lines, then frame headers
	upgradeWriteBuffer = 512 // WebSocket frames are written through it
)

// listener accepts daemon connections until closed.
type listener struct {
	g     *Gateway
	ln    net.Listener
	tls   *tls.Config
	mu    sync.Mutex
	conns map[net.Conn]struct{} // in their handshake, closed with the listener
}

func (l *listener) serve() {
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: wait a little, like net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.g.o.Log.Warn("gateway accept", "error", err.Error(), "retryIn", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		l.g.handshakes.spawn(func() { l.handle(c) }) // go l.handle(c), on a grown stack
	}
}

func (l *listener) track(c net.Conn, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on {
		l.conns[c] = struct{}{}
	} else {
		delete(l.conns, c)
	}
}

// close stops accepting and drops connections still in their handshake.
func (l *listener) close() {
	_ = l.ln.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Close()
	}
}

// handle runs the handshake and the upgrade request, then the session.
func (l *listener) handle(raw net.Conn) {
	l.track(raw, true)
	tc, rec, err := l.handshake(raw)
	if err != nil {
		l.track(raw, false)
		_ = raw.Close()
		return
	}
	statHandshakes.Add(1)
	plain := &plainConn{Conn: tc, rec: rec}
	br := bufio.NewReaderSize(plain, upgradeReadBuffer)
	req, err := http.ReadRequest(br)
	l.track(raw, false)
	if err != nil {
		_ = raw.Close()
		return
	}
	state := tc.ConnectionState()
	req.TLS = &state
	req.RemoteAddr = raw.RemoteAddr().String()
	req = req.WithContext(l.g.ctx)
	_ = raw.SetDeadline(time.Time{})
	w := &upgradeWriter{conn: plain, br: br, header: http.Header{}}
	if req.URL.Path != agentproto.SessionPath {
		http.Error(w, "not found", http.StatusNotFound)
	} else {
		l.g.serveMTLS(w, req, newIdleWait(raw, plain, br))
	}
	if !w.hijacked {
		_ = tc.Close()
	}
}

// handshake runs the TLS handshake on raw, within HandshakeTimeout; a
// failed one has sent its alert when it returns.
func (l *listener) handshake(raw net.Conn) (*tls.Conn, *recordConn, error) {
	// crypto/tls reads one record at a time from recordConn, and the
	// upgrade and frames are read through plainConn: together they tell
	// an idle session when it may wait on the socket (idle.go).
	rec := &recordConn{Conn: raw}
	tc := tls.Server(rec, l.tls)
	_ = raw.SetDeadline(time.Now().Add(HandshakeTimeout))
	ctx, cancel := context.WithTimeout(l.g.ctx, HandshakeTimeout)
	defer cancel()
	// The handshake computes only in its turns (handshakes.go).
	rec.turn = &handshakeTurn{t: l.g.turns, ctx: ctx}
	err := tc.HandshakeContext(ctx)
	rec.turn.done()
	rec.turn = nil
	if err != nil {
		rec.release()
	}
	return tc, rec, err
}

// upgradeWriter is the http.ResponseWriter of one upgrade request on a
// connection of our own: it writes a refusal and closes, or hands the
// connection over (Hijack) with small buffers.
type upgradeWriter struct {
	conn     net.Conn
	br       *bufio.Reader
	header   http.Header
	wrote    bool
	hijacked bool
}

func (w *upgradeWriter) Header() http.Header { return w.header }

func (w *upgradeWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if status != http.StatusSwitchingProtocols {
		w.header.Set("Connection", "close")
	}
	bw := bufio.NewWriterSize(w.conn, upgradeWriteBuffer)
	_, _ = fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	_ = w.header.Write(bw)
	_, _ = bw.WriteString("\r\n")
	_ = bw.Flush()
}

func (w *upgradeWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		if w.header.Get("Content-Length") == "" {
			w.header.Set("Content-Length", strconv.Itoa(len(b)))
		}
		w.WriteHeader(http.StatusOK)
	}
	return w.conn.Write(b)
}

// Hijack hands the connection over after the 101 answer.
func (w *upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, errors.New("gateway: hijacked twice")
	}
	w.hijacked = true
	return w.conn, bufio.NewReadWriter(w.br, bufio.NewWriterSize(w.conn, upgradeWriteBuffer)), nil
}
