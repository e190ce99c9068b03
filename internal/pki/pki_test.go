package pki_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/pki"
)

const secret = "0123456789abcdef0123456789abcdef-pki-test"

func csr(t *testing.T, key *ecdsa.PrivateKey) *x509.CertificateRequest {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "whatever the node says"}}, key)
	require.NoError(t, err)
	r, err := x509.ParseCertificateRequest(der)
	require.NoError(t, err)
	return r
}

func TestNodeCertificates(t *testing.T) {
	t.Parallel()
	b, err := pki.Generate("example.org")
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	cert, err := b.IssueNode(csr(t, key), "node_0123456789abcdefghjkmnpqrs")
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/node/node_0123456789abcdefghjkmnpqrs", cert.URIs[0].String())
	assert.WithinDuration(t, time.Now().Add(pki.NodeLifetime), cert.NotAfter, time.Minute)
	id, err := b.VerifyNode(cert, time.Now())
	require.NoError(t, err)
	assert.Equal(t, "node_0123456789abcdefghjkmnpqrs", id)

	// Refusals: expired, another CA, another trust domain.
	_, err = b.VerifyNode(cert, time.Now().Add(pki.NodeLifetime+time.Hour))
	assert.Error(t, err, "expired")
	other, err := pki.Generate("example.org")
	require.NoError(t, err)
	_, err = other.VerifyNode(cert, time.Now())
	assert.Error(t, err, "signed by another node CA")
	elsewhere := *b
	elsewhere.TrustDomain = "example.net"
	_, err = elsewhere.VerifyNode(cert, time.Now())
	assert.ErrorContains(t, err, "names no node of trust domain example.net")

	// A request whose signature does not verify is refused.
	bad := csr(t, key)
	bad.Signature[0] ^= 0xff
	_, err = b.IssueNode(bad, "node_x")
	assert.ErrorContains(t, err, "signature")
}

func TestSealedBundle(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pki.json")
	b, made, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	require.True(t, made)
	assert.Equal(t, pki.DefaultTrustDomain, b.TrustDomain)
	assert.Equal(t, 1, b.TrustVersion)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "PRIVATE KEY", "sealed, not plain PEM")

	again, made, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	assert.False(t, made, "an existing bundle is kept")
	assert.Equal(t, pki.Fingerprint(b.NodeCA.Cert), pki.Fingerprint(again.NodeCA.Cert))
	assert.True(t, b.CommandSigning.Equal(again.CommandSigning))
	assert.True(t, b.Join.Equal(again.Join))
	require.NotNil(t, b.SSHCA)
	assert.True(t, b.SSHCA.Equal(again.SSHCA))

	_, err = pki.Open(secret+"x", raw)
	assert.ErrorIs(t, err, pki.ErrSealed, "another secret")
	raw[len(raw)/2] ^= 1
	_, err = pki.Open(secret, raw)
	assert.Error(t, err, "a changed file")
	_, err = pki.Generate("Not A Domain")
	assert.Error(t, err)
}

// A bundle of a release before the SSH CA opens without one; pki init
// adds one, once, and keeps everything else.
func TestInitAddsTheSSHCA(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pki.json")
	old, err := pki.Generate("")
	require.NoError(t, err)
	old.SSHCA = nil
	sealed, err := old.Seal(secret)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, sealed, 0o600))
	opened, err := pki.Loader(path, secret)()
	require.NoError(t, err)
	assert.Nil(t, opened.SSHCA)

	b, made, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	assert.False(t, made)
	require.NotNil(t, b.SSHCA)
	assert.True(t, old.CommandSigning.Equal(b.CommandSigning))
	assert.Equal(t, pki.Fingerprint(old.NodeCA.Cert), pki.Fingerprint(b.NodeCA.Cert))
	assert.Equal(t, old.TrustFingerprint(), b.TrustFingerprint(), "daemons' trust does not change")
	again, err := pki.Loader(path, secret)()
	require.NoError(t, err)
	assert.True(t, b.SSHCA.Equal(again.SSHCA), "written back")
	third, _, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	assert.True(t, b.SSHCA.Equal(third.SSHCA), "made once")
}

// A bundle written before release keys existed gets one from Init (what
// `computed pki init` and `make release` run); the rest of it stays, and
// its trust fingerprint moves (daemons learn of the change).
func TestInitAddsAReleaseKeyToAnOlderBundle(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pki.json")
	b, _, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	require.NotNil(t, b.ReleaseKey(), "a new bundle has a release key")
	b.ReleaseSigning = nil
	older := b.TrustFingerprint()
	sealed, err := b.Seal(secret)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, sealed, 0o600))
	opened, err := pki.Open(secret, sealed)
	require.NoError(t, err)
	assert.Nil(t, opened.ReleaseKey(), "an older bundle opens without one")

	again, made, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	assert.False(t, made)
	require.NotNil(t, again.ReleaseKey())
	assert.True(t, b.CommandSigning.Equal(again.CommandSigning))
	assert.Equal(t, pki.Fingerprint(b.NodeCA.Cert), pki.Fingerprint(again.NodeCA.Cert))
	assert.NotEqual(t, older, again.TrustFingerprint())

	kept, _, err := pki.Init(path, secret, "")
	require.NoError(t, err)
	assert.True(t, again.ReleaseSigning.Equal(kept.ReleaseSigning), "written once, then kept")
}
