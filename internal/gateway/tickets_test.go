package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/pki"
)

// resumedGateway is a gateway (not started) of a fresh bundle whose clock
// reads *now, and a maker of its node's certificates valid in [from, until).
func resumedGateway(t testing.TB, now *time.Time) (*Gateway, func(from, until time.Time) []*x509.Certificate) {
	b, err := pki.Generate("test.local")
	require.NoError(t, err)
	g, err := New(Options{
		Config: &config.Gateway{URL: "https://127.0.0.1:1", Region: "eu", SessionTicketDays: 7},
		Bundle: func() (*pki.Bundle, error) { return b, nil }, Log: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return *now },
	})
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return g, func(from, until time.Time) []*x509.Certificate {
		return []*x509.Certificate{nodeCert(t, b.NodeCA, key, "spiffe://test.local/node/node_1", from, until)}
	}
}

// A resumed session's chain is not verified, but its certificates'
// validity at the gateway's clock is checked, and outside the roots' own
// validity the chain is verified in full (and refused, the root expired).
func TestResumedChainChecksValidityAndFallsBackOutsideTheRoots(t *testing.T) {
	now := time.Now()
	g, issue := resumedGateway(t, &now)
	certs := issue(now.Add(-time.Hour), now.Add(time.Hour))
	tr := g.currentTrust()
	before := [3]int64{statChainsVerified.Value(), statChainsCached.Value(), statChainsResumed.Value()}
	counts := func() [3]int64 {
		return [3]int64{statChainsVerified.Value() - before[0], statChainsCached.Value() - before[1], statChainsResumed.Value() - before[2]}
	}

	node, err := g.verifyCerts(tr, certs, true)
	require.NoError(t, err)
	assert.Equal(t, "node_1", node)
	assert.Equal(t, [3]int64{0, 0, 1}, counts(), "resumed: not verified")

	_, err = g.verifyCerts(tr, issue(now.Add(time.Minute), now.Add(time.Hour)), true)
	assert.ErrorContains(t, err, "validity", "not yet valid")
	now = certs[0].NotAfter.Add(time.Second)
	_, err = g.verifyCerts(tr, certs, true)
	assert.ErrorContains(t, err, "validity", "expired since the ticket")
	assert.Equal(t, [3]int64{0, 0, 1}, counts())

	// The node CA root expired (a leaf outliving it): verified, refused.
	now = g.bundle.NodeCA.Cert.NotAfter.Add(time.Hour)
	late := issue(now.Add(-time.Hour), now.Add(time.Hour))
	_, err = g.verifyCerts(tr, late, true)
	assert.Error(t, err, "the root expired")
	assert.Equal(t, [3]int64{1, 0, 1}, counts(), "verified, not taken as resumed")
}

// What the resumed path saves on a restarted gateway: x509's Verify of the
// chain (its cache empty) against the checks a resumed chain gets.
func BenchmarkResumedChainCheck(b *testing.B) {
	now := time.Now()
	g, issue := resumedGateway(b, &now)
	certs := issue(now.Add(-time.Hour), now.Add(time.Hour))
	tr := g.currentTrust()
	b.Run("verified", func(b *testing.B) {
		for b.Loop() {
			g.chains.mu.Lock()
			clear(g.chains.m) // a restarted gateway's
			g.chains.mu.Unlock()
			if _, err := g.verifyCerts(tr, certs, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("resumed", func(b *testing.B) {
		for b.Loop() {
			if _, err := g.verifyCerts(tr, certs, true); err != nil {
				b.Fatal(err)
			}
		}
	})
}
