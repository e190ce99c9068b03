package sshca_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"computeplane/internal/sshca"
)

func newCA(t *testing.T, now func() time.Time) *sshca.CA {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	ca, err := sshca.New(key, now)
	require.NoError(t, err)
	return ca
}

func userKey(t *testing.T) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	k, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return k
}

// meta is the connection a server's key callback is given.
type meta struct{ user string }

func (m meta) User() string        { return m.user }
func (meta) SessionID() []byte     { return nil }
func (meta) ClientVersion() []byte { return nil }
func (meta) ServerVersion() []byte { return nil }
func (meta) RemoteAddr() net.Addr  { return &net.TCPAddr{} }
func (meta) LocalAddr() net.Addr   { return &net.TCPAddr{} }

func TestUserCertificates(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	ca := newCA(t, func() time.Time { return now })
	key := userKey(t)
	cert, err := ca.SignUser(sshca.UserRequest{Key: key, KeyID: "ops tunnels sbx_1",
		Principals: []string{sshca.Principal("root", "sbx_1"), sshca.Principal("root", "acme")}})
	require.NoError(t, err)
	assert.Equal(t, uint32(ssh.UserCert), cert.CertType)
	assert.Equal(t, []string{"root@sbx_1", "root@acme"}, cert.ValidPrincipals)
	assert.Equal(t, uint64(now.Add(-time.Minute).Unix()), cert.ValidAfter)
	assert.Equal(t, uint64(now.Add(sshca.UserLifetime).Unix()), cert.ValidBefore)
	assert.Equal(t, "ops tunnels sbx_1", cert.KeyId)
	assert.Contains(t, cert.Permissions.Extensions, "permit-pty")
	assert.Empty(t, cert.CriticalOptions)
	assert.NotZero(t, cert.Serial)
	// Its form on the wire parses back to the same certificate.
	back, _, _, _, err := ssh.ParseAuthorizedKey([]byte(sshca.AuthorizedKey(cert)))
	require.NoError(t, err)
	assert.Equal(t, cert.Marshal(), back.Marshal())

	check := func(c ssh.PublicKey, user, scope string, at time.Time, cas ...ssh.PublicKey) error {
		if cas == nil {
			cas = []ssh.PublicKey{ca.PublicKey()}
		}
		u := &sshca.UserChecker{CAs: cas, Scope: scope, Now: func() time.Time { return at }}
		_, err := u.Check(meta{user}, c)
		return err
	}
	require.NoError(t, check(cert, "root", "sbx_1", now))
	require.NoError(t, check(cert, "root", "acme", now.Add(sshca.UserLifetime-time.Second)))
	assert.ErrorContains(t, check(cert, "root", "sbx_2", now), "not in the set of valid principals", "another target")
	assert.ErrorContains(t, check(cert, "admin", "sbx_1", now), "not in the set of valid principals", "another account")
	assert.ErrorContains(t, check(cert, "root", "sbx_1", now.Add(sshca.UserLifetime)), "expired")
	assert.ErrorContains(t, check(cert, "root", "sbx_1", now.Add(-2*time.Minute)), "not yet valid")
	assert.ErrorContains(t, check(key, "root", "sbx_1", now), "only certificates", "a bare key")
	other := newCA(t, func() time.Time { return now })
	assert.ErrorContains(t, check(cert, "root", "sbx_1", now, other.PublicKey()), "another authority")

	// A certificate from another CA whose signature is good is refused
	// the same way; one whose bytes were changed does not verify.
	foreign, err := other.SignUser(sshca.UserRequest{Key: key, Principals: []string{"root@sbx_1"}})
	require.NoError(t, err)
	assert.ErrorContains(t, check(foreign, "root", "sbx_1", now), "another authority")
	forged := *cert
	forged.ValidPrincipals = []string{"root@sbx_2"}
	assert.ErrorContains(t, check(&forged, "root", "sbx_2", now), "signature does not verify")

	// A critical option is never accepted (this server enforces none).
	withOption := &ssh.Certificate{Key: key, CertType: ssh.UserCert, ValidPrincipals: []string{"root@sbx_1"},
		ValidAfter: uint64(now.Add(-time.Minute).Unix()), ValidBefore: uint64(now.Add(time.Minute).Unix()),
		Permissions: ssh.Permissions{CriticalOptions: map[string]string{"force-command": "true"}}}
	_, caKey, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(caKey)
	require.NoError(t, err)
	require.NoError(t, withOption.SignCert(rand.Reader, signer))
	assert.ErrorContains(t, check(withOption, "root", "sbx_1", now, signer.PublicKey()), "critical option")

	// A host certificate does not log a user in.
	hk, err := ca.NewHostKey("root@sbx_1")
	require.NoError(t, err)
	hs, err := hk.Signer()
	require.NoError(t, err)
	assert.ErrorContains(t, check(hs.PublicKey(), "root", "sbx_1", now), "not a user certificate")

	// Certificates are not certified again; a request needs principals.
	_, err = ca.SignUser(sshca.UserRequest{Key: cert, Principals: []string{"root@sbx_1"}})
	assert.Error(t, err)
	_, err = ca.SignUser(sshca.UserRequest{Key: key})
	assert.Error(t, err)
}

func TestHostKeys(t *testing.T) {
	t.Parallel()
	ca := newCA(t, nil)
	hk, err := ca.NewHostKey("sbx_1")
	require.NoError(t, err)
	signer, err := hk.Signer()
	require.NoError(t, err)
	cert, ok := signer.PublicKey().(*ssh.Certificate)
	require.True(t, ok)
	assert.Equal(t, uint32(ssh.HostCert), cert.CertType)
	assert.Equal(t, []string{"sbx_1"}, cert.ValidPrincipals)
	// A client trusting the CA for the host name accepts it, not for
	// another name, and not when it trusts another CA.
	hostCheck := func(trusted ssh.PublicKey, host string) error {
		c := &ssh.CertChecker{IsHostAuthority: func(auth ssh.PublicKey, _ string) bool { return string(auth.Marshal()) == string(trusted.Marshal()) }}
		return c.CheckHostKey(host+":22", &net.TCPAddr{}, cert)
	}
	require.NoError(t, hostCheck(ca.PublicKey(), "sbx_1"))
	assert.Error(t, hostCheck(ca.PublicKey(), "sbx_2"))
	assert.Error(t, hostCheck(newCA(t, nil).PublicKey(), "sbx_1"))
	assert.Equal(t, "@cert-authority sbx_1 "+ca.AuthorizedKey(), sshca.KnownHostsLine(ca.PublicKey(), "sbx_1"))
}

func TestParseUserKey(t *testing.T) {
	t.Parallel()
	ed := sshca.AuthorizedKey(userKey(t)) + " me@laptop"
	k, err := sshca.ParseUserKey(ed)
	require.NoError(t, err)
	assert.Equal(t, ssh.KeyAlgoED25519, k.Type())

	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ecKey, err := ssh.NewPublicKey(&ec.PublicKey)
	require.NoError(t, err)
	_, err = sshca.ParseUserKey(sshca.AuthorizedKey(ecKey))
	require.NoError(t, err)

	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	smallKey, err := ssh.NewPublicKey(&small.PublicKey)
	require.NoError(t, err)
	_, err = sshca.ParseUserKey(sshca.AuthorizedKey(smallKey))
	assert.ErrorContains(t, err, "at least 2048 bits")

	_, err = sshca.ParseUserKey("not a key")
	assert.ErrorContains(t, err, "not an OpenSSH public key")

	cert, err := newCA(t, nil).SignUser(sshca.UserRequest{Key: userKey(t), Principals: []string{"root@x"}})
	require.NoError(t, err)
	_, err = sshca.ParseUserKey(sshca.AuthorizedKey(cert))
	assert.ErrorContains(t, err, "is not certified")

	assert.True(t, sshca.ValidAccount("root"))
	assert.True(t, sshca.ValidAccount("deploy-1"))
	assert.False(t, sshca.ValidAccount("Root"))
	assert.False(t, sshca.ValidAccount("a@b"))
	// The hand-written check is the expression ^[a-z_][a-z0-9_-]{0,31}$.
	re := regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	for _, a := range []string{"", "_", "a", "_x-1", "1a", "-a", "a-", "a_b9", "aB", "a b", "é",
		strings.Repeat("a", 32), strings.Repeat("a", 33), "a" + strings.Repeat("-", 31), "a\n"} {
		assert.Equal(t, re.MatchString(a), sshca.ValidAccount(a), "%q", a)
	}
}
