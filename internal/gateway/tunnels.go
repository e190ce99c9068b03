package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
)

// InternalTunnels is the internal API route of a tunnel to a node
// (GET .../{node}, a WebSocket): the api relays a client's tunnel here,
// and the gateway relays it on a stream of the node's session
// (docs/tunnels.md). Frames pass through unread.
const InternalTunnels = "/internal/v1/tunnels/"

// tunnelBusyRetry is the Retry-After (seconds) of a tunnel beyond the
// open bounds: tunnels are long, a second would be too eager.
const tunnelBusyRetry = 5

func (g *Gateway) serveTunnel(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	s := g.get(node)
	switch {
	case s == nil:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the node's daemon is not in session here", http.StatusServiceUnavailable)
		return
	case s.mux == nil:
		http.Error(w, "the node's daemon offers no tunnel streams (an older compute-agent)", http.StatusNotImplemented)
		return
	}
	if g.draining.Load() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the gateway is draining: the node's daemon moves to another", http.StatusServiceUnavailable)
		return
	}
	// Counted before the stream opens, so that a burst cannot pass the
	// bounds; released when the tunnel ends.
	n, all := s.tunnels.Add(1), g.tunnels.Add(1)
	defer s.tunnels.Add(-1)
	defer g.tunnels.Add(-1)
	if max := g.o.TunnelsPerNode; max > 0 && n > int64(max) {
		w.Header().Set("Retry-After", fmt.Sprint(tunnelBusyRetry))
		http.Error(w, fmt.Sprintf("the node has %d tunnels open (tunnels.limits.openPerNode)", max), http.StatusServiceUnavailable)
		return
	}
	if max := g.o.TunnelsPerGateway; max > 0 && all > int64(max) {
		w.Header().Set("Retry-After", fmt.Sprint(tunnelBusyRetry))
		http.Error(w, fmt.Sprintf("the gateway has %d tunnels open (tunnels.limits.openPerGateway)", max), http.StatusServiceUnavailable)
		return
	}
	st, err := s.mux.Open()
	if err != nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "no stream to the node: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
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
		k, p, err := tunnel.ReadFrame(st)
		if err != nil {
			break
		}
		if err := ws.Write(ctx, websocket.MessageBinary, append([]byte{k}, p...)); err != nil {
			return
		}
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
}

// DialTunnel opens a tunnel to node through the internal API of the
// gateway holding its session: the api's side of the relay.
func (c *InternalClient) DialTunnel(ctx context.Context, node string) (*websocket.Conn, error) {
	hc, err := c.client()
	if err != nil {
		return nil, err
	}
	u, err := db.New(c.Store.Pool()).NodeGatewayInternalURL(ctx, node)
	if err != nil || u == "" {
		return nil, errors.New("the node is out of session, or its gateway has no internal API")
	}
	// The client's 2 s timeout bounds the handshake only: the
	// connection outlives it.
	dial := *hc
	dial.Timeout = 0
	ws, resp, err := websocket.Dial(ctx, "wss://"+strings.TrimPrefix(u, "https://")+InternalTunnels+node, &websocket.DialOptions{HTTPClient: &dial})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			// Busy, draining or the node away: worth a retry.
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			return nil, &tunnel.Busy{Why: "gateway: " + http.StatusText(resp.StatusCode) + " " + readReason(resp),
				RetryAfter: time.Duration(max(secs, 1)) * time.Second}
		}
		if resp != nil {
			return nil, fmt.Errorf("gateway: HTTP %d", resp.StatusCode)
		}
		return nil, err
	}
	ws.SetReadLimit(tunnel.MaxFrame + 1)
	return ws, nil
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
