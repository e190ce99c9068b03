package main

// One simulated daemon: the session internal/agent holds (dial, mutual
// TLS, WebSocket upgrade, hello, welcome, a status at once and every
// heartbeat), without the costs that are this tool's own doing because it
// plays 10,000 daemons in one process (docs/benchmarks-notes.md, "the
// load tool measures the gateway, not itself"):
//
//   - the TLS handshake runs on the session's own goroutine, whose stack
//     has grown in its earlier sessions, over a TCP connection dialled
//     here; net/http's Transport would run it in a fresh goroutine (its
//     stack grown again, copy by copy, for every handshake) and start a
//     dial goroutine and a reader and a writer goroutine per connection.
//     The upgrade request is the one net/http writes (http.Request.Write,
//     with the Accept-Encoding header its Transport adds; the test
//     compares the two);
//   - one deadline on the connection bounds the dial to the welcome, and
//     one per write bounds each status, instead of a context and a timer
//     per step;
//   - each node's TLS configuration (agent.MTLSConfig, its own ticket
//     cache) and hello are built once, not at every dial;
//   - every status is the same bytes (no instances), so they are encoded
//     once for all.
//
// None of it changes what the gateway receives: the same TCP connection,
// the same TLS 1.3 handshake (hybrid key exchange, the node certificate,
// resumption from the node's own ticket cache), the same upgrade, hello
// and statuses, at the daemon's times.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"computeplane/internal/agent"
	"computeplane/internal/agentproto"
)

// Timeouts of a simulated session: the dial to the welcome (longer than
// the daemon's agent.DialTimeout: 64 handshakes share this process's one
// core) and each write.
const (
	connectTimeout = 30 * time.Second
	heartbeat      = 5 * time.Second
)

// statusFrame is every simulated daemon's status: no instances, as a node
// without VMs reports.
var statusFrame = mustJSON(agentproto.Message{Type: agentproto.TypeStatus, Status: &agentproto.Status{Instances: []agentproto.InstanceStatus{}}})

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	check(err)
	return b
}

// node is one daemon of the run: its id, certificate, TLS configuration
// with its session tickets, and hello.
type node struct {
	id    string
	cert  tls.Certificate
	roots *x509.CertPool
	hello []byte

	mu   sync.Mutex
	tls  *tls.Config        // agent.MTLSConfig with the node's ticket cache
	drop context.CancelFunc // ends the session held now (kick)

	// This daemon's part in the restart being timed (timeline.go).
	restart daemonTimes
}

func newNode(id string, cert tls.Certificate, roots *x509.CertPool) *node {
	nd := &node{id: id, cert: cert, roots: roots, hello: mustJSON(agentproto.Message{Type: agentproto.TypeHello, Hello: &agentproto.Hello{
		NodeID: id, ProtocolMin: 1, ProtocolMax: 1, AgentVersion: "sessionload", Transport: agentproto.TransportMTLS,
		Inventory: agentproto.Inventory{VCPU: 1, MemoryMiB: 1024, Runtime: "recording"}}})}
	nd.forget()
	return nd
}

// kick ends the node's session from the daemon's side, as a network
// blip or a daemon restart does: it reconnects with its delays to the
// same, running gateway.
func (nd *node) kick() {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.drop != nil {
		nd.drop()
	}
}

// forget drops the node's session tickets: its next dial is a full
// handshake. The daemon's configuration is built again around an empty
// cache.
func (nd *node) forget() {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	nd.tls = agent.MTLSConfig(nd.roots, "127.0.0.1", func() *tls.Certificate { return &nd.cert },
		tls.NewLRUClientSessionCache(agent.TicketCacheSize))
}

// hold keeps one session and reconnects as agent.Run does with one
// gateway: at once after a session that lasted agent.ShortSession,
// otherwise after agent.BackoffMin doubling to agent.DrainRetryMax (the
// cap for a minute after a dropped session), jittered (agent.RetryDelay).
func (nd *node) hold(addr string, welcomed *atomic.Int64, dialing chan struct{}, stop <-chan struct{}) {
	backoff := agent.BackoffMin
	for {
		select {
		case <-stop:
			return
		default:
		}
		if lasted := nd.session(addr, welcomed, dialing, stop); lasted >= agent.ShortSession {
			backoff = agent.BackoffMin
			continue
		}
		time.Sleep(agent.RetryDelay(backoff))
		backoff = min(2*backoff, agent.DrainRetryMax)
	}
}

// session dials, says hello and holds the session until it ends; it
// answers how long the session lasted after its welcome (0: none).
func (nd *node) session(addr string, welcomed *atomic.Int64, dialing chan struct{}, stop <-chan struct{}) time.Duration {
	// A slot from the dial until the welcome (or a failure).
	select {
	case dialing <- struct{}{}:
	case <-stop:
		return 0
	}
	dialAt := nd.restart.dialed()
	slot := true
	release := func() {
		if slot {
			slot = false
			<-dialing
		}
	}
	defer release()
	nd.mu.Lock()
	tc := nd.tls
	nd.mu.Unlock()
	dialsStarted.Add(1)
	defer func() {
		if slot {
			dialsFailed.Add(1) // no welcome
		}
	}()
	conn, raw, err := dial(addr, tc)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			dialsRefused.Add(1)
		}
		return 0
	}
	defer conn.CloseNow()
	// The connection's deadline (dial) bounds the hello and the welcome;
	// a context without one costs coder/websocket no timer.
	bg := context.Background()
	if conn.Write(bg, websocket.MessageText, nd.hello) != nil {
		return 0
	}
	_, b, err := conn.Read(bg)
	if err != nil {
		return 0
	}
	if m, err := agentproto.Decode(b); err != nil || m.Type != agentproto.TypeWelcome {
		return 0
	}
	_ = raw.SetDeadline(time.Time{})
	release()
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	nd.mu.Lock()
	nd.drop = cancel
	nd.mu.Unlock()
	welcomed.Add(1)
	welcomes.Add(1)
	nd.restart.welcomed(dialAt)
	defer welcomed.Add(-1)
	defer nd.restart.lost()
	start := time.Now()
	send := func() error {
		_ = raw.SetWriteDeadline(time.Now().Add(agent.WriteTimeout))
		return conn.Write(bg, websocket.MessageText, statusFrame)
	}
	// The daemon sends its status at once after the welcome, then every
	// heartbeat (agent: session, heartbeat). A goroutine per session, as
	// the daemon's: one sender for all would let one connection whose
	// writes stall hold back every other session's statuses.
	if send() != nil {
		return time.Since(start)
	}
	go func() {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				cancel()
				return
			case <-t.C:
				_ = send()
			}
		}
	}()
	for {
		if _, _, err := conn.Read(ctx); err != nil {
			return time.Since(start)
		}
	}
}

// dial opens the daemon's session connection to addr: TCP, the TLS
// handshake with tc on this goroutine, and the WebSocket upgrade on that
// connection. The connection's deadline, connectTimeout from now, is
// left for the caller's hello and welcome.
func dial(addr string, tc *tls.Config) (*websocket.Conn, net.Conn, error) {
	raw, err := net.DialTimeout("tcp", addr, connectTimeout)
	if err != nil {
		return nil, nil, err
	}
	_ = raw.SetDeadline(time.Now().Add(connectTimeout))
	// As the daemon's dial (agent.dialMTLS): a handshake the connection
	// cut (a gateway killed with handshakes in flight) keeps the ticket
	// crypto/tls would drop, so that the node resumes on the restarted
	// gateway.
	saved, _ := tc.ClientSessionCache.Get(tc.ServerName)
	c := tls.Client(raw, tc)
	if err := c.HandshakeContext(context.Background()); err != nil {
		_ = raw.Close()
		agent.KeepTicket(tc.ClientSessionCache, tc.ServerName, saved, err)
		return nil, nil, err
	}
	conn, _, err := websocket.Dial(context.Background(), "wss://"+addr+agentproto.SessionPath,
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: upgradeOn{c}}})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return conn, c, nil
}

// upgradeOn is an http.RoundTripper for one request, the WebSocket
// upgrade, on a connection already open (coder/websocket dials through
// an *http.Client): it writes the request as net/http's Transport does
// and hands the connection back as the response body after a 101.
type upgradeOn struct{ c net.Conn }

func (u upgradeOn) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		return nil, fmt.Errorf("sessionload: %s is not https", req.URL)
	}
	req = req.Clone(req.Context())
	// net/http's Transport asks for gzip unless told otherwise (the
	// daemon's does; the gateway ignores it on an upgrade).
	req.Header.Set("Accept-Encoding", "gzip")
	if err := req.Write(u.c); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(u.c, 1024)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return resp, nil
	}
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	resp.Body = upgraded{br, u.c}
	return resp, nil
}

// upgraded is the connection after the upgrade, read through the reader
// the response was read with (it may hold the first frames).
type upgraded struct {
	r *bufio.Reader
	net.Conn
}

func (u upgraded) Read(p []byte) (int, error) { return u.r.Read(p) }
