package agent

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mathrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto"
	"computeplane/internal/agentproto/tunnel"
)

// Timings of the session loop.
const (
	DialTimeout   = 10 * time.Second
	HelloTimeout  = 10 * time.Second
	WriteTimeout  = 10 * time.Second
	PingTimeout   = 5 * time.Second
	BackoffMin    = 200 * time.Millisecond
	BackoffMax    = 10 * time.Second
	StableSession = 30 * time.Second // a session this long resets the backoff
	RevokedWait   = 60 * time.Second
	// MaxReconnectDelay bounds a drain's delay (gateways send up to 60 s).
	MaxReconnectDelay = 2 * time.Minute
	// DrainRetryMax caps the backoff for DrainRetryWindow after a drain:
	// the drained gateway (the region's only one, or the only one that
	// answers) is usually back within seconds, and its daemons should be
	// too.
	DrainRetryMax    = time.Second
	DrainRetryWindow = time.Minute
	// HigherRungRetry is how often a session on the WebSocket fallback
	// tries mutual TLS to its gateway again (a proxy in the way may have
	// gone): when it answers, the session moves there.
	HigherRungRetry = 5 * time.Minute
)

// Options configure the daemon.
type Options struct {
	Dir      Dir
	Runtime  vmruntime.Runtime
	Volumes  string // the volume store's directory
	Declared Declared
	Version  string
	Log      *slog.Logger
	// HigherRungRetry overrides the package's HigherRungRetry (tests).
	HigherRungRetry time.Duration
	// NodeConsoleCommand is the node's break-glass shell (argv):
	// node-console tunnels run it on a terminal, SSH sessions to the node
	// run it (with -c COMMAND for a command). Empty: both are refused.
	NodeConsoleCommand []string
}

// Agent is the running daemon.
type Agent struct {
	o     Options
	dir   Dir
	log   *slog.Logger
	state *State
	key   *ecdsa.PrivateKey
	cert  atomic.Pointer[x509.Certificate]

	observed         atomic.Int64
	applyErr         atomic.Pointer[string]
	pendingInventory atomic.Pointer[agentproto.Inventory]
	status           *statusFile

	tmu         sync.Mutex
	transports  map[string]string // gateway URL -> the transport that last worked
	lastGateway gatewayRef        // the gateway of the last welcomed session

	// Resolving secret references (resolve.go): the open session's send
	// and the requests waiting for their answers.
	rmu   sync.Mutex
	rsend func(agentproto.Message)
	rwait map[string]chan *agentproto.Resolved

	// inflight are the guest commands running now.
	imu      sync.Mutex
	inflight map[string]bool

	// secrets are values resolved for guests: never in a bundle.
	secrets secretSet

	// tickets are the TLS session tickets gateways gave: the next dial
	// resumes with one.
	tickets ticketCache
}

// New loads the directory.
func New(o Options) (*Agent, error) {
	st, err := o.Dir.LoadState()
	if err != nil {
		return nil, err
	}
	key, cert, err := o.Dir.LoadIdentity()
	if err != nil {
		return nil, err
	}
	if o.Volumes == "" {
		o.Volumes = o.Dir.path("volumes")
	}
	if err := os.MkdirAll(o.Volumes, 0o700); err != nil {
		return nil, err
	}
	// The last status survives a restart: its gateway is dialled first.
	var prev Status
	_ = readJSON(o.Dir.path(fileStatus), &prev)
	prev.NodeID, prev.Connected = st.NodeID, false
	prev.Version, prev.Pid, prev.StartedAt = o.Version, os.Getpid(), time.Now().UTC()
	a := &Agent{o: o, dir: o.Dir, log: o.Log, state: st, key: key, transports: map[string]string{},
		status: &statusFile{dir: o.Dir, s: prev}, lastGateway: gatewayRef{id: prev.GatewayID, url: prev.GatewayURL}, rwait: map[string]chan *agentproto.Resolved{}, inflight: map[string]bool{}}
	if u, ok := o.Runtime.(vmruntime.SecretUser); ok {
		u.UseSecrets(a.ResolveSecrets)
	}
	a.cert.Store(cert)
	var obs struct {
		Generation int64 `json:"generation"`
	}
	_ = readJSON(o.Dir.path(fileObserved), &obs)
	a.observed.Store(obs.Generation)
	_ = readJSON(o.Dir.path(fileTransports), &a.transports)
	return a, nil
}

func (a *Agent) inventory() agentproto.Inventory {
	return inventory(a.o.Volumes, a.o.Declared, a.o.Runtime.Name(), a.o.Runtime.Accel())
}

// gatewayRef names a gateway the daemon held a session with: the id its
// welcome gave and the URL dialled. A restarted gateway keeps its URL and
// gets a new id; the list entry dialled may still carry the old one.
type gatewayRef struct{ id, url string }

func (r gatewayRef) is(g agentproto.Gateway) bool {
	return (r.id != "" && g.ID == r.id) || (r.url != "" && g.URL == r.url)
}

// transportKey is what the transport memory is kept by: the gateway's URL
// (which survives its restarts), its id when it has none.
func transportKey(g agentproto.Gateway) string {
	if g.URL != "" {
		return g.URL
	}
	return g.ID
}

// endReason says why a session ended.
type endReason struct {
	welcomed       bool
	gateway        gatewayRef    // who welcomed it
	reconnectAfter time.Duration // the gateway drains: go elsewhere after this
	drained        bool
	revoked        bool
	climbed        bool // left the fallback: mutual TLS answers again
}

// ShortSession is how long a welcomed session must last to count as a
// success of its round: a gateway that welcomes and drops at once would
// otherwise be dialled in a tight loop.
const ShortSession = time.Second

// MaxRetryAfter bounds the wait a gateway's refusal asks for
// (retryAfterMs of UNAVAILABLE).
const MaxRetryAfter = 10 * time.Second

// RetryDelay is the wait before the next round of dials at backoff: drawn
// uniformly from BackoffMin/4 to one and a half times backoff. The jitter
// spans the whole wait, not its top third (backoff plus up to half), so
// that a gateway's daemons, which all lost it at the same instant, do not
// retry in rounds with gaps between them: with the rounds at 0.2-0.3,
// 0.6-0.9 and 1.4-2.1 s, a gateway restarted in 0.35 s waited a quarter
// of a second for its first daemon (docs/benchmarks-notes.md, "all back").
// The longest wait is as before, so a dead gateway is not dialled later.
func RetryDelay(backoff time.Duration) time.Duration {
	lo, hi := BackoffMin/4, backoff+backoff/2
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(mathrand.Int64N(int64(hi-lo)+1))
}

// Run holds sessions until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.status.update(func(s *Status) { s.Connected, s.ObservedGeneration = false, a.observed.Load() })
	backoff := BackoffMin
	var avoid gatewayRef
	var quickUntil time.Time // a drain's short backoff lasts until then
	for ctx.Err() == nil {
		gws := a.order(avoid)
		avoid = gatewayRef{}
		connected := false
		for _, gw := range gws {
			conn, transport, err := a.dial(ctx, gw)
			if err != nil {
				if ctx.Err() == nil {
					a.log.Warn("no session", "gateway", gw.ID, "error", err.Error())
				}
				continue
			}
			start := time.Now()
			why := a.session(ctx, conn, gw, transport)
			a.status.update(func(s *Status) { s.Connected = false })
			if !why.welcomed {
				continue // refused: the next gateway
			}
			if why.climbed {
				// Straight back to the same gateway, mutual TLS first.
				a.log.Info("mutual TLS answers again: leaving the WebSocket fallback", "gateway", gw.ID)
				connected = true
				break
			}
			lasted := time.Since(start)
			connected = lasted >= ShortSession || why.drained || why.revoked
			if lasted >= StableSession {
				backoff = BackoffMin
			}
			// The next round starts with the other gateways: a dropped
			// gateway's nodes move at once, a draining one is left.
			avoid = why.gateway
			switch {
			case ctx.Err() != nil:
			case lasted >= ShortSession && !why.revoked && !why.drained:
				// Dropped without a drain (the gateway was killed, or the
				// network went): a restarted gateway is usually back
				// within seconds, so retry quickly for a while, as after a
				// drain (the jitter spreads the storm of a gateway's
				// daemons; each then resumes its TLS session).
				backoff, quickUntil = BackoffMin, time.Now().Add(DrainRetryWindow)
			case why.revoked:
				a.log.Error("this node's certificate was revoked; waiting before trying again")
				sleep(ctx, RevokedWait)
			case why.drained:
				// The delay spreads the drained daemons over the other
				// gateways in time. Without another gateway there is
				// nothing to spread over: the drained one (restarting,
				// most likely) is dialled again at once. Either way a
				// round without a session then retries with a short
				// backoff.
				backoff, quickUntil = BackoffMin, time.Now().Add(DrainRetryWindow)
				if a.others(why.gateway) {
					a.log.Info("gateway draining: reconnecting elsewhere", "gateway", why.gateway.id, "after", why.reconnectAfter)
					sleep(ctx, why.reconnectAfter)
				} else {
					a.log.Info("gateway draining and no other in the region: dialling it again", "gateway", why.gateway.id)
				}
			}
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !connected {
			limit := BackoffMax
			if time.Now().Before(quickUntil) {
				limit = DrainRetryMax
			}
			backoff = min(backoff, limit)
			sleep(ctx, RetryDelay(backoff))
			backoff = min(2*backoff, limit)
		}
	}
	return nil
}

// order is the gateways to try, one entry per URL: the one whose session
// worked last first (unless it is avoided), then the rest in this node's
// own order, the avoided one last. The rest are ranked by rendezvous
// hashing of node id and gateway URL, draining ones after: the region's
// daemons spread over its gateways (one list order read by all would put
// every daemon on the same gateway, and move them all at its loss), and a
// gateway's loss moves its daemons evenly over the others while each
// daemon elsewhere stays.
func (a *Agent) order(avoid gatewayRef) []agentproto.Gateway {
	a.tmu.Lock()
	last := a.lastGateway
	a.tmu.Unlock()
	var head, rest, tail []agentproto.Gateway
	seen := map[string]bool{}
	for _, g := range a.state.Gateways {
		if g.URL != "" {
			if seen[g.URL] {
				continue // a restarted gateway listed under its old id too
			}
			seen[g.URL] = true
		}
		switch {
		case avoid.is(g):
			tail = append(tail, g)
		case last.is(g):
			head = append(head, g)
		default:
			rest = append(rest, g)
		}
	}
	node := a.state.NodeID
	slices.SortStableFunc(rest, func(x, y agentproto.Gateway) int {
		if x.Draining != y.Draining {
			if x.Draining {
				return 1
			}
			return -1
		}
		return cmp.Compare(rank(node, y), rank(node, x)) // highest first
	})
	out := append(append(head, rest...), tail...)
	if len(out) == 0 && a.state.FallbackURL != "" {
		out = []agentproto.Gateway{{ID: "fallback"}} // only the public host is known
	}
	return out
}

// rank is node's rendezvous weight for gateway g.
func rank(node string, g agentproto.Gateway) uint64 {
	h := sha256.Sum256([]byte(node + "\x00" + transportKey(g)))
	return binary.BigEndian.Uint64(h[:8])
}

// others reports whether the region lists a gateway other than gw.
func (a *Agent) others(gw gatewayRef) bool {
	for _, g := range a.state.Gateways {
		if !gw.is(g) {
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// dial climbs the transport ladder for gw: the transport that last worked
// for it first, then the other.
func (a *Agent) dial(ctx context.Context, gw agentproto.Gateway) (*websocket.Conn, string, error) {
	ladder := []string{agentproto.TransportMTLS, agentproto.TransportWebSocket}
	a.tmu.Lock()
	if a.transports[transportKey(gw)] == agentproto.TransportWebSocket {
		ladder[0], ladder[1] = ladder[1], ladder[0]
	}
	a.tmu.Unlock()
	var errs []error
	for _, t := range ladder {
		var conn *websocket.Conn
		var err error
		if t == agentproto.TransportMTLS {
			conn, err = a.dialMTLS(ctx, gw)
		} else {
			conn, err = a.dialFallback(ctx)
		}
		if err == nil {
			a.remember(transportKey(gw), t)
			return conn, t, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", t, err))
		if errors.Is(err, errBusy) {
			// The gateway itself answered over mutual TLS (draining or
			// full): the rung works, the fallback would not help, and
			// must not be remembered as what works.
			break
		}
	}
	return nil, "", errors.Join(errs...)
}

// pruneTransports forgets the transports of gateways no longer listed:
// without it transports.json would grow by an entry per gateway ever seen.
func (a *Agent) pruneTransports() {
	listed := map[string]bool{}
	for _, g := range a.state.Gateways {
		listed[transportKey(g)] = true
	}
	a.tmu.Lock()
	defer a.tmu.Unlock()
	n := len(a.transports)
	maps.DeleteFunc(a.transports, func(k, _ string) bool { return !listed[k] })
	if len(a.transports) != n {
		_ = writeJSON(a.dir.path(fileTransports), a.transports)
	}
}

func (a *Agent) remember(gw, transport string) {
	a.tmu.Lock()
	defer a.tmu.Unlock()
	if a.transports[gw] == transport {
		return
	}
	a.transports[gw] = transport
	_ = writeJSON(a.dir.path(fileTransports), a.transports)
}

func (a *Agent) dialMTLS(ctx context.Context, gw agentproto.Gateway) (*websocket.Conn, error) {
	if gw.URL == "" {
		return nil, errors.New("no gateway URL")
	}
	u, err := url.Parse(gw.URL)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if ca, err := x509.ParseCertificate(a.state.ServingCA); err == nil {
		roots.AddCert(ca)
	}
	serverName := gw.ServerName
	if serverName == "" {
		serverName = u.Hostname()
	}
	tc := MTLSConfig(roots, serverName, func() *tls.Certificate {
		c := a.cert.Load()
		return &tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: a.key, Leaf: c}
	}, a.tickets.get())
	ticket, _ := tc.ClientSessionCache.Get(serverName) // crypto/tls keys a ticket by ServerName
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: false}}
	conn, resp, err := websocket.Dial(ctx, "wss://"+u.Host+agentproto.SessionPath, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		KeepTicket(tc.ClientSessionCache, serverName, ticket, err)
	}
	if err != nil && resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
		err = fmt.Errorf("%w: %v", errBusy, err)
	}
	return conn, err
}

// MTLSConfig is the TLS configuration of a daemon's mutual-TLS dial to a
// gateway: TLS 1.3 only, roots the gateway serving CA, the node
// certificate read at each handshake (a renewal applies to the next) and
// tickets, the cache of TLS session tickets: the next dial to a gateway
// of the deployment, restarted or another one, resumes the session
// instead of a full handshake (docs/gateway.md, "Session resumption").
// tools/sessionload dials with it too, so that its sessions resume as
// daemons' do.
func MTLSConfig(roots *x509.CertPool, serverName string, cert func() *tls.Certificate, tickets tls.ClientSessionCache) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert(), nil },
		ClientSessionCache:   tickets}
}

// errBusy is a gateway's refusal before the upgrade (503: it drains or is
// full), which only a gateway verified by the serving CA can give.
var errBusy = errors.New("the gateway takes no session now")

// dialFallback opens the public host's session endpoint and proves the
// node's identity by signing the challenge.
func (a *Agent) dialFallback(ctx context.Context) (*websocket.Conn, error) {
	if a.state.FallbackURL == "" {
		return nil, errors.New("no fallback URL")
	}
	if _, err := checkAPIURL(a.state.FallbackURL); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, a.state.FallbackURL, nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(agentproto.MaxMessageBytes)
	m, err := read(ctx, conn)
	if err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	if m.Type != agentproto.TypeChallenge {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("expected a challenge, got %s", m.Type)
	}
	digest := sha256.Sum256(append([]byte(agentproto.ProofContext), m.Challenge.Nonce...))
	sig, err := ecdsa.SignASN1(rand.Reader, a.key, digest[:])
	if err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	if err := write(ctx, conn, agentproto.Message{Type: agentproto.TypeProof,
		Proof: &agentproto.Proof{Chain: [][]byte{a.cert.Load().Raw}, Signature: sig}}); err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	return conn, nil
}

func write(ctx context.Context, conn *websocket.Conn, m agentproto.Message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	return conn.Write(ctx, websocket.MessageText, b)
}

func read(ctx context.Context, conn *websocket.Conn) (agentproto.Message, error) {
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return agentproto.Message{}, err
	}
	if typ != websocket.MessageText {
		return agentproto.Message{}, errors.New("a binary frame")
	}
	return agentproto.Decode(b)
}

// readOrFeed reads the next control message, handing the binary messages
// before it (tunnel streams) to mux.
func readOrFeed(ctx context.Context, conn *websocket.Conn, mux *tunnel.Mux) (agentproto.Message, error) {
	for {
		// Binary messages stream into mux as they arrive.
		typ, b, err := tunnel.ReadMessage(ctx, conn, mux)
		if err != nil {
			return agentproto.Message{}, err
		}
		if typ == websocket.MessageText {
			return agentproto.Decode(b)
		}
	}
}

// session speaks on one connection until it ends.
func (a *Agent) session(ctx context.Context, conn *websocket.Conn, gw agentproto.Gateway, transport string) endReason {
	defer conn.CloseNow()
	conn.SetReadLimit(agentproto.MaxMessageBytes)
	hello := agentproto.Message{Type: agentproto.TypeHello, Hello: &agentproto.Hello{
		NodeID: a.state.NodeID, ProtocolMin: agentproto.ProtocolMin, ProtocolMax: agentproto.ProtocolMax,
		AgentVersion: a.o.Version, Transport: transport, Inventory: a.inventory(), ObservedGeneration: a.observed.Load(),
	}}
	// Tunnels ride yamux streams in the session's binary messages: into
	// guests, and to the node itself (its console), which every daemon
	// answers (refusing without --node-console-command).
	hello.Hello.Streams = tunnel.StreamsYamux
	mux := tunnel.NewMux(conn, false, a.serveTunnel)
	defer mux.Close()
	if err := write(ctx, conn, hello); err != nil {
		return endReason{}
	}
	hctx, cancel := context.WithTimeout(ctx, HelloTimeout)
	m, err := read(hctx, conn)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("no welcome", "gateway", gw.ID, "error", err.Error())
		}
		return endReason{}
	}
	if m.Type == agentproto.TypeError {
		a.log.Warn("session refused", "gateway", gw.ID, "code", m.Error.Code, "message", m.Error.Message, "retryAfterMs", m.Error.RetryAfterMS)
		if d := time.Duration(m.Error.RetryAfterMS) * time.Millisecond; d > 0 {
			// The gateway's database did not answer (UNAVAILABLE): wait as
			// it asks (at most MaxRetryAfter), with the jitter that
			// spreads its daemons, before the next gateway or round.
			d = min(d, MaxRetryAfter)
			sleep(ctx, d+time.Duration(mathrand.Int64N(int64(d/2)+1)))
		}
		return endReason{}
	}
	if m.Type != agentproto.TypeWelcome {
		return endReason{}
	}
	w := m.Welcome
	if len(w.Gateways) > 0 {
		a.state.Gateways = w.Gateways
		if err := a.dir.SaveState(a.state); err != nil {
			a.log.Warn("saving the gateways", "error", err.Error())
		}
	}
	ref := gatewayRef{id: w.GatewayID, url: gw.URL}
	a.tmu.Lock()
	a.lastGateway = ref
	a.tmu.Unlock()
	a.pruneTransports()
	a.log.Info("session open", "gateway", w.GatewayID, "transport", transport, "epoch", w.SessionEpoch, "protocol", w.Protocol)
	a.status.update(func(s *Status) {
		s.GatewayID, s.GatewayURL, s.Transport, s.SessionEpoch, s.Connected, s.ObservedGeneration = w.GatewayID, gw.URL, transport, w.SessionEpoch, true, a.observed.Load()
	})

	sctx, stop := context.WithCancel(ctx)
	// Reads, writes and pings use a context that ending the session does
	// not cancel (coder/websocket drops the connection when one is
	// cancelled mid-frame): they are bounded by their own timeouts and the
	// session ends by closing the connection, with a close handshake when
	// the daemon stops.
	rctx := context.WithoutCancel(ctx)
	send := func(m agentproto.Message) {
		if sctx.Err() != nil {
			return
		}
		if err := write(rctx, conn, m); err != nil {
			stop()
		}
	}
	// Specs and commands run beside the reader, so that control frames
	// (pings) are answered while a VM boots.
	specs := make(chan *agentproto.Spec, 1)
	commands := make(chan *agentproto.Command, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Add(4)
	go func() { defer wg.Done(); a.applyLoop(sctx, specs, send) }()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-sctx.Done():
				return
			case c := <-commands:
				if !guestKinds[c.Kind] {
					send(agentproto.Message{Type: agentproto.TypeResult, Result: a.execute(c)})
					continue
				}
				// Guest commands (an exec may run for minutes, a snapshot
				// copies files) run beside each other, at most
				// MaxGuestCommands; a re-send of one in flight waits for
				// its first run's result.
				started, err := a.begin(c.ID)
				if err != nil {
					// Not journaled: the answer is final for this call,
					// and the command is never run.
					send(agentproto.Message{Type: agentproto.TypeResult, Result: &agentproto.Result{ID: c.ID, Error: err.Error()}})
					continue
				}
				if started {
					go func() {
						defer a.finish(c.ID)
						send(agentproto.Message{Type: agentproto.TypeResult, Result: a.execute(c)})
					}()
				}
			}
		}
	}()
	go func() { defer wg.Done(); a.heartbeat(sctx, conn, w.HeartbeatMS, send) }()
	var climbed atomic.Bool
	if transport == agentproto.TransportWebSocket && gw.URL != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if a.climb(sctx, gw) {
				climbed.Store(true)
				stop()
			}
		}()
	}
	go func() {
		defer wg.Done()
		<-sctx.Done()
		switch {
		case ctx.Err() != nil:
			_ = conn.Close(websocket.StatusGoingAway, "the daemon stops")
		case climbed.Load():
			_ = conn.Close(websocket.StatusNormalClosure, "moving to mutual TLS")
		default:
			_ = conn.CloseNow()
		}
	}()
	send(a.statusMessage(sctx))
	a.setSender(send)
	defer a.setSender(nil)

	why := endReason{welcomed: true, gateway: ref}
	for {
		m, err := readOrFeed(rctx, conn, mux)
		if err != nil {
			if sctx.Err() == nil {
				a.log.Info("session ended", "gateway", w.GatewayID, "error", err.Error())
			}
			why.climbed = climbed.Load()
			return why
		}
		switch m.Type {
		case agentproto.TypeSpec:
			select { // the newest spec replaces one not yet applied
			case <-specs:
			default:
			}
			specs <- m.Spec
		case agentproto.TypeCommand:
			select {
			case commands <- m.Command:
			default:
				a.log.Warn("command queue full; the sweeper will send it again", "command", m.Command.ID)
			}
		case agentproto.TypeResolved:
			a.resolved(m.Resolved)
		case agentproto.TypeRenewed:
			if err := a.renewed(m.Renewed.Certificate); err != nil {
				a.log.Warn("a renewed certificate refused", "error", err.Error())
			}
		case agentproto.TypeReconnect:
			why.drained, why.reconnectAfter = true, time.Duration(min(max(m.Reconnect.DelayMS, 0), MaxReconnectDelay.Milliseconds()))*time.Millisecond
			_ = conn.Close(websocket.StatusNormalClosure, "reconnecting elsewhere")
			return why
		case agentproto.TypeRevoked:
			why.revoked = true
			_ = conn.Close(websocket.StatusNormalClosure, "revoked")
			return why
		case agentproto.TypeError:
			a.log.Warn("the gateway reports an error", "code", m.Error.Code, "message", m.Error.Message)
		}
	}
}

// climb tries mutual TLS to gw every HigherRungRetry while a fallback
// session runs, and reports when it answers (remembered for the next
// dial). The probe upgrades and closes before its hello: the gateway opens
// no session for it.
func (a *Agent) climb(ctx context.Context, gw agentproto.Gateway) bool {
	every := a.o.HigherRungRetry
	if every <= 0 {
		every = HigherRungRetry
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		conn, err := a.dialMTLS(ctx, gw)
		if err != nil {
			continue
		}
		_ = conn.CloseNow()
		a.remember(transportKey(gw), agentproto.TransportMTLS)
		return true
	}
}

// renewed keeps a certificate the gateway issued for the node's key: on
// disk for the next start, in memory for the next dial.
func (a *Agent) renewed(der []byte) error {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&a.key.PublicKey) {
		return errors.New("not for the node's key")
	}
	if err := a.dir.SaveCert(c.Raw); err != nil {
		return err
	}
	a.cert.Store(c)
	a.tickets.reset() // the next session presents the new certificate
	a.log.Info("certificate renewed", "notAfter", c.NotAfter)
	return nil
}

// applyLoop applies each spec newer than the observed generation, then
// reports; an older or equal one is only reported (idempotent by
// generation).
func (a *Agent) applyLoop(ctx context.Context, specs <-chan *agentproto.Spec, send func(agentproto.Message)) {
	for {
		select {
		case <-ctx.Done():
			return
		case sp := <-specs:
			if sp.Generation > a.observed.Load() {
				verr := applyVolumes(a.o.Volumes, sp.Body.Volumes)
				_, err := a.o.Runtime.Apply(ctx, sp.Generation, sp.Body)
				err = errors.Join(verr, err)
				msg := ""
				if err != nil {
					msg = err.Error()
					a.log.Warn("applying a spec", "generation", sp.Generation, "error", msg)
				}
				a.applyErr.Store(&msg)
				a.observed.Store(sp.Generation)
				_ = writeJSON(a.dir.path(fileObserved), map[string]int64{"generation": sp.Generation})
				a.status.update(func(s *Status) { s.ObservedGeneration = sp.Generation })
			}
			send(a.statusMessage(ctx))
		}
	}
}

func (a *Agent) statusMessage(ctx context.Context) agentproto.Message {
	store, volumes := scanVolumes(a.o.Volumes)
	st := &agentproto.Status{ObservedGeneration: a.observed.Load(), Instances: a.o.Runtime.Observe(ctx),
		VolumeStore: store, Volumes: volumes}
	if e := a.applyErr.Load(); e != nil {
		st.ApplyError = *e
	}
	if inv := a.pendingInventory.Swap(nil); inv != nil {
		st.Inventory = inv
	}
	if st.Instances == nil {
		st.Instances = []agentproto.InstanceStatus{}
	}
	return agentproto.Message{Type: agentproto.TypeStatus, Status: st}
}

// heartbeat sends a status every interval, pings the gateway (a dead one
// ends the session), and asks for a new certificate at two thirds of its
// life.
func (a *Agent) heartbeat(ctx context.Context, conn *websocket.Conn, ms int64, send func(agentproto.Message)) {
	if ms <= 0 {
		ms = 5000
	}
	t := time.NewTicker(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	var asked time.Time
	changes := a.o.Runtime.Changes()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			send(a.statusMessage(ctx)) // a boot finished, a VM died
			continue
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PingTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil {
			a.log.Warn("the gateway does not answer pings", "error", err.Error())
			_ = conn.CloseNow()
			return
		}
		send(a.statusMessage(ctx))
		c := a.cert.Load()
		renewAt := c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
		if time.Now().After(renewAt) && time.Since(asked) > time.Minute {
			asked = time.Now()
			csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: a.state.NodeID}}, a.key)
			if err == nil {
				send(agentproto.Message{Type: agentproto.TypeRenew, Renew: &agentproto.Renew{CSR: csr}})
			}
		}
	}
}
