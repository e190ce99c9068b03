package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto"
)

const waitFor = 5 * time.Second

// ca is a test certificate authority.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var serial atomic.Int64

func newCA(t *testing.T, cn string) *ca {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &ca{c, key}
}

// issue signs pub for [notBefore, notAfter): a gateway's serving
// certificate for 127.0.0.1 or a node's client certificate.
func (c *ca) issue(t *testing.T, pub any, server bool, notBefore, notAfter time.Time) *x509.Certificate {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: "node"}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, pub, c.key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

// world is a joined agent's directory and what its fake control plane
// holds.
type world struct {
	t                *testing.T
	dir              Dir
	serving, nodeCA  *ca
	servingCert      tls.Certificate
	signer, stranger ed25519.PrivateKey
	nodeKey          *ecdsa.PrivateKey
}

// newWorld joins a node into a fresh directory; its certificate lives
// [now-notBefore, now+notAfter).
func newWorld(t *testing.T, certAge, certLeft time.Duration) *world {
	w := &world{t: t, dir: Dir(t.TempDir()), serving: newCA(t, "serving"), nodeCA: newCA(t, "nodes")}
	skey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	sc := w.serving.issue(t, &skey.PublicKey, true, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	w.servingCert = tls.Certificate{Certificate: [][]byte{sc.Raw}, PrivateKey: skey, Leaf: sc}
	pub, signer, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, w.stranger, err = ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	w.signer = signer
	w.nodeKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(w.nodeKey)
	require.NoError(t, err)
	require.NoError(t, writeFileAtomic(w.dir.path(fileKey), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600))
	require.NoError(t, w.dir.SaveCert(w.nodeCA.issue(t, &w.nodeKey.PublicKey, false, time.Now().Add(-certAge), time.Now().Add(certLeft)).Raw))
	require.NoError(t, w.dir.SaveState(&State{NodeID: "node_a", PoolID: "pool_a", TrustDomain: "test.local",
		NodeCA: w.nodeCA.cert.Raw, ServingCA: w.serving.cert.Raw, CommandSigningKeys: [][]byte{pub}}))
	return w
}

// setGateways points state.json at gateways and the fallback.
func (w *world) setGateways(fallback string, gws ...*fakeGateway) {
	st, err := w.dir.LoadState()
	require.NoError(w.t, err)
	st.Gateways, st.FallbackURL = nil, fallback
	for _, g := range gws {
		st.Gateways = append(st.Gateways, agentproto.Gateway{ID: g.id, URL: g.srv.URL, Region: "eu"})
	}
	require.NoError(w.t, w.dir.SaveState(st))
}

// run starts the daemon with the recording runtime until the test ends.
func (w *world) run(opts ...func(*Options)) {
	o := Options{Dir: w.dir, Runtime: &vmruntime.Recording{Dir: w.dir.path("runtime")}, Declared: Declared{VCPU: 4, MemoryMiB: 8192, DiskGiB: 50},
		Version: "test", Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	for _, f := range opts {
		f(&o)
	}
	a, err := New(o)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			w.t.Error("the daemon did not stop")
		}
	})
}

func (w *world) command(id, args string, key ed25519.PrivateKey) agentproto.Message {
	c := &agentproto.Command{ID: id, NodeID: "node_a", Kind: agentproto.CommandEcho, Args: json.RawMessage(args), ExpiresAt: time.Now().Add(time.Minute)}
	c.Sign(key)
	return agentproto.Message{Type: agentproto.TypeCommand, Command: c}
}

// fakeGateway speaks agentproto: over mutual TLS, or as the fallback
// (plain ws on loopback, identity by challenge).
type fakeGateway struct {
	id       string
	srv      *httptest.Server
	sessions chan *fakeSession
	refuse   atomic.Bool // answer 502 before the upgrade, as a breaking proxy does
	busy     atomic.Bool // answer 503 before the upgrade, as a draining gateway does
	requests atomic.Int64
	// welcomeID and list, when set before the daemon runs, are the
	// welcome's gateway id (default id) and gateways.
	welcomeID string
	list      []agentproto.Gateway
}

// fakeSession is one welcomed session.
type fakeSession struct {
	t     *testing.T
	hello *agentproto.Hello
	peer  *x509.Certificate // the client certificate or the proof's leaf
	conn  *websocket.Conn
	in    chan agentproto.Message
}

func (w *world) gateway(id string, fallback bool) *fakeGateway {
	g := &fakeGateway{id: id, sessions: make(chan *fakeSession, 8)}
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		g.requests.Add(1)
		if g.refuse.Load() || r.URL.Path != agentproto.SessionPath {
			http.Error(rw, "no", http.StatusBadGateway)
			return
		}
		if g.busy.Load() {
			http.Error(rw, "the gateway is draining", http.StatusServiceUnavailable)
			return
		}
		conn, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		s := &fakeSession{t: w.t, conn: conn, in: make(chan agentproto.Message, 256)}
		ctx := r.Context()
		if fallback {
			nonce := []byte("nonce-" + id)
			if s.send(agentproto.Message{Type: agentproto.TypeChallenge, Challenge: &agentproto.Challenge{Nonce: nonce}}) != nil {
				return
			}
			m, err := s.read(ctx)
			if err != nil || m.Type != agentproto.TypeProof || len(m.Proof.Chain) != 1 {
				return
			}
			leaf, err := x509.ParseCertificate(m.Proof.Chain[0])
			if err != nil {
				return
			}
			digest := sha256.Sum256(append([]byte(agentproto.ProofContext), nonce...))
			if !ecdsa.VerifyASN1(leaf.PublicKey.(*ecdsa.PublicKey), digest[:], m.Proof.Signature) {
				return
			}
			s.peer = leaf
		} else {
			s.peer = r.TLS.PeerCertificates[0]
		}
		m, err := s.read(ctx)
		if err != nil || m.Type != agentproto.TypeHello {
			return
		}
		s.hello = m.Hello
		wid := id
		if g.welcomeID != "" {
			wid = g.welcomeID
		}
		if s.send(agentproto.Message{Type: agentproto.TypeWelcome, Welcome: &agentproto.Welcome{SessionEpoch: 7, Protocol: 1, GatewayID: wid, Gateways: g.list, HeartbeatMS: 50}}) != nil {
			return
		}
		g.sessions <- s
		for {
			m, err := s.read(ctx)
			if err != nil {
				close(s.in)
				return
			}
			s.in <- m
		}
	}))
	if fallback {
		g.srv.Start()
	} else {
		pool := x509.NewCertPool()
		pool.AddCert(w.nodeCA.cert)
		g.srv.TLS = &tls.Config{Certificates: []tls.Certificate{w.servingCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS13}
		g.srv.StartTLS()
	}
	w.t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGateway) wsURL() string {
	return "ws" + strings.TrimPrefix(g.srv.URL, "http") + agentproto.SessionPath
}

// next waits for the gateway's next session.
func (g *fakeGateway) next(t *testing.T) *fakeSession {
	t.Helper()
	select {
	case s := <-g.sessions:
		return s
	case <-time.After(waitFor):
		t.Fatalf("no session on gateway %s", g.id)
		return nil
	}
}

func (s *fakeSession) read(ctx context.Context) (agentproto.Message, error) {
	_, b, err := s.conn.Read(ctx)
	if err != nil {
		return agentproto.Message{}, err
	}
	return agentproto.Decode(b)
}

func (s *fakeSession) send(m agentproto.Message) error {
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return s.conn.Write(ctx, websocket.MessageText, b)
}

// expect skips messages until one of type typ that ok accepts.
func (s *fakeSession) expect(typ string, ok func(agentproto.Message) bool) agentproto.Message {
	s.t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case m, open := <-s.in:
			require.True(s.t, open, "the session ended while waiting for a %s", typ)
			if m.Type == typ && (ok == nil || ok(m)) {
				return m
			}
		case <-deadline:
			s.t.Fatalf("no %s message", typ)
		}
	}
}

func (s *fakeSession) result(id string) *agentproto.Result {
	s.t.Helper()
	return s.expect(agentproto.TypeResult, func(m agentproto.Message) bool { return m.Result.ID == id }).Result
}

func (w *world) status() Status {
	var st Status
	_ = readJSON(w.dir.path(fileStatus), &st)
	return st
}

func TestSessionHelloSpecsAndCommands(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g := w.gateway("gw_1", false)
	w.setGateways("", g)
	w.run()

	s := g.next(t)
	assert.Equal(t, "node_a", s.hello.NodeID)
	assert.Equal(t, agentproto.TransportMTLS, s.hello.Transport)
	assert.Equal(t, "test", s.hello.AgentVersion)
	assert.Equal(t, 4, s.hello.Inventory.VCPU)
	assert.Equal(t, "recording", s.hello.Inventory.Runtime)
	assert.Zero(t, s.hello.ObservedGeneration)
	require.Eventually(t, func() bool { st := w.status(); return st.Connected && st.GatewayID == "gw_1" && st.SessionEpoch == 7 }, waitFor, 10*time.Millisecond)

	// A spec is applied once; sent again, only reported.
	spec := agentproto.Message{Type: agentproto.TypeSpec, Spec: &agentproto.Spec{Generation: 3,
		Body: agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "i1", State: "running"}, {ID: "i2", State: "deleted"}}}}}
	require.NoError(t, s.send(spec))
	st := s.expect(agentproto.TypeStatus, func(m agentproto.Message) bool { return m.Status.ObservedGeneration == 3 }).Status
	assert.Equal(t, []agentproto.InstanceStatus{{ID: "i1", State: "running"}}, st.Instances)
	require.NoError(t, s.send(spec))
	s.expect(agentproto.TypeStatus, func(m agentproto.Message) bool { return m.Status.ObservedGeneration == 3 })
	require.NoError(t, s.send(agentproto.Message{Type: agentproto.TypeSpec, Spec: &agentproto.Spec{Generation: 2, Body: agentproto.SpecBody{Instances: []agentproto.InstanceSpec{}}}}))
	s.expect(agentproto.TypeStatus, func(m agentproto.Message) bool { return m.Status.ObservedGeneration == 3 })
	log, err := os.ReadFile(filepath.Join(string(w.dir), "runtime", "applied.log"))
	require.NoError(t, err)
	assert.Equal(t, "3\n", string(log), "applied once")

	// A command runs once: re-sent (even with other args) it answers the
	// journaled result. A forged one is refused, and journaled too.
	require.NoError(t, s.send(w.command("cmd_1", `{"say":"hi"}`, w.signer)))
	r := s.result("cmd_1")
	require.True(t, r.OK, r.Error)
	assert.JSONEq(t, `{"say":"hi"}`, string(r.Output))
	assert.FileExists(t, w.dir.path("commands/cmd_1.json"))
	require.NoError(t, s.send(w.command("cmd_1", `{"say":"again"}`, w.signer)))
	assert.JSONEq(t, `{"say":"hi"}`, string(s.result("cmd_1").Output))
	require.NoError(t, s.send(w.command("cmd_2", `{}`, w.stranger)))
	r = s.result("cmd_2")
	assert.False(t, r.OK)
	assert.Contains(t, r.Error, "signature")
	assert.FileExists(t, w.dir.path("commands/cmd_2.json"))

	// The next session (the gateway dropped this one) says what was
	// observed.
	require.NoError(t, s.conn.CloseNow())
	s = g.next(t)
	assert.EqualValues(t, 3, s.hello.ObservedGeneration)
	st = s.expect(agentproto.TypeStatus, nil).Status
	assert.Len(t, st.Instances, 1)
}

// ranked is gws in node_a's order (rendezvous hashing): g1 first.
func ranked(gws ...*fakeGateway) (g1, g2 *fakeGateway) {
	a, b := gws[0], gws[1]
	if rank("node_a", agentproto.Gateway{URL: a.srv.URL}) < rank("node_a", agentproto.Gateway{URL: b.srv.URL}) {
		a, b = b, a
	}
	return a, b
}

func TestFailoverToTheNextGateway(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g1, g2 := ranked(w.gateway("gw_1", false), w.gateway("gw_2", false))
	w.setGateways("", g1, g2)
	w.run()

	s := g1.next(t)
	require.NoError(t, s.conn.CloseNow())
	s = g2.next(t)
	assert.Equal(t, agentproto.TransportMTLS, s.hello.Transport)
	require.Eventually(t, func() bool { st := w.status(); return st.Connected && st.GatewayID == g2.id }, waitFor, 10*time.Millisecond)

	// A draining gateway: the daemon leaves it for the other.
	require.NoError(t, s.send(agentproto.Message{Type: agentproto.TypeReconnect, Reconnect: &agentproto.Reconnect{DelayMS: 10}}))
	g1.next(t)
}

func TestFallbackWhenMutualTLSFailsIsRemembered(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g := w.gateway("gw_1", false)
	fb := w.gateway("public", true)
	g.refuse.Store(true) // a proxy in the way of mutual TLS
	w.setGateways(fb.wsURL(), g)
	w.run()

	s := fb.next(t)
	assert.Equal(t, agentproto.TransportWebSocket, s.hello.Transport)
	assert.Equal(t, "node_a", s.hello.NodeID)
	require.Eventually(t, func() bool { return w.status().Transport == agentproto.TransportWebSocket }, waitFor, 10*time.Millisecond)
	var remembered map[string]string
	require.NoError(t, readJSON(w.dir.path(fileTransports), &remembered))
	assert.Equal(t, agentproto.TransportWebSocket, remembered[g.srv.URL])

	// Mutual TLS works again, but the remembered transport is tried first.
	g.refuse.Store(false)
	tried := g.requests.Load()
	require.NoError(t, s.conn.CloseNow())
	s = fb.next(t)
	assert.Equal(t, agentproto.TransportWebSocket, s.hello.Transport)
	assert.Equal(t, tried, g.requests.Load(), "mutual TLS not tried first")
}

// A session on the fallback tries mutual TLS again now and then, and moves
// there once it answers: to the same gateway, remembered for next time.
func TestFallbackClimbsBackToMutualTLS(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour)
	g := w.gateway("gw_1", false)
	fb := w.gateway("public", true)
	g.refuse.Store(true)
	w.setGateways(fb.wsURL(), g)
	w.run(func(o *Options) { o.HigherRungRetry = 100 * time.Millisecond })

	s := fb.next(t)
	assert.Equal(t, agentproto.TransportWebSocket, s.hello.Transport)
	// Probes while the proxy is in the way change nothing.
	require.Eventually(t, func() bool { return g.requests.Load() >= 3 }, waitFor, 10*time.Millisecond)
	assert.Equal(t, agentproto.TransportWebSocket, w.status().Transport)

	g.refuse.Store(false)
	m := g.next(t)
	assert.Equal(t, agentproto.TransportMTLS, m.hello.Transport)
	require.Eventually(t, func() bool { st := w.status(); return st.Connected && st.Transport == agentproto.TransportMTLS }, waitFor, 10*time.Millisecond)
	var remembered map[string]string
	require.NoError(t, readJSON(w.dir.path(fileTransports), &remembered))
	assert.Equal(t, agentproto.TransportMTLS, remembered[g.srv.URL])
	select {
	case _, open := <-s.in:
		for open {
			_, open = <-s.in
		}
	case <-time.After(waitFor):
		t.Fatal("the fallback session was not closed")
	}
	select {
	case extra := <-g.sessions:
		t.Fatalf("a second session on the gateway (%s): the probe opened one", extra.hello.Transport)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestRenewalWritesTheNewCertificate(t *testing.T) {
	t.Parallel()
	// Past two thirds of its life.
	w := newWorld(t, 2*time.Hour, 30*time.Minute)
	g := w.gateway("gw_1", false)
	w.setGateways("", g)
	w.run()

	s := g.next(t)
	m := s.expect(agentproto.TypeRenew, nil)
	csr, err := x509.ParseCertificateRequest(m.Renew.CSR)
	require.NoError(t, err)
	require.NoError(t, csr.CheckSignature())
	assert.True(t, csr.PublicKey.(*ecdsa.PublicKey).Equal(&w.nodeKey.PublicKey), "a CSR for the same key")
	renewed := w.nodeCA.issue(t, csr.PublicKey, false, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	require.NoError(t, s.send(agentproto.Message{Type: agentproto.TypeRenewed, Renewed: &agentproto.Renewed{Certificate: renewed.Raw}}))
	require.Eventually(t, func() bool {
		_, c, err := w.dir.LoadIdentity()
		return err == nil && c.Equal(renewed)
	}, waitFor, 10*time.Millisecond)

	// The next dial presents it.
	require.NoError(t, s.conn.CloseNow())
	s = g.next(t)
	assert.True(t, s.peer.Equal(renewed))
}
