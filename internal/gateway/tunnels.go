package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
)

// InternalTunnels is the internal API route of a tunnel to a node
// (.../{node}): the api relays a client's tunnel here, and the gateway
// relays it on a stream of the node's session (docs/tunnels.md). Frames
// pass through unread. POST is the api's way: an HTTP/2 request whose
// body carries the frames towards the daemon and whose response's body
// the daemon's, every tunnel to this gateway on one connection. GET (a
// WebSocket, one connection per tunnel) is kept for apis of an older
// release.
const InternalTunnels = "/internal/v1/tunnels/"

// tunnelBusyRetry is the Retry-After (seconds) of a tunnel beyond the
// open bounds: tunnels are long, a second would be too eager.
const tunnelBusyRetry = 5

// tunnelWindow is the HTTP/2 flow-control window of one tunnel on the
// internal API, both ways: what the gateway (or the api) buffers at most
// for a tunnel whose other side is slow, as yamux's window on the
// daemon's side.
const tunnelWindow = 256 << 10

// maxH2Frame is the largest HTTP/2 frame the api reads from a gateway: a
// tunnel's largest frame in one (the default, 16 KiB, cuts it in five).
const maxH2Frame = 128 << 10

// openTunnel admits a tunnel to the request's node within the open bounds
// and opens its stream; otherwise it answers the refusal. release ends
// the tunnel's count.
func (g *Gateway) openTunnel(w http.ResponseWriter, r *http.Request) (st net.Conn, s *session, release func()) {
	node := r.PathValue("node")
	s = g.get(node)
	switch {
	case s == nil:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the node's daemon is not in session here", http.StatusServiceUnavailable)
		return nil, nil, nil
	case s.mux == nil:
		http.Error(w, "the node's daemon offers no tunnel streams (an older compute-agent)", http.StatusNotImplemented)
		return nil, nil, nil
	}
	if g.draining.Load() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the gateway is draining: the node's daemon moves to another", http.StatusServiceUnavailable)
		return nil, nil, nil
	}
	// Counted before the stream opens, so that a burst cannot pass the
	// bounds; released when the tunnel ends.
	n, all := s.tunnels.Add(1), g.tunnels.Add(1)
	release = func() { s.tunnels.Add(-1); g.tunnels.Add(-1) }
	if max := g.o.TunnelsPerNode; max > 0 && n > int64(max) {
		release()
		w.Header().Set("Retry-After", fmt.Sprint(tunnelBusyRetry))
		http.Error(w, fmt.Sprintf("the node has %d tunnels open (tunnels.limits.openPerNode)", max), http.StatusServiceUnavailable)
		return nil, nil, nil
	}
	if max := g.o.TunnelsPerGateway; max > 0 && all > int64(max) {
		release()
		w.Header().Set("Retry-After", fmt.Sprint(tunnelBusyRetry))
		http.Error(w, fmt.Sprintf("the gateway has %d tunnels open (tunnels.limits.openPerGateway)", max), http.StatusServiceUnavailable)
		return nil, nil, nil
	}
	st, err := s.mux.Open()
	if err != nil {
		release()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "no stream to the node: "+err.Error(), http.StatusServiceUnavailable)
		return nil, nil, nil
	}
	return st, s, release
}

// serveTunnelStream relays a tunnel on an HTTP/2 request (POST): the
// request's body to the daemon's stream, the stream to the response. Per
// open tunnel it holds two goroutines (this handler and the body's
// reader), the stream and HTTP/2's stream state; a frame's buffer only
// while the frame passes (tunnel.CopyFrame).
func (g *Gateway) serveTunnelStream(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor < 2 {
		http.Error(w, "a tunnel stream is an HTTP/2 request", http.StatusHTTPVersionNotSupported)
		return
	}
	st, _, release := g.openTunnel(w, r)
	if st == nil {
		return
	}
	defer release()
	relayStream(w, r, st)
}

// relayStream relays frames between an HTTP/2 request and a stream until
// the stream's end (the daemon's side, or the session's), which it
// closes.
func relayStream(w http.ResponseWriter, r *http.Request, st net.Conn) {
	defer st.Close()
	// A tunnel outlives the server's request deadlines.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		// api -> daemon; the api's end (its request's body ends) closes
		// the stream.
		defer close(done)
		defer st.Close()
		for {
			if _, err := tunnel.CopyFrame(st, r.Body); err != nil {
				return
			}
		}
	}()
	// The session's end closes its streams: this loop ends then.
	out := flushWriter{w, rc}
	for {
		if _, err := tunnel.CopyFrame(out, st); err != nil {
			break
		}
	}
	// The body's reader returns once the body is closed (a handler may
	// not read it after returning).
	_ = r.Body.Close()
	<-done
}

// flushWriter sends each write at once (a frame is a keystroke or a
// chunk of output).
type flushWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// serveTunnel relays a tunnel on a WebSocket (GET, an api of an older
// release).
func (g *Gateway) serveTunnel(w http.ResponseWriter, r *http.Request) {
	st, s, release := g.openTunnel(w, r)
	if st == nil {
		return
	}
	defer release()
	defer st.Close()
	ws, err := websocket.Accept(clearDeadlines{w}, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(tunnel.MaxFrame + 1)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		// api -> daemon; the api's end closes the stream.
		defer st.Close()
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if len(b) == 0 || tunnel.WriteFrame(st, b[0], b[1:]) != nil {
				return
			}
		}
	}()
	for {
		f, err := tunnel.NextFrame(st)
		if err != nil {
			break
		}
		err = ws.Write(ctx, websocket.MessageBinary, f.B)
		f.Release()
		if err != nil {
			return
		}
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
}

// tunnelDialTimeout bounds a tunnel's request until the gateway answers
// (the stream is then open); the tunnel itself lasts.
const tunnelDialTimeout = 5 * time.Second

// DialTunnel opens a tunnel to node through the internal API of the
// gateway holding its session: the api's side of the relay, an HTTP/2
// request on the connection every tunnel (and call) to that gateway
// shares.
func (c *InternalClient) DialTunnel(ctx context.Context, node string) (*tunnel.Upstream, error) {
	if _, err := c.client(); err != nil {
		return nil, err
	}
	u, err := db.New(c.Store.Pool()).NodeGatewayInternalURL(ctx, node)
	if err != nil || u == "" {
		return nil, errors.New("the node is out of session, or its gateway has no internal API")
	}
	return dialStream(ctx, c.stream, u+InternalTunnels+node)
}

// dialStream opens a tunnel's request (POST url) on hc. The request
// outlives ctx (the api's handler): only its answer is bounded, by ctx and
// tunnelDialTimeout.
func dialStream(ctx context.Context, hc *http.Client, url string) (*tunnel.Upstream, error) {
	life, end := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, end)
	timer := time.AfterFunc(tunnelDialTimeout, end)
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(life, http.MethodPost, url, pr)
	if err != nil {
		end()
		return nil, err
	}
	resp, err := hc.Do(req)
	bounded := stop() && timer.Stop()
	if err == nil && !bounded {
		_ = resp.Body.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		end()
		_ = pw.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		// The reason is read before end cancels the request, which would
		// cut its body short, and within the dial's bound.
		cut := time.AfterFunc(tunnelDialTimeout, end)
		reason := readReason(resp)
		cut.Stop()
		_ = resp.Body.Close()
		end()
		_ = pw.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			// Busy, draining or the node away: worth a retry.
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			return nil, &tunnel.Busy{Why: "gateway: " + http.StatusText(resp.StatusCode) + " " + reason,
				RetryAfter: time.Duration(max(secs, 1)) * time.Second}
		}
		return nil, fmt.Errorf("gateway: HTTP %d %s", resp.StatusCode, reason)
	}
	return tunnel.NewUpstream(resp.Body, pw, end), nil
}

// readReason is the first line of a refusal's body (coder/websocket keeps
// up to 1 KiB of it), for the api's error message.
func readReason(resp *http.Response) string {
	if resp.Body == nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	line, _, _ := strings.Cut(string(b), "\n")
	return "(" + strings.TrimSpace(line) + ")"
}
