package webhooks

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"time"

	"computeplane/internal/whsig"
)

// Signing follows Standard Webhooks (ARCHITECTURE.md) and lives in
// internal/whsig, which the identity-event webhook verifies with too: a
// secret is "whsec_" and the base64 of 32 random bytes; the key is those
// bytes; each signature is "v1," and the base64 of HMAC-SHA256 over
// "<webhook-id>.<webhook-timestamp>.<body>"; the webhook-signature header
// carries one signature per secret that still signs, space-separated.

// Header names of a delivery.
const (
	HeaderID        = whsig.HeaderID
	HeaderTimestamp = whsig.HeaderTimestamp
	HeaderSignature = whsig.HeaderSignature
	// HeaderDelivery carries the delivery id, unchanged across retries and
	// redeliveries.
	HeaderDelivery = "X-Service-Delivery"
)

// SecretPrefix starts every signing secret.
const SecretPrefix = whsig.SecretPrefix

// newSecret returns a new signing secret as shown to the tenant and its
// key bytes.
func newSecret() (string, []byte, error) { return whsig.NewSecret() }

// ParseSecret returns the key bytes of a signing secret.
func ParseSecret(s string) ([]byte, error) { return whsig.ParseSecret(s) }

// Sign returns the webhook-signature header value of a message: one v1
// signature per key, in the order given, space-separated.
func Sign(keys [][]byte, msgID string, ts time.Time, body []byte) string {
	return whsig.Sign(keys, msgID, ts, body)
}

// sealLabel starts the additional data of every seal; it changes with the
// sealing scheme.
const sealLabel = "computeplane/webhooks/v1"

// sealer keeps signing secrets at rest: AES-256-GCM under the key derived
// for keys.Webhooks, a random 12-byte nonce per seal, and the webhook id
// and the secret's generation as additional data, so a sealed secret opens
// only as the generation of the webhook it was made for.
type sealer struct{ aead cipher.AEAD }

var errOpen = errors.New("webhooks: a signing secret does not open for its webhook (was the service secret changed?)")

func newSealer(key []byte) *sealer {
	if len(key) != 32 {
		panic(fmt.Sprintf("webhooks: the key must be 32 bytes (AES-256), got %d", len(key)))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &sealer{aead: aead}
}

func additionalData(webhookID string, gen int64) []byte {
	ad := make([]byte, 0, len(sealLabel)+len(webhookID)+24)
	ad = append(ad, sealLabel...)
	ad = append(ad, 0)
	ad = append(ad, webhookID...)
	ad = append(ad, 0)
	return strconv.AppendInt(ad, gen, 10)
}

func (s *sealer) seal(webhookID string, gen int64, key []byte) (nonce, sealed []byte, err error) {
	nonce = make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, fmt.Errorf("webhooks: nonce: %w", err)
	}
	return nonce, s.aead.Seal(nil, nonce, key, additionalData(webhookID, gen)), nil
}

func (s *sealer) open(webhookID string, gen int64, nonce, sealed []byte) ([]byte, error) {
	if len(nonce) != s.aead.NonceSize() {
		return nil, errOpen
	}
	key, err := s.aead.Open(nil, nonce, sealed, additionalData(webhookID, gen))
	if err != nil {
		return nil, errOpen
	}
	return key, nil
}
