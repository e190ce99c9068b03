// Package gateway is the gateway role: the mutual-TLS listener node
// daemons dial, one WebSocket session per daemon, the desired specs and
// signed commands it carries to them and the status it brings back.
//
// A gateway holds a lease of its own (leases.name gateway/<id>, 20 s,
// renewed every 5 s) and a row in gateways; a node's session row names
// the gateway holding it and a session epoch every new session raises, so a
// gateway that lost a session (the daemon moved, the lease expired) can no
// longer write for it. Work reaches a gateway through the notifier (topic
// Topic(id), woken by whoever wrote a spec or a command) and, as a
// fallback, its one-second loop.
package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/config"
	"computeplane/internal/ids"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/pki"
	"computeplane/internal/store"
)

// Timings of the gateway (Limits: leases, shutdown).
const (
	LeaseTTL      = 20 * time.Second
	RenewEvery    = 5 * time.Second
	Poll          = time.Second // the loop that runs without a wake-up
	ListenerGrace = 2 * time.Second
	HelloTimeout  = 10 * time.Second
	WriteTimeout  = 10 * time.Second
	HeartbeatMS   = 5000
	// SilentAfter ends a session whose daemon sent nothing for three
	// heartbeats: a peer gone without closing (a partition) would
	// otherwise hold its node up forever.
	SilentAfter = 3 * HeartbeatMS * time.Millisecond
)

// Options configure a gateway.
type Options struct {
	Config *config.Gateway
	// NodeCARoots, when set (pki.nodeCa.cert), replaces the bundle's node
	// CA as the roots of client certificates; a file is re-read every 60 s.
	NodeCARoots config.PEM
	Bundle      func() (*pki.Bundle, error)
	Store       *store.Store
	Notifier    *notify.Notifier
	Log         *slog.Logger
	Now         func() time.Time
	// TrustVersion is the lowest trust bundle version (pki.trustVersion).
	TrustVersion int
	// Work applies a daemon's statuses (instances, volumes, usage) and
	// command results, each in the transaction that writes it; nil is a
	// registry without handlers.
	Work *nodework.Registry
	// OnResolve resolves the secret references of the user data of an
	// instance on node (nil: the gateway resolves none). Its errors reach
	// the daemon as text.
	OnResolve func(ctx context.Context, node, instanceID string, refs []string) (map[string]string, error)
	// TunnelsPerNode and TunnelsPerGateway bound the open tunnels
	// (tunnels.limits.openPerNode, openPerGateway); beyond them a tunnel
	// is refused, the api answering UNAVAILABLE with retryAfterMs. 0: no
	// bound.
	TunnelsPerNode, TunnelsPerGateway int
}

// Gateway is one running gateway role.
type Gateway struct {
	o      Options
	id     string
	bundle *pki.Bundle
	roots  *reloading[*rootSet]
	cert   *reloading[*tls.Certificate]
	revoke revocationSet
	chains *chainCache // client chains that verified (chaincache.go)
	bursts *burstPool  // goroutines the sessions' message bursts run on (bursts.go)
	// goroutines the connections' handshakes run on (bursts.go)
	handshakes *burstPool
	// turns bounds the handshakes computing at once (handshakes.go)
	turns *turns

	mu       sync.Mutex
	sessions map[string]*session // by node id
	epoch    atomic.Int64        // of the lease
	draining atomic.Bool
	tunnels  atomic.Int64 // open tunnels, of every node
	// gwList is the region's gateways as welcomes name them
	// (welcomeGateways).
	gwList struct {
		mu   sync.Mutex
		at   time.Time
		list []agentproto.Gateway
	}
	// trust is the roots new handshakes verify against and the config
	// they run on, its ticket keys bound to those roots (tickets.go);
	// trustMu serializes building a new one.
	trust   atomic.Pointer[trust]
	trustMu sync.Mutex
	// hellos gathers the session rows of hellos arriving together
	// (hellos.go).
	hellos *helloBatcher
	// touchedAt is when touch last ran (unix nanoseconds).
	touchedAt atomic.Int64
	// opened is the nodes whose sessions opened, for their pending specs
	// and commands (dispatchOpened).
	opened openedNodes

	ctx    context.Context // of the gateway's life; sessions derive from it
	cancel context.CancelFunc
	lis    *listener
	// trustVersion is the version of the trust bundle daemons are told.
	trustVersion int
	internal     *http.Server // the internal control API, nil without one
	// internalURL is where the internal API listens, published in the
	// gateway's row.
	internalURL string
	ln          net.Listener
	wg          sync.WaitGroup // the gateway's loops
	handlers    sync.WaitGroup // session handlers, until their row is closed
}

// New checks the gateway's configuration: it refuses (INVALID_CONFIG)
// without a region, without node CA roots or without a trust domain.
func New(o Options) (*Gateway, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Work == nil {
		o.Work = &nodework.Registry{}
	}
	c := o.Config
	if c == nil {
		return nil, &config.Error{Option: "gateway", Message: "the gateway role needs the gateway option"}
	}
	if c.Region == "" {
		return nil, &config.Error{Option: "gateway.region", Message: "the gateway role needs a region"}
	}
	b, err := o.Bundle()
	if err != nil {
		return nil, &config.Error{Option: "pki", Message: "the gateway role needs node CA roots and a trust domain: " + err.Error()}
	}
	if b.TrustDomain == "" {
		return nil, &config.Error{Option: "pki", Message: "the gateway role needs a trust domain"}
	}
	g := &Gateway{o: o, id: ids.New("gw"), bundle: b, sessions: map[string]*session{}, chains: newChainCache(chainCacheSize),
		bursts: newBurstPool(burstWorkers, burstLinger), handshakes: newBurstPool(handshakeWorkers, handshakeLinger)}
	g.hellos = newHelloBatcher(g)
	g.opened.wake = make(chan struct{}, 1)
	g.turns = newTurns(handshakeBound())
	if !o.NodeCARoots.IsZero() {
		g.roots, err = newReloading("node CA roots", rootsReader(o.NodeCARoots), o.Now, o.Log)
	} else {
		g.roots, err = newReloading("node CA roots", func() (*rootSet, error) {
			return newRootSet([]*x509.Certificate{b.NodeCA.Cert}), nil
		}, o.Now, o.Log)
	}
	if err != nil {
		return nil, &config.Error{Option: "pki.nodeCa", Message: err.Error()}
	}
	if c.TLS != nil {
		g.cert, err = newReloading("gateway.tls", keyPairReader(c.TLS), o.Now, o.Log)
		if err != nil {
			return nil, &config.Error{Option: "gateway.tls", Message: err.Error()}
		}
	} else {
		u, _ := url.Parse(c.URL)
		hosts := []string{u.Hostname(), "localhost", "127.0.0.1", "::1"}
		if c.ServerName != "" {
			hosts = append(hosts, c.ServerName)
		}
		own, err := b.IssueServing(hosts)
		if err != nil {
			return nil, err
		}
		g.cert, _ = newReloading("serving certificate", func() (*tls.Certificate, error) { return &own, nil }, o.Now, o.Log)
	}
	return g, nil
}

// ID is the gateway's id (its row and lease).
func (g *Gateway) ID() string { return g.id }

// Addr is the listener's address once started.
func (g *Gateway) Addr() net.Addr { return g.ln.Addr() }

func (g *Gateway) leaseName() string { return "gateway/" + g.id }

func (g *Gateway) q() *db.Queries { return db.New(g.o.Store.Pool()) }

// Start takes the lease, writes the gateway's row, opens the mutual-TLS
// listener and starts the loops. It returns once the listener is open.
func (g *Gateway) Start(ctx context.Context) error {
	g.ctx, g.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if a := g.o.Config.InternalListen; a != "" {
		u, err := g.serveInternal(a)
		if err != nil {
			return fmt.Errorf("gateway internal API: %w (gateway.internalListen moves it)", err)
		}
		g.internalURL = u
	}
	if err := g.acquire(ctx); err != nil {
		return err
	}
	if err := g.revoke.load(ctx, g.q()); err != nil {
		return err
	}
	tv, err := g.q().AddTrustVersion(ctx, db.AddTrustVersionParams{Fingerprint: g.bundle.TrustFingerprint(), Lowest: int32(max(g.o.TrustVersion, 1))})
	if err != nil {
		return fmt.Errorf("gateway: trust version: %w", err)
	}
	g.trustVersion = int(tv)
	ln, err := net.Listen("tcp", g.o.Config.Listen)
	if err != nil {
		return fmt.Errorf("gateway listener: %w (gateway.listen or SERVICE_GATEWAY_LISTEN moves it)", err)
	}
	g.ln = ln
	if err := g.setTicketKeys(g.currentTrust()); err != nil {
		return fmt.Errorf("gateway: session ticket keys: %w", err)
	}
	g.lis = &listener{g: g, ln: ln, tls: g.tlsConfig(), conns: map[net.Conn]struct{}{}}
	g.wg.Add(4)
	go func() { defer g.wg.Done(); g.hellos.run(g.ctx) }()
	go func() { defer g.wg.Done(); g.lis.serve() }()
	go func() { defer g.wg.Done(); g.leaseLoop() }()
	go func() { defer g.wg.Done(); g.dispatchLoop() }()
	g.o.Log.Info("gateway serving", "id", g.id, "addr", ln.Addr().String(), "region", g.o.Config.Region)
	return nil
}

// tlsConfig is the listener's config: every handshake runs on the
// config of the current trust (tickets.go), whose roots its
// VerifyConnection verifies against and whose ticket keys are bound to
// them.
func (g *Gateway) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return g.currentTrust().tc, nil
		},
		// Never reached (GetConfigForClient always answers): refuse
		// rather than accept an unchecked client.
		VerifyConnection: func(tls.ConnectionState) error { return errors.New("gateway: no trust for the handshake") },
	}
}

// handshakeConfig requires a client certificate and checks it here
// rather than with ClientCAs, so that roots re-read from files apply to
// new handshakes and revoked certificates are refused during the
// handshake.
func (g *Gateway) handshakeConfig(t *trust) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert,
		// gateway.sessionTicketDays 0: no session resumption (tickets.go).
		SessionTicketsDisabled: g.o.Config.SessionTicketDays == 0,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return g.cert.get(), nil
		},
		// On the certificates the handshake parsed (VerifyPeerCertificate
		// would parse them a second time). crypto/tls calls it on a resumed
		// session too, with the certificates the ticket carried: their
		// chain is not verified again (resumedChain), their validity, node
		// and the revocation set are.
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := g.verifyCerts(t, cs.PeerCertificates, cs.DidResume)
			return err
		},
	}
}

// verifyChain checks a client's chain (DER, leaf first) against the node
// CA roots, the trust domain and the revocation set; it returns the node.
func (g *Gateway) verifyChain(raw [][]byte) (string, *x509.Certificate, error) {
	if len(raw) == 0 {
		return "", nil, errors.New("no client certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return "", nil, fmt.Errorf("client certificate: %w", err)
		}
		certs[i] = c
	}
	node, err := g.verifyCerts(g.currentTrust(), certs, false)
	return node, certs[0], err
}

// verifiedNode names the node of a certificate the handshake verified
// (VerifyConnection) and checks the revocation set again, which may have
// changed since: the chain is not verified a second time.
func (g *Gateway) verifiedNode(cert *x509.Certificate) (string, error) {
	node, err := pki.NodeOf(cert, g.bundle.TrustDomain)
	if err != nil {
		return "", err
	}
	if g.revoke.revoked(node, pki.SerialHex(cert)) {
		return "", fmt.Errorf("node %s or its certificate is revoked", node)
	}
	return node, nil
}

// verifyCerts is verifyChain on parsed certificates, against t's roots;
// resumed says the certificates came from a session ticket t's keys
// opened.
func (g *Gateway) verifyCerts(t *trust, certs []*x509.Certificate, resumed bool) (string, error) {
	if len(certs) == 0 {
		return "", errors.New("no client certificate")
	}
	roots, now := t.roots.pool, g.o.Now()
	var node string
	var err error
	var skipped bool
	if resumed {
		skipped, err = resumedChain(t, certs, now)
		if err != nil {
			return "", err
		}
	}
	if skipped {
		statChainsResumed.Add(1)
		node, err = pki.NodeOf(certs[0], g.bundle.TrustDomain)
		if err == nil {
			// Remembered as verified, as it was against these roots: the
			// node's next full handshake (a fleet-wide drop after a
			// restart its daemons resumed on) finds it.
			g.chains.add(chainKeyOf(certs), roots, certs, now, t.roots.until)
		}
	} else if key := chainKeyOf(certs); g.chains.verified(key, roots, now) {
		// The same certificates verified against these roots before and
		// are within their validity: only the checks that do not follow
		// from the bytes run again.
		statChainsCached.Add(1)
		node, err = pki.NodeOf(certs[0], g.bundle.TrustDomain)
	} else {
		statChainsVerified.Add(1)
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		var chain []*x509.Certificate
		node, chain, err = pki.VerifyNodeChain(certs[0], roots, inter, g.bundle.TrustDomain, now)
		if err == nil {
			g.chains.add(key, roots, chain, now)
		}
	}
	if err != nil {
		return "", err
	}
	if g.revoke.revoked(node, pki.SerialHex(certs[0])) {
		return "", fmt.Errorf("node %s or its certificate is revoked", node)
	}
	return node, nil
}

func (g *Gateway) acquire(ctx context.Context) error {
	row, err := g.q().AcquireLease(ctx, db.AcquireLeaseParams{Name: g.leaseName(), Holder: g.id, TtlMs: LeaseTTL.Milliseconds()})
	if err != nil {
		return fmt.Errorf("gateway lease: %w", err)
	}
	g.epoch.Store(row.Epoch)
	var sn pgtype.Text
	if g.o.Config.ServerName != "" {
		sn = pgtype.Text{String: g.o.Config.ServerName, Valid: true}
	}
	return g.q().RegisterGateway(ctx, db.RegisterGatewayParams{
		GatewayID: g.id, Region: g.o.Config.Region, Url: g.o.Config.URL, ServerName: sn,
		Epoch: row.Epoch, MaxStreams: int32(g.o.Config.MaxStreams),
		InternalUrl: pgtype.Text{String: g.internalURL, Valid: g.internalURL != ""},
	})
}

// leaseLoop renews the lease every RenewEvery with the session count. A
// lost lease (a long pause) ends every session: their rows may already
// name another gateway; the daemons come back and the gateway takes a new
// lease.
func (g *Gateway) leaseLoop() {
	t := time.NewTicker(RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		if err := g.rotateTicketKeys(); err != nil {
			g.o.Log.Warn("gateway: session ticket keys", "error", err.Error())
		}
		ctx, cancel := context.WithTimeout(g.ctx, RenewEvery)
		rows, err := g.q().RenewLeases(ctx, db.RenewLeasesParams{TtlMs: LeaseTTL.Milliseconds(),
			Names: []string{g.leaseName()}, Epochs: []int64{g.epoch.Load()}, Holder: g.id})
		switch {
		case err != nil:
			g.o.Log.Warn("gateway lease renewal failed", "error", err.Error())
		case len(rows) == 0:
			g.o.Log.Error("gateway lease lost: closing every session")
			g.closeAll(agentproto.Message{Type: agentproto.TypeReconnect, Reconnect: &agentproto.Reconnect{}})
			if err := g.acquire(ctx); err != nil {
				g.o.Log.Warn("gateway lease", "error", err.Error())
			}
		default:
			_ = g.q().HeartbeatGateway(ctx, db.HeartbeatGatewayParams{GatewayID: g.id, Sessions: int32(g.count()), Draining: g.draining.Load()})
			g.touch(ctx)
		}
		cancel()
	}
}

// touch records in one statement that the daemons of live sessions were
// heard from since the last renewal, and ends the silent ones.
func (g *Gateway) touch(ctx context.Context) {
	now := g.o.Now()
	since, silent := now.Add(-2*RenewEvery).UnixNano(), now.Add(-SilentAfter).UnixNano()
	// A session opened since the last touch is not written: its open set
	// the row's last_seen_at less than a renewal ago, and the next touch
	// writes it. After a restart every session is new, and the storm's
	// touches would otherwise write every row the hellos just wrote (at
	// 10,000 sessions, 0.5 to 0.9 s of PostgreSQL's CPU a touch).
	prev := g.touchedAt.Swap(now.UnixNano())
	var heard []string
	var gone []*session
	g.mu.Lock()
	for id, s := range g.sessions {
		switch seen := s.lastSeen.Load(); {
		case seen > since:
			if s.opened < prev {
				heard = append(heard, id)
			}
		case seen < silent:
			gone = append(gone, s)
		}
	}
	g.mu.Unlock()
	for _, s := range gone {
		g.o.Log.Info("ending a silent session", "node", s.nodeID)
		s.end(agentproto.Message{})
	}
	if len(heard) > 0 {
		if _, err := g.q().TouchSessions(ctx, db.TouchSessionsParams{NodeIds: heard, GatewayID: pgtype.Text{String: g.id, Valid: true}}); err != nil {
			g.o.Log.Warn("gateway: recording heartbeats", "error", err.Error())
		}
	}
}

// dispatchLoop sends pending specs and commands whenever the notifier
// wakes the gateway and at least every Poll, and applies the revocation
// set.
func (g *Gateway) dispatchLoop() {
	wake, stop := g.o.Notifier.Subscribe(Topic(g.id))
	defer stop()
	wakeAll, stopAll := g.o.Notifier.Subscribe(TopicAll)
	defer stopAll()
	revoked, stopRevoked := g.o.Notifier.Subscribe(TopicRevocations)
	defer stopRevoked()
	// A spec committed in this process comes with its wake: sent at once,
	// without the read (the read that the wake still makes finds it sent).
	defer g.o.Notifier.Take(Topic(g.id), g.takeSpec)()
	t := time.NewTicker(Poll)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-wake:
		case <-wakeAll:
		case <-revoked:
			g.applyRevocations()
			continue
		case <-g.opened.wake:
			g.dispatchOpened(g.opened.take())
			continue
		case <-t.C:
			if n++; n%5 == 0 {
				g.applyRevocations()
			}
		}
		g.dispatch()
	}
}

func (g *Gateway) applyRevocations() {
	ctx, cancel := context.WithTimeout(g.ctx, RenewEvery)
	defer cancel()
	if err := g.revoke.load(ctx, g.q()); err != nil {
		g.o.Log.Warn("gateway: loading revocations", "error", err.Error())
		return
	}
	for _, s := range g.all() {
		if g.revoke.revoked(s.nodeID, s.serial) {
			g.o.Log.Info("closing a revoked session", "node", s.nodeID)
			s.end(agentproto.Message{Type: agentproto.TypeRevoked})
		}
	}
}

// takeSpec sends a spec a commit in this process offered
// (nodework.SpecOffer) on its node's session, if the node has one here;
// on a goroutine of its own, since it runs on the committing one.
func (g *Gateway) takeSpec(v any) {
	o, ok := v.(*nodework.SpecOffer)
	if !ok || o.Generation == 0 {
		return
	}
	if s := g.get(o.Node); s != nil {
		go s.sendSpecBody(o.Generation, &o.Spec)
	}
}

// dispatch sends the specs daemons are behind on and the pending
// commands.
func (g *Gateway) dispatch() {
	if g.count() == 0 {
		return
	}
	statDispatches.Add(1)
	ctx, cancel := context.WithTimeout(g.ctx, RenewEvery)
	defer cancel()
	gw := pgtype.Text{String: g.id, Valid: true}
	specs, err := g.q().PendingSpecs(ctx, gw)
	if err != nil {
		g.o.Log.Warn("gateway: pending specs", "error", err.Error())
		return
	}
	for _, sp := range specs {
		if s := g.get(sp.NodeID); s != nil {
			s.sendSpec(sp.Generation, sp.Body)
		}
	}
	cmds, err := g.q().PendingCommands(ctx, db.PendingCommandsParams{GatewayID: gw, Max: 1000})
	if err != nil {
		g.o.Log.Warn("gateway: pending commands", "error", err.Error())
		return
	}
	g.sendCommands(cmds)
}

// dispatchOpened sends the specs and commands pending for the nodes whose
// sessions opened since the last look, reading their rows only: a storm
// of reconnects would otherwise read every session of the gateway once
// per batch of hellos (PendingSpecs' join grows with the sessions, so the
// storm's database work grew with its square).
func (g *Gateway) dispatchOpened(nodes []string) {
	if len(nodes) == 0 {
		return
	}
	statDispatchOpened.Add(1)
	ctx, cancel := context.WithTimeout(g.ctx, RenewEvery)
	defer cancel()
	specs, err := g.q().PendingSpecsOf(ctx, nodes)
	if err != nil {
		g.o.Log.Warn("gateway: pending specs", "error", err.Error())
		return
	}
	for _, sp := range specs {
		if s := g.get(sp.NodeID); s != nil {
			s.sendSpec(sp.Generation, sp.Body)
		}
	}
	cmds, err := g.q().PendingCommandsOf(ctx, db.PendingCommandsOfParams{NodeIds: nodes, Max: 1000})
	if err != nil {
		g.o.Log.Warn("gateway: pending commands", "error", err.Error())
		return
	}
	g.sendCommands(cmds)
}

func (g *Gateway) sendCommands(cmds []db.NodeCommand) {
	for _, c := range cmds {
		s := g.get(c.NodeID)
		if s == nil {
			continue // the sweeper puts it back to pending
		}
		cmd := agentproto.Command{ID: c.CommandID, NodeID: c.NodeID, Kind: c.Kind, Args: c.Args, ExpiresAt: c.ExpiresAt}
		cmd.Sign(g.bundle.CommandSigning)
		s.send(agentproto.Message{Type: agentproto.TypeCommand, Command: &cmd})
	}
}

// openedNodes gathers the nodes whose sessions opened until the dispatch
// loop takes them (dispatchOpened). A local signal, not the notifier's
// topic: that topic's wake runs the gateway-wide read, and with a
// PostgreSQL notifier it is also a NOTIFY to every process.
type openedNodes struct {
	mu    sync.Mutex
	nodes []string
	wake  chan struct{} // buffered: one wake-up pending at most
}

func (o *openedNodes) add(node string) {
	o.mu.Lock()
	o.nodes = append(o.nodes, node)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *openedNodes) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	nodes := o.nodes
	o.nodes = nil
	return nodes
}

func (g *Gateway) get(node string) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions[node]
}

func (g *Gateway) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sessions)
}

func (g *Gateway) all() []*session {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*session, 0, len(g.sessions))
	for _, s := range g.sessions {
		out = append(out, s)
	}
	return out
}

func (g *Gateway) closeAll(m agentproto.Message) {
	for _, s := range g.all() {
		s.end(m)
	}
}

// Sessions is the number of open daemon sessions.
func (g *Gateway) Sessions() int { return g.count() }

// Drain is the gateway's part of shutdown: tell each daemon to reconnect
// elsewhere after a random delay of up to the drain delay, close the
// listener with a 2 s grace, release the lease and leave.
func (g *Gateway) Drain() {
	g.draining.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), RenewEvery)
	defer cancel()
	_ = g.q().HeartbeatGateway(ctx, db.HeartbeatGatewayParams{GatewayID: g.id, Sessions: int32(g.count()), Draining: true})
	maxDelay := g.o.Config.DrainDelay
	for _, s := range g.all() {
		var d time.Duration
		if maxDelay > 0 {
			d = rand.N(maxDelay)
		}
		s.end(agentproto.Message{Type: agentproto.TypeReconnect, Reconnect: &agentproto.Reconnect{DelayMS: d.Milliseconds()}})
	}
	sctx, scancel := context.WithTimeout(context.Background(), ListenerGrace)
	g.lis.close()
	// Give the session handlers the grace to close their rows.
	closed := make(chan struct{})
	go func() { g.handlers.Wait(); close(closed) }()
	select {
	case <-closed:
	case <-sctx.Done():
	}
	scancel()
	if g.internal != nil {
		_ = g.internal.Close()
	}
	g.cancel()
	g.wg.Wait()
	_ = g.q().ReleaseLeases(ctx, db.ReleaseLeasesParams{Names: []string{g.leaseName()}, Epochs: []int64{g.epoch.Load()}, Holder: g.id})
	_ = g.q().DeleteGateway(ctx, g.id)
	g.o.Log.Info("gateway drained", "id", g.id)
}

// WelcomeGatewaysTTL is how long a gateway reuses the region's list of
// gateways for its welcomes: after a restart thousands of daemons are
// welcomed within seconds, and one query a second serves them all.
const WelcomeGatewaysTTL = time.Second

// welcomeGateways is LiveGateways for a welcome, read at most once per
// WelcomeGatewaysTTL; a failed read is not kept.
func (g *Gateway) welcomeGateways(ctx context.Context) []agentproto.Gateway {
	g.gwList.mu.Lock()
	defer g.gwList.mu.Unlock()
	if g.gwList.list != nil && time.Since(g.gwList.at) < WelcomeGatewaysTTL {
		return g.gwList.list
	}
	ctx, cancel := context.WithTimeout(ctx, RenewEvery)
	defer cancel()
	gws, err := LiveGateways(ctx, g.q(), g.o.Config.Region)
	if err != nil {
		return nil
	}
	g.gwList.list, g.gwList.at = gws, time.Now()
	return gws
}

// LiveGateways lists the region's gateways for daemons (join, welcome),
// least loaded first; each daemon ranks them its own way (agent.order),
// so that the region's daemons spread over them.
func LiveGateways(ctx context.Context, q *db.Queries, region string) ([]agentproto.Gateway, error) {
	var r pgtype.Text
	if region != "" {
		r = pgtype.Text{String: region, Valid: true}
	}
	rows, err := q.ListLiveGateways(ctx, r)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	out := make([]agentproto.Gateway, 0, len(rows))
	for _, g := range rows {
		out = append(out, agentproto.Gateway{ID: g.GatewayID, URL: g.Url, ServerName: g.ServerName.String, Region: g.Region, Draining: g.Draining})
	}
	return out, nil
}
