package webhooks

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Signing follows Standard Webhooks (ARCHITECTURE.md): a secret is
// "whsec_" and the base64 of 32 random bytes; the key is those bytes; each
// signature is "v1," and the base64 of HMAC-SHA256 over
// "<webhook-id>.<webhook-timestamp>.<body>"; the webhook-signature header
// carries one signature per secret that still signs, space-separated.

// Header names of a delivery.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	// HeaderDelivery carries the delivery id, unchanged across retries and
	// redeliveries.
	HeaderDelivery = "X-Service-Delivery"
)

// SecretPrefix starts every signing secret.
const SecretPrefix = "whsec_"

const secretBytes = 32

// newSecret returns a new signing secret as shown to the tenant and its
// key bytes.
func newSecret() (string, []byte, error) {
	key := make([]byte, secretBytes)
	if _, err := rand.Read(key); err != nil {
		return "", nil, fmt.Errorf("webhooks: secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(key), key, nil
}

// ParseSecret returns the key bytes of a signing secret.
func ParseSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return nil, errors.New("webhooks: a signing secret starts with " + SecretPrefix)
	}
	return base64.StdEncoding.DecodeString(rest)
}

// Sign returns the webhook-signature header value of a message: one v1
// signature per key, in the order given, space-separated.
func Sign(keys [][]byte, msgID string, ts time.Time, body []byte) string {
	var b strings.Builder
	prefix := msgID + "." + strconv.FormatInt(ts.Unix(), 10) + "."
	for i, k := range keys {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(prefix))
		m.Write(body)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return b.String()
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
