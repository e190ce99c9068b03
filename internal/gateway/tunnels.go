package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/coder/websocket"

	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
)

// InternalTunnels is the internal API route of a tunnel to a node
// (GET .../{node}, a WebSocket): the api relays a client's tunnel here,
// and the gateway relays it on a stream of the node's session
// (docs/tunnels.md). Frames pass through unread.
const InternalTunnels = "/internal/v1/tunnels/"

func (g *Gateway) serveTunnel(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	s := g.get(node)
	switch {
	case s == nil:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the node's daemon is not in session here", http.StatusServiceUnavailable)
		return
	case s.mux == nil:
		http.Error(w, "the node's daemon offers no tunnel streams (an older compute-agent, or a runtime without guests)", http.StatusNotImplemented)
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
		if resp != nil {
			return nil, fmt.Errorf("gateway: HTTP %d", resp.StatusCode)
		}
		return nil, err
	}
	ws.SetReadLimit(tunnel.MaxFrame + 1)
	return ws, nil
}
