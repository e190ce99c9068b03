package gateway_test

// The gateway role in process, against a real PostgreSQL, dialled over
// real TLS: sessions, refusals of client certificates, specs, signed
// commands, the fallback and the sweeper. The compute-agent processes are
// exercised in daemons_e2e_test.go.

import (
	"bytes"
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
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/gateway"
	"computeplane/internal/join"
	"computeplane/internal/nodework"
	"computeplane/internal/pki"
	"computeplane/internal/testenv"
)

type world struct {
	env    *testenv.Env
	gw     *gateway.Gateway
	bundle *pki.Bundle
	c      *computeclient.Client
	poolID string
	gwURL  string
}

func setup(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	pkiFile := filepath.Join(dir, "pki.json")
	b, _, err := pki.Init(pkiFile, testenv.TestSecret, "test.local")
	require.NoError(t, err)
	port := testenv.FreePort(t)
	gwURL := fmt.Sprintf("https://127.0.0.1:%d", port)
	cfg := testenv.ConfigFile(t, fmt.Sprintf("gateway: {url: %q, region: eu, listen: \"127.0.0.1:%d\", drainDelayMs: 0, downAfterMs: 1000, sessionTicketDays: 7}\n", gwURL, port))
	env := testenv.Start(t, testenv.WithEnv("SERVICE_PKI", pkiFile), testenv.WithEnv("SERVICE_CONFIG", cfg),
		testenv.WithEnv("SERVICE_ROLES", "api,gateway"))
	gw := env.Host.Gateway()
	require.NotNil(t, gw)
	env.Host.Notifier().Start()
	t.Cleanup(env.Host.Notifier().Close)
	require.NoError(t, gw.Start(t.Context()))
	t.Cleanup(gw.Drain)
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")))
	site, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "p",
		Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	return &world{env: env, gw: gw, bundle: b, c: c, poolID: pool.Data.PoolId, gwURL: gwURL}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

func csrFor(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "host-1"}}, key)
	require.NoError(t, err)
	return der
}

func (w *world) token(t *testing.T) string {
	t.Helper()
	tok, err := w.c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: w.poolID})
	require.NoError(t, err)
	return tok.Data.Token
}

// join posts to /v1/join and returns the status and the decoded body.
func (w *world) join(t *testing.T, token string, key *ecdsa.PrivateKey) (int, agentproto.JoinResponse, string) {
	t.Helper()
	body, _ := json.Marshal(agentproto.JoinRequest{Token: token, CSR: csrFor(t, key)})
	resp, err := http.Post(w.env.URL+agentproto.JoinPath, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out agentproto.JoinResponse
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(raw.Bytes(), &out))
	}
	return resp.StatusCode, out, raw.String()
}

// joined is a node with its key and certificate.
type joined struct {
	nodeID string
	key    *ecdsa.PrivateKey
	cert   *x509.Certificate
	resp   agentproto.JoinResponse
}

func (w *world) newNode(t *testing.T) joined {
	t.Helper()
	key := newKey(t)
	status, resp, body := w.join(t, w.token(t), key)
	require.Equal(t, http.StatusOK, status, body)
	cert, err := x509.ParseCertificate(resp.Certificate)
	require.NoError(t, err)
	return joined{nodeID: resp.NodeID, key: key, cert: cert, resp: resp}
}

// dial opens an mTLS session with cert and sends a hello for node.
func (w *world) dial(ctx context.Context, cert *x509.Certificate, key *ecdsa.PrivateKey) (*websocket.Conn, error) {
	roots := x509.NewCertPool()
	roots.AddCert(w.bundle.ServingCA.Cert)
	tc := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}}}
	u := strings.Replace(w.gwURL, "https://", "wss://", 1) + agentproto.SessionPath
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}})
	return conn, err
}

func send(t *testing.T, conn *websocket.Conn, m agentproto.Message) {
	t.Helper()
	b, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, conn.Write(t.Context(), websocket.MessageText, b))
}

func recv(ctx context.Context, conn *websocket.Conn) (agentproto.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, b, err := conn.Read(ctx)
	if err != nil {
		return agentproto.Message{}, err
	}
	return agentproto.Decode(b)
}

func hello(node string, gen int64) agentproto.Message {
	return agentproto.Message{Type: agentproto.TypeHello, Hello: &agentproto.Hello{NodeID: node, ProtocolMin: 1, ProtocolMax: 1,
		AgentVersion: "test", Transport: agentproto.TransportMTLS, ObservedGeneration: gen,
		Inventory: agentproto.Inventory{Hostname: "h", VCPU: 8, MemoryMiB: 16384, DiskGiB: 100, Runtime: "recording"}}}
}

// session dials and completes hello/welcome.
func (w *world) session(t *testing.T, n joined) *websocket.Conn {
	t.Helper()
	conn, err := w.dial(t.Context(), n.cert, n.key)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseNow() })
	send(t, conn, hello(n.nodeID, 0))
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeWelcome, m.Type, "%+v", m.Error)
	require.Equal(t, w.gw.ID(), m.Welcome.GatewayID)
	require.Equal(t, 1, m.Welcome.TrustVersion, "the first bundle a deployment sees is version 1")
	return conn
}

// A changed bundle takes the next trust version by itself; the same one
// keeps its version; pki.trustVersion is the lowest.
func TestTrustVersions(t *testing.T) {
	t.Parallel()
	w := setup(t)
	q := db.New(w.env.Store.Pool())
	version := func(fp string, lowest int32) int32 {
		v, err := q.AddTrustVersion(t.Context(), db.AddTrustVersionParams{Fingerprint: fp, Lowest: lowest})
		require.NoError(t, err)
		return v
	}
	assert.EqualValues(t, 1, version(w.bundle.TrustFingerprint(), 1), "the running bundle")
	assert.EqualValues(t, 2, version("changed", 1))
	assert.EqualValues(t, 1, version(w.bundle.TrustFingerprint(), 1), "kept")
	assert.EqualValues(t, 7, version("rotated", 7), "never below pki.trustVersion")
}

func (w *world) nodeState(t *testing.T, node string) string {
	t.Helper()
	n, err := w.c.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: node})
	require.NoError(t, err)
	return string(n.Data.State)
}

func (w *world) wake(t *testing.T, topic string) {
	t.Helper()
	w.env.Host.Notifier().Wake(topic)
}

func TestSessionMakesTheNodeReadyAndCarriesSpecsAndCommands(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	assert.Equal(t, "joining", w.nodeState(t, n.nodeID))
	assert.Equal(t, "test.local", n.resp.TrustDomain)
	require.Len(t, n.resp.Gateways, 1, "the region's live gateway")
	assert.Equal(t, w.gw.ID(), n.resp.Gateways[0].ID)
	assert.True(t, strings.HasPrefix(n.resp.FallbackURL, "ws://"), n.resp.FallbackURL)

	conn := w.session(t, n)
	assert.Equal(t, "ready", w.nodeState(t, n.nodeID))
	node, err := w.c.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: n.nodeID})
	require.NoError(t, err)
	assert.EqualValues(t, 8, node.Data.Capacity.Vcpu, "capacity follows the inventory")
	var registered int
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
		`select count(*) from outbox where type = 'node.registered' and subject = $1`, n.nodeID).Scan(&registered))
	assert.Equal(t, 1, registered)

	// A spec reaches the daemon at once (the notifier), once.
	// It arrives as it was put, through node_specs.
	var gen int64
	var topic string
	body := agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "i1", State: "running", Hostname: "web-1", VCPU: 2, MemoryMiB: 512, DiskGiB: 3,
		Boot:     agentproto.Boot{Format: "qcow2", Location: "https://images.example/a.qcow2", SHA256: "ab"},
		Identity: &agentproto.SpecIdentity{Generation: 2, Hostname: "web-1", MachineID: "m", Env: map[string]string{"A": "1"}},
		Volumes:  []agentproto.SpecVolume{{Serial: "v1", MountPath: "/data"}}}},
		Volumes: []agentproto.VolumeSpec{{Serial: "v1", SizeGiB: 1}}}
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		gen, topic, err = nodework.PutSpec(ctx, tx, n.nodeID, body)
		return err
	}))
	assert.Equal(t, gateway.Topic(w.gw.ID()), topic)
	w.wake(t, topic)
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeSpec, m.Type)
	assert.Equal(t, gen, m.Spec.Generation)
	assert.Equal(t, body, m.Spec.Body)
	send(t, conn, agentproto.Message{Type: agentproto.TypeStatus, Status: &agentproto.Status{ObservedGeneration: gen,
		Instances: []agentproto.InstanceStatus{{ID: "i1", State: "running"}}, VolumeStore: agentproto.VolumeStore{AvailableBytes: 1 << 30}}})
	require.Eventually(t, func() bool {
		var observed int64
		_ = w.env.Store.Pool().QueryRow(t.Context(), `select observed_generation from nodes where node_id = $1`, n.nodeID).Scan(&observed)
		return observed == gen
	}, 5*time.Second, 20*time.Millisecond)

	// A command arrives signed by the deployment's command key for this
	// node; without a result the sweeper sends it again; the result is
	// recorded once.
	var cmdID string
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		c, topic, err := nodework.EnqueueCommand(ctx, tx, n.nodeID, agentproto.CommandEcho, json.RawMessage(`{"say":"hi"}`), "test", time.Minute, time.Now())
		cmdID = c.CommandID
		w.wake(t, topic)
		return err
	}))
	m, err = recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeCommand, m.Type)
	require.NoError(t, m.Command.Verify([]ed25519Key{w.bundle.CommandKey()}, n.nodeID, time.Now()))
	assert.ErrorIs(t, m.Command.Verify([]ed25519Key{w.bundle.CommandKey()}, "node_other", time.Now()), agentproto.ErrOtherNode)
	tampered := *m.Command
	tampered.Args = json.RawMessage(`{"say":"rm -rf"}`)
	assert.ErrorIs(t, tampered.Verify([]ed25519Key{w.bundle.CommandKey()}, n.nodeID, time.Now()), agentproto.ErrBadSignature)

	_, err = w.env.Store.Pool().Exec(t.Context(), `update node_commands set sent_at = now() - interval '1 minute' where command_id = $1`, cmdID)
	require.NoError(t, err)
	sw := &gateway.Sweeper{Store: w.env.Store, Notifier: w.env.Host.Notifier(), DownAfter: time.Hour, Log: discard()}
	require.NoError(t, sw.Pass(t.Context(), noFence))
	m, err = recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeCommand, m.Type, "re-sent by the sweeper")
	assert.Equal(t, cmdID, m.Command.ID)
	send(t, conn, agentproto.Message{Type: agentproto.TypeResult, Result: &agentproto.Result{ID: cmdID, OK: true, Output: json.RawMessage(`{"say":"hi"}`)}})
	require.Eventually(t, func() bool {
		var state string
		_ = w.env.Store.Pool().QueryRow(t.Context(), `select state from node_commands where command_id = $1`, cmdID).Scan(&state)
		return state == "succeeded"
	}, 5*time.Second, 20*time.Millisecond)

	// The session ends: after downAfter the sweeper marks the node down
	// (node.down); a new session brings it back (node.up).
	require.NoError(t, conn.Close(websocket.StatusNormalClosure, ""))
	sw.DownAfter = time.Second
	require.Eventually(t, func() bool {
		require.NoError(t, sw.Pass(t.Context(), noFence))
		return w.nodeStateDB(t, n.nodeID) == "down"
	}, 10*time.Second, 100*time.Millisecond)
	w.session(t, n)
	assert.Equal(t, "ready", w.nodeState(t, n.nodeID))
	for _, typ := range []string{"node.down", "node.up"} {
		var count int
		require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
			`select count(*) from outbox where type = $1 and subject = $2`, typ, n.nodeID).Scan(&count))
		assert.Equal(t, 1, count, typ)
	}
}

func (w *world) nodeStateDB(t *testing.T, node string) string {
	var s string
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select state from nodes where node_id = $1`, node).Scan(&s))
	return s
}

func noFence(context.Context, pgx.Tx) error { return nil }

func TestClientCertificateRefusals(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	now := time.Now()
	uri := "spiffe://test.local/node/" + n.nodeID
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	for name, cert := range map[string]*x509.Certificate{
		"another CA":           gateway.CertFrom(t, other.NodeCA, n.key, uri, now.Add(-time.Hour), now.Add(time.Hour)),
		"expired":              gateway.CertFrom(t, w.bundle.NodeCA, n.key, uri, now.Add(-2*time.Hour), now.Add(-time.Hour)),
		"another trust domain": gateway.CertFrom(t, w.bundle.NodeCA, n.key, "spiffe://other.local/node/"+n.nodeID, now.Add(-time.Hour), now.Add(time.Hour)),
	} {
		conn, err := w.dial(t.Context(), cert, n.key)
		if err == nil {
			// TLS 1.3 verifies the client after the handshake: the refusal
			// arrives on the first read.
			_, _, err = conn.Read(t.Context())
			_ = conn.CloseNow()
		}
		assert.Error(t, err, name)
	}

	// A revoked certificate: the open session is closed at once, a new
	// one is refused, although the gateway remembers that its chain
	// verified (chaincache.go); a certificate of another CA for the same
	// node and key is still refused after that.
	conn := w.session(t, n)
	forged, err := w.dial(t.Context(), gateway.CertFrom(t, other.NodeCA, n.key, uri, now.Add(-time.Hour), now.Add(time.Hour)), n.key)
	if err == nil {
		_, _, err = forged.Read(t.Context())
		_ = forged.CloseNow()
	}
	assert.Error(t, err, "another CA, with the node's own chain remembered")
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return gateway.Revoke(ctx, tx, gateway.RevokeSerial, pki.SerialHex(n.cert), "test")
	}))
	w.wake(t, gateway.TopicRevocations)
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	assert.Equal(t, agentproto.TypeRevoked, m.Type)
	_, err = recv(t.Context(), conn)
	assert.Error(t, err, "closed")
	conn2, err := w.dial(t.Context(), n.cert, n.key)
	if err == nil {
		_, _, err = conn2.Read(t.Context())
		_ = conn2.CloseNow()
	}
	assert.Error(t, err, "revoked")
	// The closed session leaves the gateway's table as its handler ends.
	assert.Eventually(t, func() bool { return w.gw.Sessions() == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestJoinRefusals(t *testing.T) {
	t.Parallel()
	w := setup(t)
	token := w.token(t)
	key := newKey(t)
	status, first, body := w.join(t, token, key)
	require.Equal(t, http.StatusOK, status, body)

	// The same token with another key: refused, nothing made.
	status, _, body = w.join(t, token, newKey(t))
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, body, "UNAUTHENTICATED")
	assert.Contains(t, body, "used by another key")
	// The same key again (a retry after a lost answer) gets the same node.
	status, again, body := w.join(t, token, key)
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, first.NodeID, again.NodeID)

	// A token of another deployment, and garbage.
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	foreign := mintWith(t, w, other)
	for _, tok := range []string{foreign, "cjt_AAAA", "not-a-token"} {
		status, _, body = w.join(t, tok, newKey(t))
		assert.Equal(t, http.StatusUnauthorized, status, tok)
		assert.Contains(t, body, "not a join token of this deployment")
	}
	// An expired token.
	expired := mintTTL(t, w, time.Second)
	time.Sleep(1100 * time.Millisecond)
	status, _, body = w.join(t, expired, newKey(t))
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, body, "expired")
	var nodes int
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select count(*) from nodes`).Scan(&nodes))
	assert.Equal(t, 1, nodes, "refused joins make no node")
}

func TestFallbackProvesIdentityInBand(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	dial := func(signer *ecdsa.PrivateKey) (*websocket.Conn, agentproto.Message) {
		// The env's server is not at the configured base URL: same path,
		// the test server's address.
		u, err := url.Parse(n.resp.FallbackURL)
		require.NoError(t, err)
		conn, _, err := websocket.Dial(t.Context(), strings.Replace(w.env.URL, "http://", "ws://", 1)+u.Path, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.CloseNow() })
		m, err := recv(t.Context(), conn)
		require.NoError(t, err)
		require.Equal(t, agentproto.TypeChallenge, m.Type)
		digest := sha256.Sum256(append([]byte(agentproto.ProofContext), m.Challenge.Nonce...))
		sig, err := ecdsa.SignASN1(rand.Reader, signer, digest[:])
		require.NoError(t, err)
		send(t, conn, agentproto.Message{Type: agentproto.TypeProof, Proof: &agentproto.Proof{Chain: [][]byte{n.cert.Raw}, Signature: sig}})
		return conn, m
	}
	// Signed by another key than the certificate's: refused.
	conn, _ := dial(newKey(t))
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeError, m.Type)
	assert.Equal(t, "UNAUTHENTICATED", m.Error.Code)

	conn, _ = dial(n.key)
	h := hello(n.nodeID, 0)
	h.Hello.Transport = agentproto.TransportWebSocket
	send(t, conn, h)
	m, err = recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeWelcome, m.Type)
	var transport string
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select session_transport from nodes where node_id = $1`, n.nodeID).Scan(&transport))
	assert.Equal(t, agentproto.TransportWebSocket, transport)
}

type ed25519Key = ed25519.PublicKey

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func mintTTL(t *testing.T, w *world, ttl time.Duration) string {
	t.Helper()
	var pool string
	var site string
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select pool_id, site_id from pools where pool_id = $1`, w.poolID).Scan(&pool, &site))
	var token string
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		token, _, err = join.Mint(ctx, tx, w.bundle, "acme", pool, site, "test", ttl, time.Now())
		return err
	}))
	return token
}

// mintWith mints a token sealed to another deployment's join key.
func mintWith(t *testing.T, w *world, b *pki.Bundle) string {
	t.Helper()
	saved := w.bundle
	w.bundle = b
	defer func() { w.bundle = saved }()
	return mintTTL(t, w, time.Minute)
}

// A daemon renews its certificate over the session: the same key gets a
// new certificate (recorded on the node), another key gets nothing.
func TestCertificateRenewalOverTheSession(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	conn := w.session(t, n)
	send(t, conn, agentproto.Message{Type: agentproto.TypeRenew, Renew: &agentproto.Renew{CSR: csrFor(t, newKey(t))}})
	send(t, conn, agentproto.Message{Type: agentproto.TypeRenew, Renew: &agentproto.Renew{CSR: csrFor(t, n.key)}})
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeRenewed, m.Type, "only the request for the session's key is answered")
	renewed, err := x509.ParseCertificate(m.Renewed.Certificate)
	require.NoError(t, err)
	node, err := w.bundle.VerifyNode(renewed, time.Now())
	require.NoError(t, err)
	assert.Equal(t, n.nodeID, node)
	assert.NotEqual(t, n.cert.SerialNumber, renewed.SerialNumber)
	var serial string
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select cert_serial from nodes where node_id = $1`, n.nodeID).Scan(&serial))
	assert.Equal(t, pki.SerialHex(renewed), serial)
}

// The internal control API answers clients with a certificate from the
// internal CA only; the api's client reaches it through the gateway's row.
func TestInternalControlAPI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pkiFile := filepath.Join(dir, "pki.json")
	b, _, err := pki.Init(pkiFile, testenv.TestSecret, "test.local")
	require.NoError(t, err)
	port, internalPort := testenv.FreePort(t), testenv.FreePort(t)
	cfg := testenv.ConfigFile(t, fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: eu, listen: \"127.0.0.1:%d\", internalListen: \"127.0.0.1:%d\"}\n",
		port, port, internalPort))
	env := testenv.Start(t, testenv.WithEnv("SERVICE_PKI", pkiFile), testenv.WithEnv("SERVICE_CONFIG", cfg), testenv.WithEnv("SERVICE_ROLES", "api,gateway"))
	gw := env.Host.Gateway()
	require.NoError(t, gw.Start(t.Context()))
	t.Cleanup(gw.Drain)
	var internalURL string
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), `select internal_url from gateways where gateway_id = $1`, gw.ID()).Scan(&internalURL))
	assert.Equal(t, fmt.Sprintf("https://127.0.0.1:%d", internalPort), internalURL)

	roots := x509.NewCertPool()
	roots.AddCert(b.InternalCA.Cert)
	get := func(cert *tls.Certificate) (int, error) {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		resp, err := hc.Get(internalURL + gateway.InternalSessions)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}
	internal, err := b.IssueInternal("test", nil, false)
	require.NoError(t, err)
	status, err := get(&internal)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)

	// No certificate, a node's, the internal CA of another deployment:
	// refused in the handshake.
	key := newKey(t)
	nodeCert := gateway.CertFrom(t, b.NodeCA, key, "spiffe://test.local/node/node_x", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	foreign, err := other.IssueInternal("test", nil, false)
	require.NoError(t, err)
	for name, c := range map[string]*tls.Certificate{
		"none": nil, "a node certificate": {Certificate: [][]byte{nodeCert.Raw}, PrivateKey: key}, "another internal CA": &foreign,
	} {
		_, err := get(c)
		assert.Error(t, err, name)
	}

	// The api's client wakes the gateway and pushes revocations.
	client := gateway.NewInternalClient(env.Store, func() (*pki.Bundle, error) { return b, nil }, discard())
	require.NoError(t, client.Wake(t.Context(), gw.ID(), gateway.Topic(gw.ID())))
	require.NoError(t, client.PushRevocations(t.Context()))
	// Without the internal CA (no PKI bundle), the client refuses.
	none := gateway.NewInternalClient(env.Store, func() (*pki.Bundle, error) { return nil, pki.ErrNoBundle }, discard())
	assert.ErrorContains(t, none.Wake(t.Context(), gw.ID(), "x"), "no internal CA")
}
