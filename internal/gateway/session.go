package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/nodes"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/pki"
	"computeplane/internal/store"
	"computeplane/internal/uow"
)

// session is one daemon's WebSocket session on this gateway.
type session struct {
	g         *Gateway
	conn      *websocket.Conn
	nodeID    string
	serial    string
	transport string
	epoch     int64 // the node's session epoch, fencing its writes
	cert      *x509.Certificate

	ctx      context.Context
	cancel   context.CancelFunc
	sentGen  atomic.Int64
	specMu   sync.Mutex   // a spec's send, after the check of sentGen
	lastSeen atomic.Int64 // unix nanoseconds
	opened   int64        // unix nanoseconds; set before the session is published
	endOnce  sync.Once

	// mux carries tunnel streams when the daemon offered them (nil
	// otherwise); its yamux session is made at the first tunnel.
	mux     *tunnel.Mux
	tunnels atomic.Int64 // open tunnel streams (Options.TunnelsPerNode)

	statusMu   sync.Mutex
	lastStatus uint64 // FNV-1a of the last status written: a session keeps 8 bytes, not the status
	// lastFrame is FNV-1a of the frame that status came in (0: none): a
	// heartbeat repeating it byte for byte is skipped undecoded (handle).
	// The session stays in its 208-byte size class.
	lastFrame uint64
	// firstStatus is set until the session's first status: lastStatus
	// came from the node's row then (the status_hash a session wrote).
	firstStatus bool

	// idle lets the reader wait for the next message on the socket, at a
	// shallow stack depth (idle.go); nil on the fallback.
	idle *idleWait
}

// serveMTLS upgrades a mutual-TLS connection whose certificate the
// handshake verified. idle, when not nil, lets the idle session wait on
// its socket.
func (g *Gateway) serveMTLS(w http.ResponseWriter, r *http.Request, idle *idleWait) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		http.Error(w, "a client certificate is required", http.StatusUnauthorized)
		return
	}
	// The handshake verified the chain (tlsConfig); the revocation set
	// may have changed since. On the certificate the handshake parsed: a
	// session keeps no copy.
	node, err := g.verifiedNode(r.TLS.PeerCertificates[0])
	if err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if !g.admit(w) {
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	// The hello, the session row and the welcome run on this goroutine,
	// whose stack grew in the TLS handshake and grows again in the
	// database calls; the idle session then reads on a fresh goroutine
	// whose stack stays small (a gateway holds thousands of them, and the
	// runtime only halves a grown stack once per GC).
	// Only the certificate goes with it: the request (headers, TLS state)
	// is garbage once upgraded.
	cert := r.TLS.PeerCertificates[0]
	g.handlers.Add(1)
	s := g.open(conn, node, cert, agentproto.TransportMTLS, r.TLS.DidResume, idle)
	if s == nil {
		g.handlers.Done()
		return
	}
	go func() {
		defer g.handlers.Done()
		g.serve(s)
	}()
}

// admit refuses a new session when the gateway is draining or full.
func (g *Gateway) admit(w http.ResponseWriter) bool {
	switch {
	case g.draining.Load():
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the gateway is draining", http.StatusServiceUnavailable)
		return false
	case g.count() >= g.o.Config.MaxStreams:
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the gateway is full (maxStreams)", http.StatusServiceUnavailable)
		return false
	}
	return true
}

// FallbackHandler serves the WebSocket fallback on the public host
// (wss://<publicHost>/v1/session) for daemons behind proxies that
// terminate TLS: no client certificate, the daemon proves its identity by
// signing a challenge with its node key.
func (g *Gateway) FallbackHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.admit(w) {
			return
		}
		conn, err := websocket.Accept(clearDeadlines{w}, r, nil)
		if err != nil {
			return
		}
		conn.SetReadLimit(agentproto.MaxMessageBytes)
		node, cert, err := g.challenge(r.Context(), conn)
		if err != nil {
			g.o.Log.Info("fallback session refused", "error", err.Error())
			reject(conn, "UNAUTHENTICATED", err.Error())
			return
		}
		g.handlers.Add(1)
		defer g.handlers.Done()
		if s := g.open(conn, node, cert, agentproto.TransportWebSocket, false, nil); s != nil {
			g.serve(s)
		}
	})
}

// clearDeadlines lets a hijacked connection of the api's server outlive
// the server's request deadlines (net/http keeps them on hijack).
type clearDeadlines struct{ http.ResponseWriter }

func (c clearDeadlines) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(c.ResponseWriter).Hijack()
	if err == nil {
		_ = conn.SetDeadline(time.Time{})
	}
	return conn, brw, err
}

func (g *Gateway) challenge(ctx context.Context, conn *websocket.Conn) (string, *x509.Certificate, error) {
	nonce := make([]byte, 32)
	_, _ = rand.Read(nonce)
	if err := writeMsg(ctx, conn, agentproto.Message{Type: agentproto.TypeChallenge, Challenge: &agentproto.Challenge{Nonce: nonce}}); err != nil {
		return "", nil, err
	}
	m, err := readMsg(ctx, conn, HelloTimeout)
	if err != nil {
		return "", nil, err
	}
	if m.Type != agentproto.TypeProof {
		return "", nil, fmt.Errorf("expected a proof, got %s", m.Type)
	}
	node, cert, err := g.verifyChain(m.Proof.Chain)
	if err != nil {
		return "", nil, err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	digest := sha256.Sum256(append([]byte(agentproto.ProofContext), nonce...))
	if !ok || !ecdsa.VerifyASN1(pub, digest[:], m.Proof.Signature) {
		return "", nil, errors.New("the proof's signature does not verify with the certificate's key")
	}
	return node, cert, nil
}

func reject(conn *websocket.Conn, code, msg string) {
	rejectWith(conn, &agentproto.Error{Code: code, Message: msg})
}

// rejectUnavailable refuses a hello the gateway could not serve in time
// (its database): UNAVAILABLE with retryAfterMs.
func rejectUnavailable(conn *websocket.Conn, msg string) {
	rejectWith(conn, &agentproto.Error{Code: "UNAVAILABLE", Message: msg, RetryAfterMS: HelloRetryAfter.Milliseconds()})
}

func rejectWith(conn *websocket.Conn, e *agentproto.Error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = writeMsg(ctx, conn, agentproto.Message{Type: agentproto.TypeError, Error: e})
	_ = conn.Close(websocket.StatusPolicyViolation, e.Code)
}

func writeMsg(ctx context.Context, conn *websocket.Conn, m agentproto.Message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	return conn.Write(ctx, websocket.MessageText, b)
}

func readMsg(ctx context.Context, conn *websocket.Conn, timeout time.Duration) (agentproto.Message, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return agentproto.Message{}, err
	}
	if typ != websocket.MessageText {
		return agentproto.Message{}, errors.New("a binary frame")
	}
	return agentproto.Decode(b)
}

// open starts one session: hello, the session row, welcome. It answers
// nil when the session was refused (the connection is closed then);
// serve holds it. resumed says the TLS session resumed with a ticket
// (logged). idle, when not nil, lets the idle session wait on its socket;
// it is set before the session is published (a newer session of the node
// may end it at once).
func (g *Gateway) open(conn *websocket.Conn, node string, cert *x509.Certificate, transport string, resumed bool, idle *idleWait) *session {
	conn.SetReadLimit(agentproto.MaxMessageBytes)
	m, err := readMsg(g.ctx, conn, HelloTimeout)
	if err != nil {
		_ = conn.CloseNow()
		return nil
	}
	if m.Type != agentproto.TypeHello || m.Hello.NodeID != node {
		reject(conn, "INVALID_INPUT", "the first message is a hello naming the certificate's node")
		return nil
	}
	h := m.Hello
	proto := min(agentproto.ProtocolMax, h.ProtocolMax)
	if proto < max(agentproto.ProtocolMin, h.ProtocolMin) {
		reject(conn, "UNSUPPORTED", fmt.Sprintf("no common protocol: the gateway speaks %d-%d, the daemon %d-%d",
			agentproto.ProtocolMin, agentproto.ProtocolMax, h.ProtocolMin, h.ProtocolMax))
		return nil
	}
	ctx, cancel := context.WithTimeout(g.ctx, WriteTimeout)
	opened, err := g.openSession(ctx, node, cert, transport, proto, h)
	cancel()
	if err != nil {
		g.o.Log.Info("session refused", "node", node, "error", err.Error())
		switch {
		case isRefusal(err):
			reject(conn, "INVALID_STATE", err.Error())
		case isBadValue(err):
			reject(conn, "INVALID_INPUT", "the hello cannot be stored: "+err.Error())
		default:
			// The database did not answer in time: the daemon retries.
			rejectUnavailable(conn, "the gateway's database did not answer: "+err.Error())
		}
		return nil
	}
	epoch := opened.epoch
	s := &session{g: g, conn: conn, nodeID: node, serial: pki.SerialHex(cert), transport: transport, epoch: epoch, cert: cert, idle: idle}
	// The hash of the node's last status written (0: unknown): a daemon
	// back after a restart sends the same status, which is then not
	// written again.
	s.lastStatus, s.firstStatus = opened.statusHash, true
	// Not a child of g.ctx: ten thousand children would sit in its map.
	// Drain ends every session (end cancels this) before it cancels g.ctx.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(g.ctx))
	if h.Streams == tunnel.StreamsYamux {
		s.mux = tunnel.NewMux(conn, true, nil)
	}
	s.sentGen.Store(h.ObservedGeneration)
	s.opened = g.o.Now().UnixNano()
	s.lastSeen.Store(s.opened)
	g.mu.Lock()
	old := g.sessions[node]
	if old != nil && old.epoch > epoch {
		// Two hellos of one node raced and the other row write came last:
		// its session holds the node, this one is fenced already.
		g.mu.Unlock()
		g.o.Log.Info("session refused: a newer session of the node", "node", node, "epoch", epoch, "newer", old.epoch)
		reject(conn, "INVALID_STATE", "a newer session of this node is open")
		return nil
	}
	g.sessions[node] = s
	g.mu.Unlock()
	if old != nil {
		old.end(agentproto.Message{}) // replaced by the daemon's new session
	}
	gws := g.welcomeGateways(s.ctx)
	s.send(agentproto.Message{Type: agentproto.TypeWelcome, Welcome: &agentproto.Welcome{
		SessionEpoch: epoch, Protocol: proto, GatewayID: g.id, Gateways: gws, HeartbeatMS: HeartbeatMS, TrustVersion: g.trustVersion,
	}})
	g.o.Log.Info("session open", "node", node, "transport", transport, "epoch", epoch, "resumed", resumed)
	g.opened.add(node) // its pending spec and commands (dispatchOpened)
	return s
}

// serve reads the daemon's messages until the connection ends, then
// closes the session's row.
func (g *Gateway) serve(s *session) {
	node, epoch := s.nodeID, s.epoch
	s.readLoop()
	s.end(agentproto.Message{})
	g.mu.Lock()
	if g.sessions[node] == s {
		delete(g.sessions, node)
	}
	g.mu.Unlock()
	g.closeRow(node, epoch)
	g.o.Log.Info("session closed", "node", node, "epoch", epoch)
}

// closeRow closes a node's session row if it is still the session of
// epoch on this gateway.
func (g *Gateway) closeRow(node string, epoch int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(g.ctx), WriteTimeout)
	defer cancel()
	_, _ = g.q().CloseSession(ctx, db.CloseSessionParams{NodeID: node, GatewayID: pgtype.Text{String: g.id, Valid: true}, SessionEpoch: epoch})
}

// openSession writes a hello's session row: through a batch of the
// hellos arriving together (hellos.go), or, for a node that needs more
// than its session row, in openRow's transaction. Its time is bounded by
// ctx.
func (g *Gateway) openSession(ctx context.Context, node string, cert *x509.Certificate, transport string, proto int, h *agentproto.Hello) (openRes, error) {
	statHellos.Add(1)
	res := g.hellos.open(ctx, node, newOpenRowArgs(cert, transport, proto, h))
	if res.err != nil || !res.slow {
		return res, res.err
	}
	statHelloSlow.Add(1)
	var trips atomic.Int64
	epoch, hash, err := g.openRow(store.CountRoundTrips(ctx, &trips), node, cert, transport, proto, h)
	statHelloTrips.Add(trips.Load())
	return openRes{epoch: epoch, statusHash: hash}, err
}

// openRow writes the session row in one transaction: a joining node becomes
// ready (node.registered), a down node returns to the state it left
// (node.up). It returns the new epoch and the hash of the node's last
// status (0: unknown).
func (g *Gateway) openRow(ctx context.Context, node string, cert *x509.Certificate, transport string, proto int, h *agentproto.Hello) (int64, uint64, error) {
	inv, _ := json.Marshal(h.Inventory)
	var epoch int64
	var hash uint64
	var events bool
	// A unit of work: the peers' specs it may push wake their gateways.
	u, err := uow.Run(ctx, g.o.Store, false, func(ctx context.Context, u *uow.Unit) error {
		tx := u.Tx
		q := db.New(tx)
		cur, err := q.GetNodeSession(ctx, node)
		if errors.Is(err, pgx.ErrNoRows) {
			return &refusal{fmt.Sprintf("node %s does not exist", node)}
		}
		if err != nil {
			return err
		}
		if cur.State == nodes.StateRetired {
			return &refusal{fmt.Sprintf("node %s is retired", node)}
		}
		na := cert.NotAfter
		n, err := q.OpenSession(ctx, db.OpenSessionParams{
			GatewayID: pgtype.Text{String: g.id, Valid: true}, Transport: pgtype.Text{String: transport, Valid: true},
			AgentVersion: pgtype.Text{String: h.AgentVersion, Valid: true}, AgentProtocol: pgtype.Int4{Int32: int32(proto), Valid: true},
			Inventory: inv, ObservedGeneration: h.ObservedGeneration, CertNotAfter: &na,
			CertSerial: pgtype.Text{String: pki.SerialHex(cert), Valid: true},
			Vcpu:       int32(h.Inventory.VCPU), MemoryMib: h.Inventory.MemoryMiB, DiskGib: h.Inventory.DiskGiB, Gpus: int32(h.Inventory.GPUs),
			GpuModel: pgtype.Text{String: h.Inventory.GPUModel, Valid: h.Inventory.GPUModel != ""}, NodeID: node,
		})
		if err != nil {
			return err
		}
		epoch, hash = n.SessionEpoch, uint64(n.StatusHash.Int64)
		underlay := ""
		if h.Inventory.Underlay.IsValid() {
			underlay = h.Inventory.Underlay.String()
		}
		if underlay != cur.Underlay {
			// The nodes sharing a private network with it send their
			// overlay elsewhere now.
			if err := nodework.PushPeers(ctx, tx, node); err != nil {
				return err
			}
		}
		switch cur.State {
		case nodes.StateJoining:
			events = true
			if err := q.SetNodeSessionState(ctx, db.SetNodeSessionStateParams{NodeID: node, State: nodes.StateReady}); err != nil {
				return err
			}
			return outbox.Write(ctx, tx, outbox.Event{Type: api.EventNodeRegistered, Subject: node, TenantID: cur.Owner,
				Data: api.NodeRegisteredPayload{NodeID: node, PoolID: cur.PoolID, Hostname: cur.Hostname, State: nodes.StateReady}})
		case nodes.StateDown:
			events = true
			back := nodes.StateReady
			if cur.DownFrom.Valid && cur.DownFrom.String != "" {
				back = cur.DownFrom.String
			}
			if err := q.SetNodeSessionState(ctx, db.SetNodeSessionStateParams{NodeID: node, State: back}); err != nil {
				return err
			}
			return outbox.Write(ctx, tx, outbox.Event{Type: api.EventNodeUp, Subject: node, TenantID: cur.Owner,
				Data: api.NodeUpPayload{NodeID: node}})
		}
		return nil
	})
	if err == nil {
		g.o.Notifier.WakeUnit(u)
	}
	if err == nil && events {
		g.o.Notifier.Wake(notify.TopicOutbox)
	}
	return epoch, hash, err
}

// send writes one message; a failed write ends the session.
func (s *session) send(m agentproto.Message) {
	if err := writeMsg(s.ctx, s.conn, m); err != nil {
		s.end(agentproto.Message{})
	}
}

// sendSpec sends a spec generation once per session.
func (s *session) sendSpec(gen int64, body []byte) {
	if s.sentGen.Load() >= gen {
		return
	}
	var spec agentproto.SpecBody // as nodework.PutSpec wrote it
	if err := json.Unmarshal(body, &spec); err != nil {
		s.g.o.Log.Warn("gateway: a spec that does not decode", "node", s.nodeID, "generation", gen, "error", err.Error())
		return
	}
	s.sendSpecBody(gen, &spec)
}

// sendSpecBody sends a spec generation unless this session sent it or a
// later one: the dispatch's read and a commit's offer (Gateway.takeSpec)
// may both carry it, in either order.
func (s *session) sendSpecBody(gen int64, spec *agentproto.SpecBody) {
	s.specMu.Lock()
	defer s.specMu.Unlock()
	if s.sentGen.Load() >= gen {
		return
	}
	s.sentGen.Store(gen)
	s.send(agentproto.Message{Type: agentproto.TypeSpec, Spec: &agentproto.Spec{Generation: gen, Body: *spec}})
}

// end closes the session once, first sending m when it has a type.
func (s *session) end(m agentproto.Message) {
	s.endOnce.Do(func() {
		if s.idle != nil {
			s.idle.close() // the close handshake reads from here on
		}
		if m.Type != "" {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = writeMsg(ctx, s.conn, m)
			cancel()
		}
		if s.mux != nil {
			s.mux.Close()
		}
		_ = s.conn.Close(websocket.StatusNormalClosure, "")
		s.cancel()
	})
}

func (s *session) readLoop() {
	if s.idle == nil {
		for s.readMessage(true) {
		}
		return
	}
	// Between bursts the reader waits on the socket at this shallow depth;
	// a burst (the deep frame read, the decoding, the database) runs on
	// another goroutine (bursts.go) and lasts while messages are buffered.
	for {
		if s.idle.quiet() && !s.idle.wait() {
			return
		}
		if !s.g.bursts.run(s.readBurst) {
			return
		}
	}
}

// readBurst reads and handles messages until none is buffered above the
// socket; false ends the session.
func (s *session) readBurst() bool {
	for {
		if !s.readMessage(false) {
			return false
		}
		if s.idle.quiet() {
			return true
		}
	}
}

// readMessage reads one message and handles it (when fresh, on a burst
// goroutine: bursts.go); false ends the session.
func (s *session) readMessage(fresh bool) bool {
	// A binary message is a tunnel stream's bytes, fed to the streams
	// (only from a daemon that offered them). A context that is never
	// done: the read ends when end closes the connection, and an idle
	// session keeps no cancellation hook.
	typ, b, err := tunnel.ReadMessage(context.Background(), s.conn, s.mux)
	if err != nil {
		return false
	}
	if typ == websocket.MessageBinary {
		s.lastSeen.Store(s.g.o.Now().UnixNano())
		return true
	}
	if fresh {
		return s.g.bursts.run(func() bool { return s.handle(b) })
	}
	return s.handle(b)
}

// handle decodes and applies one text message; false ends the session.
func (s *session) handle(b []byte) bool {
	frame := fnv64a(b)
	if s.repeatsStatus(frame) {
		// The last status's frame again (a heartbeat): it decodes to the
		// status whose hash is lastStatus, which status would skip. (A
		// frame crafted to collide could only drop its own daemon's
		// message.)
		s.lastSeen.Store(s.g.o.Now().UnixNano())
		statStatusSkipped.Add(1)
		return true
	}
	m, err := agentproto.Decode(b)
	if err != nil {
		return false
	}
	s.lastSeen.Store(s.g.o.Now().UnixNano())
	switch m.Type {
	case agentproto.TypeStatus:
		s.status(m.Status, frame)
	case agentproto.TypeResult:
		s.result(m.Result)
	case agentproto.TypeRenew:
		s.renew(m.Renew)
	case agentproto.TypeResolve:
		go s.resolve(m.Resolve) // reads go on meanwhile
	}
	return true
}

// repeatsStatus says that frame is the hash of the frame of the session's
// last status, written or skipped (not one whose write failed).
func (s *session) repeatsStatus(frame uint64) bool {
	s.statusMu.Lock()
	defer s.statusMu.Unlock()
	return frame != 0 && frame == s.lastFrame && s.lastStatus != 0
}

// fnv64a is hash/fnv's FNV-1a (64 bits), without its allocation.
func fnv64a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// errStaleSession ends a status's transaction when the node's session is
// no longer this one.
var errStaleSession = errors.New("gateway: the node's session is no longer this one")

// status writes a status that differs from the last one; a heartbeat that
// repeats it only counts as heard (written in batches by touch).
// frame is FNV-1a of the message the status came in.
func (s *session) status(st *agentproto.Status, frame uint64) {
	b, _ := json.Marshal(st)
	sum := fnv64a(b)
	s.statusMu.Lock()
	same := sum != 0 && sum == s.lastStatus
	first := s.firstStatus
	s.lastStatus, s.lastFrame, s.firstStatus = sum, frame, false
	s.statusMu.Unlock()
	if same {
		// Written already (by this session, or by the node's last one:
		// the row's status_hash); the heartbeat counts as heard (touch).
		statStatusSkipped.Add(1)
		if first {
			statStatusSkipOpen.Add(1)
		}
		return
	}
	instances, _ := json.Marshal(st.Instances)
	var inv []byte
	if st.Inventory != nil {
		inv, _ = json.Marshal(st.Inventory)
	}
	ctx, cancel := context.WithTimeout(s.ctx, WriteTimeout)
	defer cancel()
	// One unit of work: the registry names what its changes wake.
	events := false
	u, err := uow.Run(ctx, s.g.o.Store, false, func(ctx context.Context, u *uow.Unit) error {
		// The node's row and its instances' rows in one round trip (with
		// BEGIN); a session that is no longer this one rolls them back.
		var p store.Pipeline
		var n int64
		var err error
		p.Queue(func(q *db.Queries) {
			n, err = q.ReportStatus(ctx, db.ReportStatusParams{
				ObservedGeneration: st.ObservedGeneration, ApplyError: pgtype.Text{String: st.ApplyError, Valid: st.ApplyError != ""},
				InstanceStatus:         instances,
				VolumeAvailableBytes:   pgtype.Int8{Int64: st.VolumeStore.AvailableBytes, Valid: true},
				VolumeReservedBytes:    pgtype.Int8{Int64: st.VolumeStore.ReservedBytes, Valid: true},
				VolumeOutstandingBytes: pgtype.Int8{Int64: st.VolumeStore.OutstandingBytes, Valid: true},
				Inventory:              inv, NodeID: s.nodeID, GatewayID: pgtype.Text{String: s.g.id, Valid: true}, SessionEpoch: s.epoch,
				StatusHash: pgtype.Int8{Int64: int64(sum), Valid: true},
			})
		})
		var aerr error
		events, aerr = s.g.o.Work.ApplyStatus(ctx, u.Tx, s.nodeID, st, &p, func() error {
			if err == nil && n == 0 {
				return errStaleSession
			}
			return err
		})
		return aerr
	})
	if errors.Is(err, errStaleSession) {
		err, events = nil, false // nothing written: the session is no longer this one
	} else if err == nil {
		statStatusWrites.Add(1)
		s.g.o.Notifier.WakeUnit(u)
	}
	if events {
		s.g.o.Notifier.Wake(notify.TopicOutbox)
	}
	if err != nil {
		s.statusMu.Lock()
		s.lastStatus, s.lastFrame = 0, 0 // write it again with the next heartbeat
		s.statusMu.Unlock()
		s.g.o.Log.Warn("gateway: writing a status", "node", s.nodeID, "error", err.Error())
	}
}

// result writes a command's result and follows it, in one unit of work
// (nodework.Registry.ApplyResult). When it fails, nothing is written: the
// sweeper sends the command again and the daemon answers from its journal.
func (s *session) result(r *agentproto.Result) {
	ctx, cancel := context.WithTimeout(s.ctx, WriteTimeout)
	defer cancel()
	var applied, events bool
	u, err := uow.Run(ctx, s.g.o.Store, false, func(ctx context.Context, u *uow.Unit) (err error) {
		applied, events, err = s.g.o.Work.ApplyResult(ctx, u.Tx, s.nodeID, r)
		return err
	})
	if err != nil {
		s.g.o.Log.Warn("gateway: writing a command result", "node", s.nodeID, "command", r.ID, "error", err.Error())
		return
	}
	if !applied {
		s.g.o.Log.Debug("gateway: a result for a command finished already or not the node's", "node", s.nodeID, "command", r.ID)
	}
	s.g.o.Notifier.WakeUnit(u)
	if events {
		s.g.o.Notifier.Wake(notify.TopicOutbox)
	}
}

// ResolveTimeout bounds one resolution of secret references.
const ResolveTimeout = 10 * time.Second

// resolve answers a daemon's Resolve through OnResolve.
func (s *session) resolve(r *agentproto.Resolve) {
	out := &agentproto.Resolved{ID: r.ID}
	if s.g.o.OnResolve == nil {
		out.Error = "this gateway resolves no secrets"
	} else {
		ctx, cancel := context.WithTimeout(s.ctx, ResolveTimeout)
		values, err := s.g.o.OnResolve(ctx, s.nodeID, r.InstanceID, r.References)
		cancel()
		if err != nil {
			out.Error = err.Error()
			s.g.o.Log.Info("gateway: secret references not resolved", "node", s.nodeID, "instance", r.InstanceID, "error", err.Error())
		}
		out.Values = values
	}
	s.send(agentproto.Message{Type: agentproto.TypeResolved, Resolved: out})
}

// renew issues a new certificate for the session's key.
func (s *session) renew(r *agentproto.Renew) {
	csr, err := x509.ParseCertificateRequest(r.CSR)
	if err != nil || csr.CheckSignature() != nil {
		s.g.o.Log.Info("renewal refused: a bad request", "node", s.nodeID)
		return
	}
	have, _ := x509.MarshalPKIXPublicKey(s.cert.PublicKey)
	want, _ := x509.MarshalPKIXPublicKey(csr.PublicKey)
	if !bytes.Equal(have, want) {
		s.g.o.Log.Info("renewal refused: another key", "node", s.nodeID)
		return
	}
	cert, err := s.g.bundle.IssueNode(csr, s.nodeID)
	if err != nil {
		s.g.o.Log.Warn("renewal failed", "node", s.nodeID, "error", err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, WriteTimeout)
	defer cancel()
	na := cert.NotAfter
	if err := s.g.q().SetNodeCertificate(ctx, db.SetNodeCertificateParams{NodeID: s.nodeID, CertNotAfter: &na,
		CertSerial: pgtype.Text{String: pki.SerialHex(cert), Valid: true}}); err != nil {
		s.g.o.Log.Warn("renewal not recorded", "node", s.nodeID, "error", err.Error())
		return
	}
	s.send(agentproto.Message{Type: agentproto.TypeRenewed, Renewed: &agentproto.Renewed{Certificate: cert.Raw}})
}
