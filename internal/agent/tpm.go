package agent

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/google/go-attestation/attest"

	"computeplane/internal/agentproto"
)

// The TPM the join attests with (--tpm): the kernel's resource manager
// (/dev/tpmrm0, the default on a machine with a TPM) or a software TPM's
// command socket (unix:/path, swtpm socket --server type=unixio), which
// is how the tests give a node a real, separate TPM.

// DefaultTPM is the kernel's TPM resource manager.
const DefaultTPM = "/dev/tpmrm0"

// OpenTPM opens the TPM at path (DefaultTPM or unix:SOCKET) as
// go-attestation's command channel.
func OpenTPM(path string) (*attest.TPM, error) {
	var ch attest.CommandChannelTPM20
	if sock, ok := strings.CutPrefix(path, "unix:"); ok {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return nil, fmt.Errorf("agent: the TPM socket: %w", err)
		}
		ch = &framedTPM{conn: c}
	} else {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("agent: the TPM: %w", err)
		}
		ch = deviceTPM{f}
	}
	t, err := attest.OpenTPM(&attest.OpenConfig{CommandChannel: ch})
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("agent: the TPM: %w", err)
	}
	return t, nil
}

// deviceTPM is a TPM character device: one write is one command, one read
// one response.
type deviceTPM struct{ *os.File }

func (deviceTPM) MeasurementLog() ([]byte, error) {
	return nil, errors.New("agent: no measurement log is read")
}

// framedTPM is a TPM command stream over a socket: a read returns one
// whole response (the stream may split it), as the TPM library expects
// of a device.
type framedTPM struct {
	conn    net.Conn
	mu      sync.Mutex
	pending []byte
}

func (f *framedTPM) Write(b []byte) (int, error) { return f.conn.Write(b) }

func (f *framedTPM) Read(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pending) == 0 {
		hdr := make([]byte, 10) // tag, size, response code
		if _, err := io.ReadFull(f.conn, hdr); err != nil {
			return 0, err
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > 1<<16 {
			return 0, fmt.Errorf("agent: a TPM response of %d bytes", size)
		}
		resp := make([]byte, size)
		copy(resp, hdr)
		if _, err := io.ReadFull(f.conn, resp[10:]); err != nil {
			return 0, err
		}
		f.pending = resp
	}
	n := copy(b, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

func (f *framedTPM) Close() error { return f.conn.Close() }

func (f *framedTPM) MeasurementLog() ([]byte, error) {
	return nil, errors.New("agent: no measurement log is read")
}

// TPMEndorsementKey returns the SHA-256 (hex) of the endorsement public
// key (PKIX DER) of the TPM at path: what an operator enrolls in
// tpm.endorsementKeys (compute-agent tpm-ek prints it).
func TPMEndorsementKey(path string) (string, error) {
	t, err := OpenTPM(path)
	if err != nil {
		return "", err
	}
	defer t.Close()
	der, err := endorsementKey(t)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:]), nil
}

func endorsementKey(t *attest.TPM) ([]byte, error) {
	eks, err := t.EKs()
	if err != nil {
		return nil, fmt.Errorf("agent: the TPM's endorsement key: %w", err)
	}
	if len(eks) == 0 {
		return nil, errors.New("agent: the TPM has no endorsement key")
	}
	return x509.MarshalPKIXPublicKey(eks[0].Public)
}

// tpmQuote runs the TPM attestor's exchange: a fresh attestation key, the
// control plane's credential for it activated by the TPM (proof that the
// AK lives beside the endorsement key), and a quote binding the node key
// (csr's) to the activated secret.
func tpmQuote(ctx context.Context, hc *http.Client, base, path, token string, csr []byte) (*agentproto.TPMQuote, error) {
	t, err := OpenTPM(path)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	ek, err := endorsementKey(t)
	if err != nil {
		return nil, err
	}
	ak, err := t.NewAK(nil)
	if err != nil {
		return nil, fmt.Errorf("agent: an attestation key: %w", err)
	}
	defer ak.Close(t)
	p := ak.AttestationParameters()
	var ch agentproto.TPMChallenge
	if err := postJSON(ctx, hc, base+agentproto.JoinTPMChallengePath, agentproto.TPMChallengeRequest{Token: token, CSR: csr, EndorsementKey: ek,
		AttestationKey: agentproto.TPMAttestationKey{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}}, &ch); err != nil {
		return nil, err
	}
	secret, err := ak.ActivateCredential(t, attest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret})
	if err != nil {
		return nil, fmt.Errorf("agent: activating the control plane's credential: %w", err)
	}
	parsed, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(parsed.PublicKey)
	if err != nil {
		return nil, err
	}
	nodeKey := sha256.Sum256(pub)
	nonce := sha256.New()
	nonce.Write(secret)
	nonce.Write([]byte(hex.EncodeToString(nodeKey[:])))
	q, err := ak.Quote(t, nonce.Sum(nil), attest.HashSHA256)
	if err != nil {
		return nil, fmt.Errorf("agent: the TPM's quote: %w", err)
	}
	pcrs, err := t.PCRs(attest.HashSHA256)
	if err != nil {
		return nil, fmt.Errorf("agent: the TPM's PCRs: %w", err)
	}
	sort.Slice(pcrs, func(i, j int) bool { return pcrs[i].Index < pcrs[j].Index })
	out := &agentproto.TPMQuote{Challenge: ch.Challenge, AttestationKey: p.Public, Quote: q.Quote, Signature: q.Signature}
	for i, pcr := range pcrs {
		if pcr.Index != i {
			return nil, fmt.Errorf("agent: the TPM's PCR %d is missing", i)
		}
		out.PCRs = append(out.PCRs, pcr.Digest)
	}
	return out, nil
}

// postJSON posts v and decodes the answer into out; a refusal is a
// *RefusedError.
func postJSON(ctx context.Context, hc *http.Client, url string, v, out any) error {
	body, _ := json.Marshal(v)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("agent: join: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error RefusedError `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
			return fmt.Errorf("agent: join: HTTP %d", resp.StatusCode)
		}
		return &e.Error
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("agent: join: the answer: %w", err)
	}
	return nil
}
