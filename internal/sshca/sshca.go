// Package sshca is the SSH certificate authority of tunnels
// (docs/tunnels.md, "SSH"): short-lived user certificates for a caller's
// public key, host certificates for the SSH servers the tunnels reach, and
// the checks those servers make. Its key is the PKI bundle's SSH CA.
//
// Principals name an account on a target, never a bare account, so that
// a certificate for one tenant's instance opens nothing else that trusts
// the same CA: <account>@<instanceId|sandboxId> and <account>@<tenantId>
// for instances and sandboxes, <account>@<nodeId> for a node (break-glass).
package sshca

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Lifetimes.
const (
	// UserLifetime is how long a user certificate is valid: long enough to
	// connect, short enough that nothing needs revoking. A connection made
	// within it lives on (SSH checks a certificate at the handshake only).
	UserLifetime = 5 * time.Minute
	// HostLifetime is how long the host certificate of one tunnel's SSH
	// server is valid (its key is made for that tunnel).
	HostLifetime = 10 * time.Minute
	// skew is how far back validAfter goes, for clocks a little behind.
	skew = time.Minute
)

// ValidAccount reports whether account is a user name a principal takes
// (as tunnels.sshAccounts): ^[a-z_][a-z0-9_-]{0,31}$. Checked by hand, not
// by a package-level regexp: compute-guest (pid 1 of every VM) links this
// package, and compiling the expression at its start cost tens of
// milliseconds of a boot under TCG (docs/benchmarks-notes.md).
func ValidAccount(account string) bool {
	if account == "" || len(account) > 32 {
		return false
	}
	for i := 0; i < len(account); i++ {
		c := account[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case i > 0 && (c >= '0' && c <= '9' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Principal is <account>@<scope>: the account on a target (an instance,
// sandbox or node id) or in a tenant.
func Principal(account, scope string) string { return account + "@" + scope }

// CA signs certificates with the bundle's SSH CA key.
type CA struct {
	signer ssh.Signer
	now    func() time.Time
}

// New returns the CA of key; now is the clock (time.Now when nil).
func New(key ed25519.PrivateKey, now func() time.Time) (*CA, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("sshca: the CA key is not an Ed25519 private key")
	}
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &CA{signer: s, now: now}, nil
}

// PublicKey is the CA's public key.
func (c *CA) PublicKey() ssh.PublicKey { return c.signer.PublicKey() }

// AuthorizedKey is the CA's public key in authorized_keys form (one line
// without its newline): what TrustedUserCAKeys and @cert-authority take.
func (c *CA) AuthorizedKey() string { return AuthorizedKey(c.signer.PublicKey()) }

// AuthorizedKey is k in authorized_keys form, without the newline.
func AuthorizedKey(k ssh.PublicKey) string {
	return strings.TrimSuffix(string(ssh.MarshalAuthorizedKey(k)), "\n")
}

// ParseUserKey reads a caller's public key (an authorized_keys line; its
// comment is ignored) and refuses what should not be certified: a
// certificate, an RSA key under 2048 bits, a DSA key.
func ParseUserKey(line string) (ssh.PublicKey, error) {
	k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, fmt.Errorf("not an OpenSSH public key (%v)", err)
	}
	switch k.Type() {
	case ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521, ssh.KeyAlgoSKED25519, ssh.KeyAlgoSKECDSA256:
	case ssh.KeyAlgoRSA:
		ck, ok := k.(ssh.CryptoPublicKey)
		if !ok {
			return nil, errors.New("an RSA key that cannot be read")
		}
		if rk, ok := ck.CryptoPublicKey().(interface{ Size() int }); !ok || rk.Size()*8 < 2048 {
			return nil, errors.New("an RSA key is at least 2048 bits")
		}
	default:
		return nil, fmt.Errorf("a key of type %s is not certified (ed25519, ecdsa or rsa of 2048 bits or more)", k.Type())
	}
	return k, nil
}

// UserRequest asks for a user certificate.
type UserRequest struct {
	Key        ssh.PublicKey
	Principals []string
	// KeyID is what servers log for the certificate (who, for what).
	KeyID string
	// Lifetime is UserLifetime when 0.
	Lifetime time.Duration
}

// userExtensions are what OpenSSH's sshd grants a certificate's session:
// a terminal and the forwardings of an ordinary login.
var userExtensions = map[string]string{
	"permit-pty": "", "permit-port-forwarding": "", "permit-agent-forwarding": "", "permit-X11-forwarding": "", "permit-user-rc": "",
}

// SignUser makes a user certificate for r.Key, valid from a minute ago to
// its lifetime from now, with a random serial.
func (c *CA) SignUser(r UserRequest) (*ssh.Certificate, error) {
	if r.Key == nil || len(r.Principals) == 0 {
		return nil, errors.New("sshca: a user certificate needs a key and principals")
	}
	if _, ok := r.Key.(*ssh.Certificate); ok {
		return nil, errors.New("sshca: a certificate is not certified again")
	}
	life := r.Lifetime
	if life == 0 {
		life = UserLifetime
	}
	ext := make(map[string]string, len(userExtensions))
	for k, v := range userExtensions {
		ext[k] = v
	}
	return c.sign(&ssh.Certificate{Key: r.Key, CertType: ssh.UserCert, KeyId: r.KeyID, ValidPrincipals: slices.Clone(r.Principals),
		Permissions: ssh.Permissions{Extensions: ext}}, life)
}

func (c *CA) sign(cert *ssh.Certificate, life time.Duration) (*ssh.Certificate, error) {
	var sn [8]byte
	if _, err := rand.Read(sn[:]); err != nil {
		return nil, err
	}
	now := c.now()
	cert.Serial = binary.BigEndian.Uint64(sn[:])
	cert.ValidAfter = uint64(now.Add(-skew).Unix())
	cert.ValidBefore = uint64(now.Add(life).Unix())
	if err := cert.SignCert(rand.Reader, c.signer); err != nil {
		return nil, err
	}
	return cert, nil
}

// HostKey is a host key made for one tunnel's SSH server and its
// certificate, naming the target as the host.
type HostKey struct {
	// PrivateKeyPEM is the key in OpenSSH's PEM form.
	PrivateKeyPEM []byte
	// Certificate is the host certificate in authorized_keys form.
	Certificate string
}

// NewHostKey makes an Ed25519 host key and signs a host certificate for
// it naming hosts, valid HostLifetime. The server's key lives as long as
// its tunnel: nothing on the node keeps a host key to steal.
func (c *CA) NewHostKey(hosts ...string) (*HostKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	spub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, err
	}
	cert, err := c.sign(&ssh.Certificate{Key: spub, CertType: ssh.HostCert, KeyId: "host " + strings.Join(hosts, ","),
		ValidPrincipals: slices.Clone(hosts)}, HostLifetime)
	if err != nil {
		return nil, err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return nil, err
	}
	return &HostKey{PrivateKeyPEM: pem.EncodeToMemory(blk), Certificate: AuthorizedKey(cert)}, nil
}

// Signer reads a HostKey back as the signer a server presents: its
// certificate over its key.
func (h *HostKey) Signer() (ssh.Signer, error) {
	key, err := ssh.ParsePrivateKey(h.PrivateKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("sshca: host key: %w", err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(h.Certificate))
	if err != nil {
		return nil, fmt.Errorf("sshca: host certificate: %w", err)
	}
	cert, ok := pub.(*ssh.Certificate)
	if !ok {
		return nil, errors.New("sshca: the host certificate is a bare key")
	}
	return ssh.NewCertSigner(cert, key)
}

// KnownHostsLine is the known_hosts line that trusts the CA's host
// certificates for hosts (patterns, as ssh matches the host name or its
// HostKeyAlias).
func KnownHostsLine(ca ssh.PublicKey, hosts ...string) string {
	return "@cert-authority " + strings.Join(hosts, ",") + " " + AuthorizedKey(ca)
}

// UserChecker authenticates users of an SSH server by certificate: signed
// by one of cas, a user certificate, valid now, holding the principal
// <user>@<scope> for the user the client logs in as. Bare keys are
// refused.
type UserChecker struct {
	CAs   []ssh.PublicKey
	Scope string
	Now   func() time.Time
}

// Check is an ssh.ServerConfig's PublicKeyCallback.
func (u *UserChecker) Check(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	cert, ok := key.(*ssh.Certificate)
	if !ok {
		return nil, errors.New("sshca: only certificates of the deployment's SSH CA are accepted")
	}
	checker := &ssh.CertChecker{
		IsUserAuthority: func(auth ssh.PublicKey) bool {
			return slices.ContainsFunc(u.CAs, func(ca ssh.PublicKey) bool { return keysEqual(ca, auth) })
		},
		Clock: u.Now,
	}
	if cert.CertType != ssh.UserCert {
		return nil, errors.New("sshca: not a user certificate")
	}
	// CertChecker checks the principal against the name it is given: the
	// principal this server accepts for the user.
	if err := checker.CheckCert(Principal(meta.User(), u.Scope), cert); err != nil {
		return nil, err
	}
	if !checker.IsUserAuthority(cert.SignatureKey) {
		return nil, errors.New("sshca: the certificate is signed by another authority")
	}
	// CheckCert refused any critical option (force-command,
	// source-address): this server enforces none, so none is accepted.
	return &ssh.Permissions{Extensions: cert.Extensions}, nil
}

func keysEqual(a, b ssh.PublicKey) bool {
	return a.Type() == b.Type() && string(a.Marshal()) == string(b.Marshal())
}
