package join

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/go-attestation/attest"

	"computeplane/internal/agentproto"
	"computeplane/internal/pki"
)

// The TPM attestor (attestors: [tpm]) admits only machines whose TPM's
// endorsement key is enrolled (tpm.endorsementKeys), besides the join
// token that names the pool. At join the node proves, in two requests:
//
//  1. POST /v1/join/tpm-challenge with its endorsement key (EK) and a
//     fresh attestation key (AK): the control plane checks the EK is
//     enrolled and the AK is a restricted TPM signing key, and answers a
//     credential encrypted to the EK (TPM2_MakeCredential), so only that
//     TPM can activate it, and only for that AK; with it, a sealed
//     challenge holding the secret, the token, the EK, the AK and the node
//     key, valid for TPMChallengeTTL.
//  2. POST /v1/join with a quote by the AK whose nonce is
//     SHA-256(secret || SHA-256(node public key)): the control plane
//     opens its challenge, checks it names the same token, EK, AK and node
//     key, and verifies the quote. Only then is the node made, in the
//     same transaction as its node_attestations row: a refused attestation
//     leaves no node behind.
//
// The quote binds the node's key (the one its certificate is issued
// for) to the enrolled TPM. PCR values are carried and verified against
// the quote but no boot policy is enforced on them.

// TPMChallengeTTL bounds the time from challenge to join.
const TPMChallengeTTL = 2 * time.Minute

// ErrAttestation is the refusal of an attestation.
var ErrAttestation = errors.New("join: TPM attestation refused")

// TPMAttestor checks TPM attestations against the enrolled endorsement
// keys.
type TPMAttestor struct {
	enrolled map[string]bool
}

// NewTPMAttestor enrolls the endorsement keys (SHA-256 hex of each PKIX
// DER public key).
func NewTPMAttestor(endorsementKeys []string) *TPMAttestor {
	a := &TPMAttestor{enrolled: map[string]bool{}}
	for _, k := range endorsementKeys {
		a.enrolled[k] = true
	}
	return a
}

// Attestation is what a verified quote proved, kept in node_attestations.
type Attestation struct {
	EndorsementKey, AttestationKey, NodeKey string // SHA-256 hex
}

type tpmChallenge struct {
	Token   string `json:"token"` // the join token's id
	EK      string `json:"ek"`
	AK      string `json:"ak"`
	NodeKey string `json:"nodeKey"`
	Secret  []byte `json:"secret"`
	Exp     int64  `json:"exp"`
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// EndorsementKeyHash is how tpm.endorsementKeys names a TPM: the SHA-256
// (hex) of its endorsement public key in PKIX DER.
func EndorsementKeyHash(pkixDER []byte) string { return sum(pkixDER) }

// QuoteNonce is what the AK quotes: SHA-256(secret || SHA-256(node key)).
func QuoteNonce(secret []byte, nodeKeyHash string) []byte {
	h := sha256.New()
	h.Write(secret)
	h.Write([]byte(nodeKeyHash))
	return h.Sum(nil)
}

// challengeAEAD is a key of the join service for its own challenges,
// derived from the join key (never leaves the control plane).
func challengeAEAD(b *pki.Bundle) (cipher.AEAD, error) {
	priv, err := b.Join.ECDH()
	if err != nil {
		return nil, err
	}
	key, err := hkdf.Key(sha256.New, priv.Bytes(), nil, "computeplane tpm challenge v1", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Challenge checks the request (token, certificate request, enrolled EK,
// AK parameters) and makes the credential and the sealed challenge.
func (a *TPMAttestor) Challenge(b *pki.Bundle, req agentproto.TPMChallengeRequest, now time.Time) (*agentproto.TPMChallenge, error) {
	c, err := open(b, req.Token)
	if err != nil {
		return nil, err
	}
	if now.Unix() >= c.Exp {
		return nil, ErrExpired
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err != nil {
		return nil, fmt.Errorf("%w: csr is not a DER certificate request", ErrAttestation)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: the certificate request's signature: %v", ErrAttestation, err)
	}
	nodeKey, err := keyID(csr)
	if err != nil {
		return nil, err
	}
	ek := EndorsementKeyHash(req.EndorsementKey)
	if !a.enrolled[ek] {
		return nil, fmt.Errorf("%w: endorsement key %s is not enrolled (tpm.endorsementKeys)", ErrAttestation, ek)
	}
	ekPub, err := x509.ParsePKIXPublicKey(req.EndorsementKey)
	if err != nil {
		return nil, fmt.Errorf("%w: the endorsement key: %v", ErrAttestation, err)
	}
	ak := req.AttestationKey
	params := attest.ActivationParameters{EK: ekPub, AK: attest.AttestationParameters{
		Public: ak.Public, CreateData: ak.CreateData, CreateAttestation: ak.CreateAttestation, CreateSignature: ak.CreateSignature}}
	secret, cred, err := params.Generate() // checks the AK is a restricted TPM signing key
	if err != nil {
		return nil, fmt.Errorf("%w: the attestation key: %v", ErrAttestation, err)
	}
	plain, _ := json.Marshal(tpmChallenge{Token: c.ID, EK: ek, AK: sum(ak.Public), NodeKey: nodeKey, Secret: secret, Exp: now.Add(TPMChallengeTTL).Unix()})
	aead, err := challengeAEAD(b)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return &agentproto.TPMChallenge{Challenge: aead.Seal(nonce, nonce, plain, nil), Credential: cred.Credential, Secret: cred.Secret}, nil
}

// Verify checks a join's quote: its challenge (sealed by this deployment,
// unexpired, for this token, node key and a still enrolled EK) and the
// quote's signature by that AK over the nonce.
func (a *TPMAttestor) Verify(b *pki.Bundle, token string, csr *x509.CertificateRequest, q *agentproto.TPMQuote, now time.Time) (*Attestation, error) {
	if q == nil {
		return nil, fmt.Errorf("%w: this deployment joins nodes through the TPM attestor; the request carries no TPM quote (compute-agent join --tpm)", ErrAttestation)
	}
	c, err := open(b, token)
	if err != nil {
		return nil, err
	}
	aead, err := challengeAEAD(b)
	if err != nil {
		return nil, err
	}
	if len(q.Challenge) < aead.NonceSize() {
		return nil, fmt.Errorf("%w: not a challenge of this deployment", ErrAttestation)
	}
	plain, err := aead.Open(nil, q.Challenge[:aead.NonceSize()], q.Challenge[aead.NonceSize():], nil)
	if err != nil {
		return nil, fmt.Errorf("%w: not a challenge of this deployment", ErrAttestation)
	}
	var ch tpmChallenge
	if err := json.Unmarshal(plain, &ch); err != nil {
		return nil, fmt.Errorf("%w: not a challenge of this deployment", ErrAttestation)
	}
	nodeKey, err := keyID(csr)
	if err != nil {
		return nil, err
	}
	switch {
	case now.Unix() >= ch.Exp:
		return nil, fmt.Errorf("%w: the challenge expired (ask for another)", ErrAttestation)
	case ch.Token != c.ID:
		return nil, fmt.Errorf("%w: the challenge was made for another join token", ErrAttestation)
	case ch.NodeKey != nodeKey:
		return nil, fmt.Errorf("%w: the challenge was made for another node key", ErrAttestation)
	case !a.enrolled[ch.EK]:
		return nil, fmt.Errorf("%w: endorsement key %s is no longer enrolled", ErrAttestation, ch.EK)
	case sum(q.AttestationKey) != ch.AK:
		return nil, fmt.Errorf("%w: the quote's attestation key is not the one the credential was made for", ErrAttestation)
	}
	akPub, err := attest.ParseAKPublic(q.AttestationKey)
	if err != nil {
		return nil, fmt.Errorf("%w: the attestation key: %v", ErrAttestation, err)
	}
	pcrs := make([]attest.PCR, len(q.PCRs))
	for i, d := range q.PCRs {
		pcrs[i] = attest.PCR{Index: i, Digest: slices.Clone(d), DigestAlg: crypto.SHA256}
	}
	if err := akPub.Verify(attest.Quote{Quote: q.Quote, Signature: q.Signature}, pcrs, QuoteNonce(ch.Secret, nodeKey)); err != nil {
		return nil, fmt.Errorf("%w: the quote: %v", ErrAttestation, err)
	}
	return &Attestation{EndorsementKey: ch.EK, AttestationKey: ch.AK, NodeKey: nodeKey}, nil
}
