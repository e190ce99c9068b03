package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"computeplane/internal/agentproto"
)

// JoinTimeout bounds the join request.
const JoinTimeout = 30 * time.Second

// JoinOptions are compute-agent join's flags.
type JoinOptions struct {
	APIURL   string // the public host, e.g. https://compute.example.com
	Token    string
	Dir      Dir
	Hostname string
	Force    bool // join again into a directory that has a node
	// TPM, when set, attests the join with this TPM (DefaultTPM or
	// unix:/path to a software TPM's socket): the control plane's TPM
	// attestor requires it.
	TPM string
	// CloudMetadata, when set, is the provider's metadata service
	// (unix:PATH or an http URL, see CloudIdentity): the join carries the
	// machine's signed identity document for the control plane's cloud
	// attestor. CloudIdentityFile is a document read beforehand instead.
	CloudMetadata, CloudIdentityFile string
}

// RefusedError is the control plane's refusal of a join.
type RefusedError struct {
	Code, Message string
}

func (e *RefusedError) Error() string { return e.Code + ": " + e.Message }

// checkAPIURL allows http only to a loopback host.
func checkAPIURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("agent: --api %q is not an absolute URL", raw)
	}
	switch u.Scheme {
	case "https", "wss":
		return u, nil
	case "http", "ws":
		if ip := net.ParseIP(u.Hostname()); (ip != nil && ip.IsLoopback()) || u.Hostname() == "localhost" {
			return u, nil
		}
	}
	return nil, fmt.Errorf("agent: %q must use https (http only to a loopback host)", raw)
}

// Join makes the node key and a certificate request, presents the token,
// and keeps what the control plane answers in the directory.
func Join(ctx context.Context, o JoinOptions) (string, error) {
	u, err := checkAPIURL(o.APIURL)
	if err != nil {
		return "", err
	}
	if o.Token == "" {
		return "", errors.New("agent: a join token is required (--token-file, --token or COMPUTE_AGENT_TOKEN)")
	}
	if _, err := os.Stat(o.Dir.path(fileState)); err == nil && !o.Force {
		return "", fmt.Errorf("agent: %s already holds a joined node (--force joins again)", o.Dir)
	}
	if err := os.MkdirAll(string(o.Dir), 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(string(o.Dir), 0o700); err != nil {
		return "", err
	}
	if o.Hostname == "" {
		o.Hostname, _ = os.Hostname()
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: o.Hostname}}, key)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, JoinTimeout)
	defer cancel()
	// No redirects: the token goes to the URL the operator named, nowhere
	// else.
	hc := &http.Client{Timeout: JoinTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := strings.TrimRight(u.String(), "/")
	req := agentproto.JoinRequest{Token: o.Token, CSR: csr}
	if o.TPM != "" {
		if req.TPM, err = tpmQuote(ctx, hc, base, o.TPM, o.Token, csr); err != nil {
			return "", err
		}
	}
	switch {
	case o.CloudIdentityFile != "":
		b, err := os.ReadFile(o.CloudIdentityFile)
		if err != nil {
			return "", err
		}
		req.CloudIdentity = strings.TrimSpace(string(b))
	case o.CloudMetadata != "":
		if req.CloudIdentity, err = CloudIdentity(ctx, o.CloudMetadata, base); err != nil {
			return "", err
		}
	}
	var jr agentproto.JoinResponse
	if err := postJSON(ctx, hc, base+agentproto.JoinPath, req, &jr); err != nil {
		return "", err
	}
	cert, err := x509.ParseCertificate(jr.Certificate)
	if err != nil {
		return "", fmt.Errorf("agent: join: the certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	if err := writeFileAtomic(o.Dir.path(fileKey), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", err
	}
	if err := o.Dir.SaveCert(cert.Raw); err != nil {
		return "", err
	}
	st := &State{NodeID: jr.NodeID, PoolID: jr.PoolID, TrustDomain: jr.TrustDomain, APIURL: u.String(), FallbackURL: jr.FallbackURL,
		NodeCA: jr.NodeCA, ServingCA: jr.ServingCA, CommandSigningKeys: jr.CommandSigningKeys, Gateways: jr.Gateways,
		ReleaseKeys: jr.ReleaseKeys}
	if err := o.Dir.SaveState(st); err != nil {
		return "", err
	}
	return jr.NodeID, nil
}
