package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/pki"
)

// nodeCert signs a client certificate for key with ca, naming uri, valid
// in [from, until).
func nodeCert(t testing.TB, ca pki.CA, key *ecdsa.PrivateKey, uri string, from, until time.Time) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "n"},
		NotBefore: from, NotAfter: until, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, URIs: []*url.URL{u}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// A client chain verified once is not verified again while the roots and
// its validity hold; the trust domain and the revocation set are checked
// on every handshake, a certificate of another CA (same key, same node)
// is verified and refused, an entry ends at the certificate's NotAfter
// and new roots empty the cache.
func TestVerifiedChainsAreCachedButRevocationStillApplies(t *testing.T) {
	b, err := pki.Generate("test.local")
	require.NoError(t, err)
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	rootsFile := filepath.Join(t.TempDir(), "roots.pem")
	writeCA(t, rootsFile, b.NodeCA.Cert)
	now := time.Unix(1_800_000_000, 0)
	g, err := New(Options{
		Config: &config.Gateway{URL: "https://127.0.0.1:1", Region: "eu"}, NodeCARoots: config.PEM{File: rootsFile},
		Bundle: func() (*pki.Bundle, error) { return b, nil }, Log: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return now },
	})
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	uri := "spiffe://test.local/node/node_1"
	good := nodeCert(t, b.NodeCA, key, uri, now.Add(-time.Hour), now.Add(time.Hour))
	verifiedBefore, cachedBefore := statChainsVerified.Value(), statChainsCached.Value()
	verify := func(c *x509.Certificate) error {
		node, err := g.verifyCerts(g.currentTrust(), []*x509.Certificate{c}, false)
		if err == nil {
			assert.Equal(t, "node_1", node)
		}
		return err
	}

	require.NoError(t, verify(good))
	require.NoError(t, verify(good))
	require.NoError(t, verify(good))
	assert.Equal(t, int64(1), statChainsVerified.Value()-verifiedBefore, "verified once")
	assert.Equal(t, int64(2), statChainsCached.Value()-cachedBefore, "then found in the cache")

	// Another CA's certificate for the same node and key is another chain:
	// verified, refused and not remembered.
	forged := nodeCert(t, other.NodeCA, key, uri, now.Add(-time.Hour), now.Add(time.Hour))
	assert.Error(t, verify(forged), "unknown CA")
	assert.Error(t, verify(forged), "unknown CA, again")
	// The right CA but another trust domain: verified, refused.
	assert.Error(t, verify(nodeCert(t, b.NodeCA, key, "spiffe://other.local/node/node_1", now.Add(-time.Hour), now.Add(time.Hour))))
	assert.Equal(t, 1, g.chains.len(), "only the good chain is remembered")

	// Revoked by serial, then by node: refused although the chain is cached.
	g.revoke.p.Store(&map[string]bool{revocationKey(RevokeSerial, pki.SerialHex(good)): true})
	assert.ErrorContains(t, verify(good), "revoked")
	g.revoke.p.Store(&map[string]bool{revocationKey(RevokeNode, "node_1"): true})
	assert.ErrorContains(t, verify(good), "revoked")
	g.revoke.p.Store(&map[string]bool{})
	require.NoError(t, verify(good))

	// Past its NotAfter the entry is gone and the verification refuses it.
	now = now.Add(2 * time.Hour)
	assert.Error(t, verify(good), "expired")
	assert.Equal(t, 0, g.chains.len())

	// New roots (the node CA file replaced, read again after 60 s): the
	// chains verified against the old ones are forgotten.
	fresh := nodeCert(t, b.NodeCA, key, uri, now.Add(-time.Hour), now.Add(time.Hour))
	require.NoError(t, verify(fresh))
	require.Equal(t, 1, g.chains.len())
	writeCA(t, rootsFile, other.NodeCA.Cert)
	now = now.Add(ReloadEvery + time.Second)
	assert.Error(t, verify(fresh), "the old CA is no longer trusted")
	assert.Equal(t, 0, g.chains.len())
	o1 := nodeCert(t, other.NodeCA, key, uri, now.Add(-time.Hour), now.Add(time.Hour))
	require.NoError(t, verify(o1))
	// The same roots read again (a new pool, equal certificates) keep it.
	now = now.Add(ReloadEvery + time.Second)
	cached := statChainsCached.Value()
	require.NoError(t, verify(o1))
	assert.Equal(t, int64(1), statChainsCached.Value()-cached, "still cached after an unchanged reload")
	assert.Equal(t, 1, g.chains.len())
}

// The cache holds at most its bound.
func TestChainCacheIsBounded(t *testing.T) {
	c := newChainCache(4)
	roots := x509.NewCertPool()
	now := time.Unix(1_800_000_000, 0)
	chain := []*x509.Certificate{{NotAfter: now.Add(time.Hour)}}
	for i := range 10 {
		c.add(chainKey{byte(i)}, roots, chain, now)
	}
	assert.Equal(t, 4, c.len())
	assert.True(t, c.verified(chainKey{9}, roots, now), "the last one added is kept")
	c.add(chainKey{99}, roots, []*x509.Certificate{{NotAfter: now}}, now)
	assert.False(t, c.verified(chainKey{99}, roots, now), "an expired chain is not remembered")
}
