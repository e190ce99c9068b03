package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"expvar"
	"fmt"
	"os"
	"path/filepath"
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

// These tests read the process's gateway counters (expvar), so they do
// not run in parallel: no other test's handshakes move them meanwhile.

// chainCounts is the gateway counters of client chains: verified (x509),
// found verified before (the cache), resumed without verification.
type chainCounts struct{ verified, cached, resumed int64 }

func chainStats() chainCounts {
	m := expvar.Get("gateway").(*expvar.Map)
	v := func(k string) int64 {
		if i, ok := m.Get(k).(*expvar.Int); ok {
			return i.Value()
		}
		return 0 // a counter this build lacks
	}
	return chainCounts{v("chainsVerified"), v("chainsCached"), v("chainsResumed")}
}

func (c chainCounts) since(before chainCounts) chainCounts {
	return chainCounts{c.verified - before.verified, c.cached - before.cached, c.resumed - before.resumed}
}

// startGateway starts another gateway of w's deployment (its bundle) with
// roots (zero: the bundle's node CA) and clock now.
func startGateway(t *testing.T, w *world, roots config.PEM, now func() time.Time) (*gateway.Gateway, string) {
	t.Helper()
	port := testenv.FreePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	g, err := gateway.New(gateway.Options{
		Config:      &config.Gateway{URL: url, Region: "eu", Listen: fmt.Sprintf("127.0.0.1:%d", port), MaxStreams: 100, DownAfter: time.Second, SessionTicketDays: 7},
		NodeCARoots: roots,
		Bundle:      func() (*pki.Bundle, error) { return w.bundle, nil },
		Store:       w.env.Store, Notifier: w.env.Host.Notifier(), Log: discard(), Now: now,
	})
	require.NoError(t, err)
	require.NoError(t, g.Start(t.Context()))
	t.Cleanup(g.Drain)
	return g, url
}

func writeRoots(t *testing.T, path string, certs ...*x509.Certificate) {
	t.Helper()
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	require.NoError(t, os.WriteFile(path, out, 0o600))
}

// session dials url with the daemon's ticket cache, says hello and
// closes; it answers whether the TLS session resumed.
func session(t *testing.T, w *world, url string, n joined, tickets tls.ClientSessionCache) bool {
	t.Helper()
	conn, resumed, err := dialResuming(t.Context(), url, w.bundle, n, tickets)
	require.NoError(t, err)
	welcomed(t, conn, n.nodeID)
	_ = conn.Close(websocket.StatusNormalClosure, "")
	return resumed
}

// refused dials url and expects the gateway to refuse the connection in
// the TLS handshake (VerifyConnection), not later at the upgrade (an HTTP
// status). The alert or a reset, whichever the client sees first.
func refused(t *testing.T, w *world, url string, n joined, tickets tls.ClientSessionCache) {
	t.Helper()
	conn, _, err := dialResuming(t.Context(), url, w.bundle, n, tickets)
	if err == nil {
		// TLS 1.3: the server's refusal arrives on the first read.
		_, _, err = conn.Read(t.Context())
		_ = conn.CloseNow()
	}
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "status code", "refused in the handshake, not at the upgrade")
}

// ticketAndRestart gives a node a session ticket from the deployment's
// gateway (a full handshake) and starts another gateway with the same
// bundle and roots, as a restart does: its verified-chain cache is empty.
func ticketAndRestart(t *testing.T) (*world, joined, *resumptions, string) {
	t.Helper()
	w := setup(t)
	n := w.newNode(t)
	tickets := &resumptions{ClientSessionCache: tls.NewLRUClientSessionCache(agent.TicketCacheSize)}
	assert.False(t, session(t, w, w.gwURL, n, tickets), "the first session is a full handshake")
	_, url := startGateway(t, w, config.PEM{}, nil)
	return w, n, tickets, url
}

// A daemon resuming its TLS session on a restarted gateway (an empty
// verified-chain cache) is accepted without its chain verified again: the
// ticket opened under a key bound to the same roots. Its node is still
// checked against the revocation set: revoked, it cannot resume.
func TestResumedSessionSkipsTheChainVerification(t *testing.T) {
	w, n, tickets, url := ticketAndRestart(t)
	before := chainStats()
	conn, resumed, err := dialResuming(t.Context(), url, w.bundle, n, tickets)
	require.NoError(t, err)
	assert.True(t, resumed, "resumed on the restarted gateway")
	welcomed(t, conn, n.nodeID)
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before), "the resumed chain is not verified again")

	// Revoked: the open session ends (the gateway has the revocation),
	// and the node's ticket no longer resumes.
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return gateway.Revoke(ctx, tx, gateway.RevokeNode, n.nodeID, "test")
	}))
	w.wake(t, gateway.TopicRevocations)
	m, err := recv(t.Context(), conn)
	require.NoError(t, err)
	assert.Equal(t, agentproto.TypeRevoked, m.Type)
	_ = conn.CloseNow()
	offered := tickets.offered.Load()
	before = chainStats()
	refused(t, w, url, n, tickets) // a revoked node cannot resume
	assert.Equal(t, offered+1, tickets.offered.Load(), "the refused dial offered its ticket")
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before), "refused on the resumed path")
}

// A resumed chain is remembered as verified: after a restart its daemons
// resumed on, a daemon's full handshake (its tickets gone) finds its chain
// in the cache instead of verifying it.
func TestResumedChainIsRememberedAsVerified(t *testing.T) {
	w, n, tickets, url := ticketAndRestart(t)
	before := chainStats()
	assert.True(t, session(t, w, url, n, tickets), "resumed on the restarted gateway")
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before))
	before = chainStats()
	assert.False(t, session(t, w, url, n, tls.NewLRUClientSessionCache(1)), "no ticket: a full handshake")
	assert.Equal(t, chainCounts{cached: 1}, chainStats().since(before), "found verified before")
}

// A ticket sealed under other node CA roots does not open: the daemon
// does a full handshake, its chain verified. Gateways with the same roots
// (in any order, from a file or from the bundle) resume each other's
// tickets; roots re-read from a changed file give the live gateway new
// ticket keys.
func TestTicketSealedUnderOtherRootsIsNotResumed(t *testing.T) {
	w := setup(t)
	n := w.newNode(t)
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	dir := t.TempDir()
	own, both, reversed, live := filepath.Join(dir, "own.pem"), filepath.Join(dir, "both.pem"), filepath.Join(dir, "reversed.pem"), filepath.Join(dir, "live.pem")
	writeRoots(t, own, w.bundle.NodeCA.Cert)
	writeRoots(t, both, w.bundle.NodeCA.Cert, other.NodeCA.Cert)
	writeRoots(t, reversed, other.NodeCA.Cert, w.bundle.NodeCA.Cert)
	writeRoots(t, live, w.bundle.NodeCA.Cert)
	tickets := tls.NewLRUClientSessionCache(agent.TicketCacheSize)
	assert.False(t, session(t, w, w.gwURL, n, tickets))

	// The same roots from a file: the bundle gateway's ticket resumes.
	_, ownURL := startGateway(t, w, config.PEM{File: own}, nil)
	before := chainStats()
	assert.True(t, session(t, w, ownURL, n, tickets), "the same roots, the same ticket keys")
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before))

	// Other roots (one more CA): full handshake, verified.
	_, bothURL := startGateway(t, w, config.PEM{File: both}, nil)
	before = chainStats()
	assert.False(t, session(t, w, bothURL, n, tickets), "a ticket sealed under other roots does not resume")
	assert.Equal(t, chainCounts{verified: 1}, chainStats().since(before), "the chain is verified")

	// The same two roots in the other order: that gateway's ticket resumes.
	_, reversedURL := startGateway(t, w, config.PEM{File: reversed}, nil)
	before = chainStats()
	assert.True(t, session(t, w, reversedURL, n, tickets), "the same roots in another order")
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before))

	// A live gateway whose roots file changes.
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	_, liveURL := startGateway(t, w, config.PEM{File: live}, now)
	assert.False(t, session(t, w, liveURL, n, tickets), "other roots than the last gateway's")
	assert.True(t, session(t, w, liveURL, n, tickets), "its own ticket")
	writeRoots(t, live, w.bundle.NodeCA.Cert, other.NodeCA.Cert)
	skew.Store(int64(gateway.ReloadEvery + time.Second))
	before = chainStats()
	assert.False(t, session(t, w, liveURL, n, tickets), "the roots changed: tickets sealed before do not resume")
	assert.Equal(t, chainCounts{verified: 1}, chainStats().since(before))
	before = chainStats()
	assert.True(t, session(t, w, liveURL, n, tickets), "a ticket sealed under the new roots resumes")
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before))
}

// A ticket outlives the certificate it carries: once the certificate has
// expired by the gateway's clock, the resumption is refused although the
// ticket still opens.
func TestResumedSessionWithAnExpiredCertificateIsRefused(t *testing.T) {
	w := setup(t)
	n := w.newNode(t)
	// A certificate of the node valid for an hour more.
	n.cert = gateway.CertFrom(t, w.bundle.NodeCA, n.key, "spiffe://test.local/node/"+n.nodeID, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	_, url := startGateway(t, w, config.PEM{}, now)
	tickets := &resumptions{ClientSessionCache: tls.NewLRUClientSessionCache(agent.TicketCacheSize)}
	assert.False(t, session(t, w, url, n, tickets))
	before := chainStats()
	assert.True(t, session(t, w, url, n, tickets))
	assert.Equal(t, chainCounts{resumed: 1}, chainStats().since(before))

	skew.Store(int64(2 * time.Hour))
	offered := tickets.offered.Load()
	before = chainStats()
	refused(t, w, url, n, tickets) // the certificate expired since the ticket was sealed
	assert.Equal(t, offered+1, tickets.offered.Load(), "the dial offered its ticket")
	assert.Equal(t, chainCounts{}, chainStats().since(before), "refused before any chain check")
}
