package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent"
	"computeplane/internal/agentproto"
	"computeplane/internal/config"
	"computeplane/internal/gateway"
	"computeplane/internal/pki"
	"computeplane/internal/testenv"
)

// resumptions counts the tickets a daemon's session cache handed to a
// handshake: a dial that found one tried to resume.
type resumptions struct {
	tls.ClientSessionCache
	offered atomic.Int64
}

func (r *resumptions) Get(key string) (*tls.ClientSessionState, bool) {
	s, ok := r.ClientSessionCache.Get(key)
	if ok {
		r.offered.Add(1)
	}
	return s, ok
}

// dialResuming is a daemon's mutual-TLS dial (agent.MTLSConfig) with its
// ticket cache; it answers whether the TLS session resumed.
func dialResuming(ctx context.Context, url string, bundle *pki.Bundle, n joined, tickets tls.ClientSessionCache) (*websocket.Conn, bool, error) {
	roots := x509.NewCertPool()
	roots.AddCert(bundle.ServingCA.Cert)
	tc := agent.MTLSConfig(roots, "127.0.0.1", func() *tls.Certificate {
		return &tls.Certificate{Certificate: [][]byte{n.cert.Raw}, PrivateKey: n.key, Leaf: n.cert}
	}, tickets)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "wss://"+url[len("https://"):]+agentproto.SessionPath,
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}})
	if err != nil {
		return nil, false, err
	}
	return conn, resp.TLS != nil && resp.TLS.DidResume, nil
}

// welcomed sends the hello and reads the welcome (reading also takes in
// the ticket the gateway sent after the handshake).
func welcomed(t *testing.T, conn *websocket.Conn, node string) agentproto.Message {
	t.Helper()
	send(t, conn, hello(node, 0))
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeWelcome, m.Type, "%+v", m.Error)
	return m
}

// A daemon's TLS session resumes on a restarted gateway (a new gateway of
// the deployment: the same PKI bundle, so the same ticket keys) without a
// full handshake; a node revoked after it got its ticket cannot resume.
func TestDaemonResumesItsTLSSessionOnARestartedGateway(t *testing.T) {
	t.Parallel()
	w := setup(t)
	n := w.newNode(t)
	tickets := &resumptions{ClientSessionCache: tls.NewLRUClientSessionCache(agent.TicketCacheSize)}

	conn, resumed, err := dialResuming(t.Context(), w.gwURL, w.bundle, n, tickets)
	require.NoError(t, err)
	assert.False(t, resumed, "the first session is a full handshake")
	welcomed(t, conn, n.nodeID)
	_, ok := tickets.Get("127.0.0.1")
	require.True(t, ok, "the gateway gave a session ticket")
	_ = conn.Close(websocket.StatusNormalClosure, "")

	// The restarted gateway: a new process of the deployment, a new id.
	port := testenv.FreePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	g2, err := gateway.New(gateway.Options{
		Config: &config.Gateway{URL: url, Region: "eu", Listen: fmt.Sprintf("127.0.0.1:%d", port), MaxStreams: 100, DownAfter: time.Second, SessionTicketDays: 7},
		Bundle: func() (*pki.Bundle, error) { return w.bundle, nil },
		Store:  w.env.Store, Notifier: w.env.Host.Notifier(), Log: discard(),
	})
	require.NoError(t, err)
	require.NoError(t, g2.Start(t.Context()))
	t.Cleanup(g2.Drain)

	offered := tickets.offered.Load()
	conn, resumed, err = dialResuming(t.Context(), url, w.bundle, n, tickets)
	require.NoError(t, err)
	assert.True(t, resumed, "the session resumed with the first gateway's ticket")
	assert.Equal(t, offered+1, tickets.offered.Load())
	m := welcomed(t, conn, n.nodeID)
	assert.Equal(t, g2.ID(), m.Welcome.GatewayID)
	var serial string
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select cert_serial from nodes where node_id = $1`, n.nodeID).Scan(&serial))
	assert.Equal(t, pki.SerialHex(n.cert), serial, "the resumed session names the certificate its ticket carries")

	// Revoked: the open session ends, and its fresh ticket does not
	// resume.
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return gateway.Revoke(ctx, tx, gateway.RevokeNode, n.nodeID, "test")
	}))
	w.wake(t, gateway.TopicRevocations)
	m, err = recv(t.Context(), conn)
	require.NoError(t, err)
	assert.Equal(t, agentproto.TypeRevoked, m.Type)
	_ = conn.CloseNow()
	offered = tickets.offered.Load()
	conn, _, err = dialResuming(t.Context(), url, w.bundle, n, tickets)
	if err == nil {
		// TLS 1.3: the server's refusal arrives on the first read.
		_, _, err = conn.Read(t.Context())
		_ = conn.CloseNow()
	}
	assert.Error(t, err, "a revoked node cannot resume")
	assert.Equal(t, offered+1, tickets.offered.Load(), "the refused dial offered its ticket")

	// gateway.sessionTicketDays 0 (the default) gives no tickets.
	port = testenv.FreePort(t)
	url = fmt.Sprintf("https://127.0.0.1:%d", port)
	g0, err := gateway.New(gateway.Options{
		Config: &config.Gateway{URL: url, Region: "eu", Listen: fmt.Sprintf("127.0.0.1:%d", port), MaxStreams: 100, DownAfter: time.Second},
		Bundle: func() (*pki.Bundle, error) { return w.bundle, nil },
		Store:  w.env.Store, Notifier: w.env.Host.Notifier(), Log: discard(),
	})
	require.NoError(t, err)
	require.NoError(t, g0.Start(t.Context()))
	t.Cleanup(g0.Drain)
	other := w.newNode(t)
	none := tls.NewLRUClientSessionCache(agent.TicketCacheSize)
	conn, resumed, err = dialResuming(t.Context(), url, w.bundle, other, none)
	require.NoError(t, err)
	assert.False(t, resumed)
	welcomed(t, conn, other.nodeID)
	_, ok = none.Get("127.0.0.1")
	assert.False(t, ok, "no ticket without gateway.sessionTicketDays")
	_ = conn.CloseNow()
}
