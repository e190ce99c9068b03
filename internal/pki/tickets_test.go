package pki_test

import (
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/pki"
)

// Every holder of a bundle derives the same ticket key for a period and
// the same roots; other periods, other bundles (another node CA) and
// other roots derive other keys.
func TestSessionTicketKey(t *testing.T) {
	t.Parallel()
	b, err := pki.Generate("test.local")
	require.NoError(t, err)
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	roots := pki.RootsDigest([]*x509.Certificate{b.NodeCA.Cert})
	k1, err := b.SessionTicketKey(100, roots)
	require.NoError(t, err)
	again, err := b.SessionTicketKey(100, roots)
	require.NoError(t, err)
	assert.Equal(t, k1, again)
	next, err := b.SessionTicketKey(101, roots)
	require.NoError(t, err)
	assert.NotEqual(t, k1, next)
	ko, err := other.SessionTicketKey(100, roots)
	require.NoError(t, err)
	assert.NotEqual(t, k1, ko)
	assert.NotEqual(t, [32]byte{}, k1)

	// Other roots: another key for the same bundle and period.
	both := pki.RootsDigest([]*x509.Certificate{b.NodeCA.Cert, other.NodeCA.Cert})
	kb, err := b.SessionTicketKey(100, both)
	require.NoError(t, err)
	assert.NotEqual(t, k1, kb)
	ks, err := b.SessionTicketKey(100, pki.RootsDigest([]*x509.Certificate{other.NodeCA.Cert}))
	require.NoError(t, err)
	assert.NotEqual(t, k1, ks)
	assert.NotEqual(t, kb, ks)
}

// The same roots in any order, or one listed twice, name the same set;
// a root more or less names another.
func TestRootsDigestIsOrderIndependent(t *testing.T) {
	t.Parallel()
	a, err := pki.Generate("test.local")
	require.NoError(t, err)
	b, err := pki.Generate("test.local")
	require.NoError(t, err)
	c, err := pki.Generate("test.local")
	require.NoError(t, err)
	ra, rb, rc := a.NodeCA.Cert, b.NodeCA.Cert, c.NodeCA.Cert
	abc := pki.RootsDigest([]*x509.Certificate{ra, rb, rc})
	assert.Equal(t, abc, pki.RootsDigest([]*x509.Certificate{rc, ra, rb}))
	assert.Equal(t, abc, pki.RootsDigest([]*x509.Certificate{rb, rc, ra, rb}))
	assert.NotEqual(t, abc, pki.RootsDigest([]*x509.Certificate{ra, rb}))
	assert.NotEqual(t, pki.RootsDigest([]*x509.Certificate{ra}), pki.RootsDigest([]*x509.Certificate{rb}))
	k1, err := a.SessionTicketKey(7, abc)
	require.NoError(t, err)
	k2, err := a.SessionTicketKey(7, pki.RootsDigest([]*x509.Certificate{rc, rb, ra}))
	require.NoError(t, err)
	assert.Equal(t, k1, k2, "the same roots in another order: the same key")
}
