// Package instanceid is the shape of a provider's signed instance-identity
// document, in the manner of GCP's instance identity tokens and AWS's
// signed instance identity document: a JWT a machine reads from its
// provider's metadata service, signed by the provider with a key it
// publishes (JWKS), naming the machine, its account and region, for one
// audience. Metadata services sign with Sign; the cloud join attestor
// (internal/join) verifies.
package instanceid

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"computeplane/internal/agentproto"
)

// Path is where a metadata service answers a document: GET
// Path?audience=<the join endpoint>, text (the compact JWT).
const Path = agentproto.InstanceIdentityPath

// JWKSPath is where a metadata service publishes its signing keys.
const JWKSPath = "/.well-known/jwks.json"

// MaxDocumentBytes bounds a document.
const MaxDocumentBytes = 8 << 10

// Algorithms accepted on a document.
var Algorithms = []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256, jose.PS256, jose.EdDSA}

// Claims are a document's claims: the registered ones (iss, sub = the
// instance id, aud, iat, exp, jti) and the machine's.
type Claims struct {
	jwt.Claims
	InstanceID string `json:"instance_id"`
	AccountID  string `json:"account_id"` // the provider account (cloud account or project)
	Region     string `json:"region"`
	Provider   string `json:"provider,omitempty"`
}

// KeyID names a public key: the base64url SHA-256 thumbprint of its JWK.
func KeyID(pub crypto.PublicKey) (string, error) {
	tp, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(tp[:16]), nil
}

// JWKS is the key set publishing pub.
func JWKS(pub *ecdsa.PublicKey) (jose.JSONWebKeySet, error) {
	kid, err := KeyID(pub)
	if err != nil {
		return jose.JSONWebKeySet{}, err
	}
	return jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"}}}, nil
}

// Sign makes a document with an ECDSA P-256 key (ES256).
func Sign(key *ecdsa.PrivateKey, c Claims) (string, error) {
	if c.InstanceID == "" || c.AccountID == "" || len(c.Audience) == 0 {
		return "", errors.New("instanceid: a document names an instance, an account and an audience")
	}
	kid, err := KeyID(&key.PublicKey)
	if err != nil {
		return "", err
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return "", err
	}
	doc, err := jwt.Signed(s).Claims(c).Serialize()
	if err != nil {
		return "", fmt.Errorf("instanceid: %w", err)
	}
	return doc, nil
}

// Digest is a document's SHA-256 (hex): what a join keeps of it.
func Digest(doc string) string {
	s := sha256.Sum256([]byte(doc))
	return hex.EncodeToString(s[:])
}
