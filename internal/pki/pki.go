// Package pki owns the deployment's certificate authorities and signing
// keys: the node CA (client certificates of node daemons), the gateway
// serving CA, the internal CA (the gateways' control API), the join
// service's key (join tokens are sealed to it), the command signing key,
// the SSH certificate authority (tunnels' SSH certificates, internal/sshca)
// and the release signing key (signs the artifacts `make release` lays
// out; daemons pin its public half at join and verify downloads with it).
// A bundle is generated once (`computed pki init`, or by the first start
// of `make run`) and kept sealed with the service secret in SERVICE_PKI.
//
// This is the first piece of the node-daemon work (issue 11): the bundle,
// its sealing and node certificates from CSRs. Joins, gateways and
// revocation build on it.
package pki

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
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
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"computeplane/internal/keys"
)

// Lifetimes.
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	NodeLifetime = 30 * 24 * time.Hour // renewed over the session at two thirds
)

// DefaultTrustDomain is the SPIFFE trust domain of a bundle generated
// without one.
const DefaultTrustDomain = "computeplane.local"

var trustDomainRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Bundle is the deployment's PKI.
type Bundle struct {
	TrustDomain  string
	TrustVersion int
	NodeCA       CA
	ServingCA    CA
	InternalCA   CA
	// Join is the join service's key: join tokens are sealed to it.
	Join *ecdsa.PrivateKey
	// CommandSigning signs commands to daemons.
	CommandSigning ed25519.PrivateKey
	// SSHCA signs the SSH certificates of tunnels (users) and the host
	// certificates of the SSH servers they reach. Nil in a bundle written
	// before it existed: `computed pki init` adds it (AddMissing).
	SSHCA ed25519.PrivateKey
	// ReleaseSigning signs release artifacts (internal/release). A bundle
	// written before release keys existed has none until `computed pki
	// init` adds one.
	ReleaseSigning ed25519.PrivateKey
}

// Generate makes a new bundle for trustDomain (DefaultTrustDomain when
// empty) at trust version 1.
func Generate(trustDomain string) (*Bundle, error) {
	if trustDomain == "" {
		trustDomain = DefaultTrustDomain
	}
	if !trustDomainRe.MatchString(trustDomain) {
		return nil, fmt.Errorf("pki: trust domain %q is not a DNS-like name", trustDomain)
	}
	b := &Bundle{TrustDomain: trustDomain, TrustVersion: 1}
	var err error
	for _, ca := range []struct {
		name string
		into *CA
	}{{"node CA", &b.NodeCA}, {"gateway serving CA", &b.ServingCA}, {"internal CA", &b.InternalCA}} {
		if *ca.into, err = newCA(trustDomain + " " + ca.name); err != nil {
			return nil, err
		}
	}
	if b.Join, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	if _, b.CommandSigning, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	if _, b.SSHCA, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	if _, b.ReleaseSigning, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	return b, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newCA(name string) (CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CA{}, err
	}
	sn, err := serial()
	if err != nil {
		return CA{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(CALifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return CA{}, err
	}
	cert, err := x509.ParseCertificate(der)
	return CA{Cert: cert, Key: key}, err
}

// NodeURI is a node's identity in certificates: spiffe://<trustDomain>/node/<nodeId>.
func (b *Bundle) NodeURI(nodeID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: b.TrustDomain, Path: "/node/" + nodeID}
}

// IssueNode signs a node certificate for the public key of csr (whose
// signature must verify), for nodeID, valid for NodeLifetime. The CSR's
// own names are ignored: the certificate names the node by its URI only.
func (b *Bundle) IssueNode(csr *x509.CertificateRequest, nodeID string) (*x509.Certificate, error) {
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: the request's signature: %w", err)
	}
	if _, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, errors.New("pki: a node key is ECDSA P-256")
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: nodeID},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(NodeLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs: []*url.URL{b.NodeURI(nodeID)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, b.NodeCA.Cert, csr.PublicKey, b.NodeCA.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// VerifyNode checks a client certificate against the node CA and the
// trust domain and returns the node id it names.
func (b *Bundle) VerifyNode(cert *x509.Certificate, now time.Time) (string, error) {
	roots := x509.NewCertPool()
	roots.AddCert(b.NodeCA.Cert)
	return VerifyNodeCert(cert, roots, nil, b.TrustDomain, now)
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return "", false
}

// The sealed file: the bundle as PEM blocks in JSON, sealed with
// AES-256-GCM under a key derived from the service secret (keys.PKI).

type fileBundle struct {
	TrustDomain    string `json:"trustDomain"`
	TrustVersion   int    `json:"trustVersion"`
	NodeCA         pair   `json:"nodeCa"`
	ServingCA      pair   `json:"servingCa"`
	InternalCA     pair   `json:"internalCa"`
	Join           string `json:"join"`
	CommandSigning string `json:"commandSigning"`
	SSHCA          string `json:"sshCa,omitempty"`
	ReleaseSigning string `json:"releaseSigning,omitempty"`
}

type pair struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

type sealedFile struct {
	Version int    `json:"version"` // of this format
	Nonce   []byte `json:"nonce"`
	Sealed  []byte `json:"sealed"`
}

func pemOf(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func keyPEM(k any) (string, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return "", err
	}
	return pemOf("PRIVATE KEY", der), nil
}

func caPair(ca CA) (pair, error) {
	k, err := keyPEM(ca.Key)
	return pair{Cert: pemOf("CERTIFICATE", ca.Cert.Raw), Key: k}, err
}

// Seal returns the bundle sealed with the service secret.
func (b *Bundle) Seal(secret string) ([]byte, error) {
	fb := fileBundle{TrustDomain: b.TrustDomain, TrustVersion: b.TrustVersion}
	var err error
	if fb.NodeCA, err = caPair(b.NodeCA); err != nil {
		return nil, err
	}
	if fb.ServingCA, err = caPair(b.ServingCA); err != nil {
		return nil, err
	}
	if fb.InternalCA, err = caPair(b.InternalCA); err != nil {
		return nil, err
	}
	if fb.Join, err = keyPEM(b.Join); err != nil {
		return nil, err
	}
	if fb.CommandSigning, err = keyPEM(b.CommandSigning); err != nil {
		return nil, err
	}
	if b.SSHCA != nil {
		if fb.SSHCA, err = keyPEM(b.SSHCA); err != nil {
			return nil, err
		}
	}
	if b.ReleaseSigning != nil {
		if fb.ReleaseSigning, err = keyPEM(b.ReleaseSigning); err != nil {
			return nil, err
		}
	}
	plain, err := json.Marshal(fb)
	if err != nil {
		return nil, err
	}
	aead, err := aeadFor(secret)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return json.MarshalIndent(sealedFile{Version: 1, Nonce: nonce, Sealed: aead.Seal(nil, nonce, plain, []byte("computeplane pki bundle"))}, "", "  ")
}

func aeadFor(secret string) (cipher.AEAD, error) {
	block, err := aes.NewCipher(keys.Derive(secret, keys.PKI))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// ErrSealed is the answer to a bundle sealed with another secret, or
// changed.
var ErrSealed = errors.New("pki: the bundle does not open with this service secret")

// Open reads a bundle Seal wrote with the same secret.
func Open(secret string, data []byte) (*Bundle, error) {
	var sf sealedFile
	if err := json.Unmarshal(data, &sf); err != nil || sf.Version != 1 {
		return nil, errors.New("pki: not a sealed PKI bundle")
	}
	aead, err := aeadFor(secret)
	if err != nil {
		return nil, err
	}
	if len(sf.Nonce) != aead.NonceSize() {
		return nil, ErrSealed
	}
	plain, err := aead.Open(nil, sf.Nonce, sf.Sealed, []byte("computeplane pki bundle"))
	if err != nil {
		return nil, ErrSealed
	}
	var fb fileBundle
	if err := json.Unmarshal(plain, &fb); err != nil {
		return nil, err
	}
	b := &Bundle{TrustDomain: fb.TrustDomain, TrustVersion: fb.TrustVersion}
	for _, ca := range []struct {
		p    pair
		into *CA
	}{{fb.NodeCA, &b.NodeCA}, {fb.ServingCA, &b.ServingCA}, {fb.InternalCA, &b.InternalCA}} {
		if *ca.into, err = parseCA(ca.p); err != nil {
			return nil, err
		}
	}
	join, err := parseKey(fb.Join)
	if err != nil {
		return nil, err
	}
	cmd, err := parseKey(fb.CommandSigning)
	if err != nil {
		return nil, err
	}
	var ok bool
	if b.Join, ok = join.(*ecdsa.PrivateKey); !ok {
		return nil, errors.New("pki: the join key is not ECDSA")
	}
	if b.CommandSigning, ok = cmd.(ed25519.PrivateKey); !ok {
		return nil, errors.New("pki: the command signing key is not Ed25519")
	}
	if fb.SSHCA != "" {
		k, err := parseKey(fb.SSHCA)
		if err != nil {
			return nil, err
		}
		if b.SSHCA, ok = k.(ed25519.PrivateKey); !ok {
			return nil, errors.New("pki: the SSH CA key is not Ed25519")
		}
	}
	if fb.ReleaseSigning != "" {
		rel, err := parseKey(fb.ReleaseSigning)
		if err != nil {
			return nil, err
		}
		if b.ReleaseSigning, ok = rel.(ed25519.PrivateKey); !ok {
			return nil, errors.New("pki: the release signing key is not Ed25519")
		}
	}
	return b, nil
}

func parseKey(p string) (any, error) {
	blk, _ := pem.Decode([]byte(p))
	if blk == nil {
		return nil, errors.New("pki: a key is not PEM")
	}
	return x509.ParsePKCS8PrivateKey(blk.Bytes)
}

func parseCA(p pair) (CA, error) {
	blk, _ := pem.Decode([]byte(p.Cert))
	if blk == nil {
		return CA{}, errors.New("pki: a certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return CA{}, err
	}
	k, err := parseKey(p.Key)
	if err != nil {
		return CA{}, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return CA{}, errors.New("pki: a CA key cannot sign")
	}
	return CA{Cert: cert, Key: signer}, nil
}

// Fingerprint is the SHA-256 of a certificate's DER, hex: the servingCaPin
// of the well-known document is the serving CA's.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return fmt.Sprintf("%x", sum)
}

// Init writes a new bundle to path, sealed with secret, unless one is
// there already; it returns the bundle at path and whether it made it. A
// bundle there already gets the materials it lacks (AddMissing) written
// back: a bundle of an older release gains its SSH CA and release key.
func Init(path, secret, trustDomain string) (*Bundle, bool, error) {
	if data, err := os.ReadFile(path); err == nil {
		b, err := Open(secret, data)
		if err != nil {
			return nil, false, err
		}
		if added, err := b.AddMissing(); err != nil || len(added) == 0 {
			return b, false, err
		}
		return b, false, write(path, secret, b)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, false, err
	}
	b, err := Generate(trustDomain)
	if err != nil {
		return nil, false, err
	}
	return b, true, write(path, secret, b)
}

// AddMissing generates the materials a bundle of an older release lacks
// (the SSH CA, the release signing key) and names them. Only `computed pki init` calls it, once, so
// that the replicas of a deployment never make different ones.
func (b *Bundle) AddMissing() ([]string, error) {
	var added []string
	if b.SSHCA == nil {
		var err error
		if _, b.SSHCA, err = ed25519.GenerateKey(rand.Reader); err != nil {
			return nil, err
		}
		added = append(added, "SSH CA")
	}
	if b.ReleaseSigning == nil {
		var err error
		if _, b.ReleaseSigning, err = ed25519.GenerateKey(rand.Reader); err != nil {
			return nil, err
		}
		added = append(added, "release signing key")
	}
	return added, nil
}

// write seals b into path through a temporary file and a rename.
func write(path, secret string, b *Bundle) error {
	sealed, err := b.Seal(secret)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, sealed, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrNoBundle is the answer of a Loader whose file does not exist.
var ErrNoBundle = errors.New("pki: no PKI bundle (computed pki init writes one)")

// Loader returns a function that opens the bundle at path on first use
// and keeps it; until it opens (a missing file, another secret) every call
// answers the error, so the file can be written later without a restart.
func Loader(path, secret string) func() (*Bundle, error) {
	var mu sync.Mutex
	var b *Bundle
	return func() (*Bundle, error) {
		mu.Lock()
		defer mu.Unlock()
		if b != nil {
			return b, nil
		}
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w at %s", ErrNoBundle, path)
		}
		if err != nil {
			return nil, err
		}
		opened, err := Open(secret, data)
		if err != nil {
			return nil, err
		}
		b = opened
		return b, nil
	}
}

// ServingLifetime is how long a serving certificate the bundle issues
// itself (a gateway without gateway.tls) is valid; the gateway issues a
// new one at each start.
const ServingLifetime = 90 * 24 * time.Hour

// IssueServing makes a TLS server certificate from the serving CA for the
// DNS names and IP addresses in hosts, with a fresh key.
func (b *Bundle) IssueServing(hosts []string) (tls.Certificate, error) {
	return issueTLS(b.ServingCA, b.TrustDomain+" gateway", hosts, nil, x509.ExtKeyUsageServerAuth)
}

// InternalURI names a process of the deployment in internal certificates:
// spiffe://<trustDomain>/internal/<role>.
func (b *Bundle) InternalURI(role string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: b.TrustDomain, Path: "/internal/" + role}
}

// IssueInternal makes a certificate from the internal CA for the
// gateways' internal control API: a server certificate for hosts, or a
// client certificate naming role.
func (b *Bundle) IssueInternal(role string, hosts []string, server bool) (tls.Certificate, error) {
	usage := x509.ExtKeyUsageClientAuth
	if server {
		usage = x509.ExtKeyUsageServerAuth
	}
	return issueTLS(b.InternalCA, b.TrustDomain+" internal "+role, hosts, []*url.URL{b.InternalURI(role)}, usage)
}

func issueTLS(ca CA, cn string, hosts []string, uris []*url.URL, usage x509.ExtKeyUsage) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	sn, err := serial()
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ServingLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, URIs: uris,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// SerialHex names a certificate's serial in revocation sets.
func SerialHex(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// ReleaseKey is the public half of the release signing key, nil when the
// bundle has none.
func (b *Bundle) ReleaseKey() ed25519.PublicKey {
	if b.ReleaseSigning == nil {
		return nil
	}
	return b.ReleaseSigning.Public().(ed25519.PublicKey)
}

// CommandKey is the public half of the command signing key.
func (b *Bundle) CommandKey() ed25519.PublicKey {
	return b.CommandSigning.Public().(ed25519.PublicKey)
}

// VerifyNodeCert checks a client certificate against roots (with
// intermediates) and trustDomain and returns the node id its URI names.
func VerifyNodeCert(cert *x509.Certificate, roots, intermediates *x509.CertPool, trustDomain string, now time.Time) (string, error) {
	node, _, err := VerifyNodeChain(cert, roots, intermediates, trustDomain, now)
	return node, err
}

// VerifyNodeChain is VerifyNodeCert that also returns the chain it
// verified, leaf to root.
func VerifyNodeChain(cert *x509.Certificate, roots, intermediates *x509.CertPool, trustDomain string, now time.Time) (string, []*x509.Certificate, error) {
	chains, err := cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return "", nil, fmt.Errorf("pki: %w", err)
	}
	node, err := NodeOf(cert, trustDomain)
	if err != nil {
		return "", nil, err
	}
	return node, chains[0], nil
}

// NodeOf is the node id a (verified) certificate's URI names in
// trustDomain.
func NodeOf(cert *x509.Certificate, trustDomain string) (string, error) {
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host == trustDomain {
			if id, ok := cutPrefix(u.Path, "/node/"); ok && id != "" {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("pki: the certificate names no node of trust domain %s", trustDomain)
}

// TrustFingerprint names what daemons trust of this bundle: the node,
// serving and internal CAs, the command key and the release key. A changed
// bundle has another one, and so the next trust version.
func (b *Bundle) TrustFingerprint() string {
	h := sha256.New()
	for _, c := range []*x509.Certificate{b.NodeCA.Cert, b.ServingCA.Cert, b.InternalCA.Cert} {
		h.Write(c.Raw)
	}
	h.Write(b.CommandKey())
	h.Write(b.ReleaseKey()) // nothing for a bundle without one: its fingerprint stays
	return fmt.Sprintf("%x", h.Sum(nil))
}
