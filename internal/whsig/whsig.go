// Package whsig signs and verifies Standard Webhooks messages: the
// deliveries of the webhooks group (signed) and the identity service's
// event webhook (verified). A secret is "whsec_" and the base64 of its key
// bytes; a signature is "v1," and the base64 of HMAC-SHA256 over
// "<webhook-id>.<webhook-timestamp>.<body>"; the webhook-signature header
// carries one or more signatures, space-separated.
package whsig

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of a signed message.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every signing secret.
const SecretPrefix = "whsec_"

// Tolerance is how far a message's timestamp may be from the receiver's
// clock, either way, before it is refused as stale (replay protection).
const Tolerance = 5 * time.Minute

const secretBytes = 32

// NewSecret returns a new signing secret as shown to its holder and its key
// bytes.
func NewSecret() (string, []byte, error) {
	key := make([]byte, secretBytes)
	if _, err := rand.Read(key); err != nil {
		return "", nil, fmt.Errorf("whsig: secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(key), key, nil
}

// ParseSecret returns the key bytes of a signing secret.
func ParseSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return nil, errors.New("whsig: a signing secret starts with " + SecretPrefix)
	}
	return base64.StdEncoding.DecodeString(rest)
}

func mac(key []byte, msgID, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msgID + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}

// Sign returns the webhook-signature header value of a message: one v1
// signature per key, in the order given, space-separated.
func Sign(keys [][]byte, msgID string, ts time.Time, body []byte) string {
	var b strings.Builder
	stamp := strconv.FormatInt(ts.Unix(), 10)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(mac(k, msgID, stamp, body)))
	}
	return b.String()
}

// Verification failures; every one is an unauthenticated message.
var (
	ErrMissing   = errors.New("whsig: webhook-id, webhook-timestamp and webhook-signature are required")
	ErrTimestamp = errors.New("whsig: webhook-timestamp is not within the tolerance of the receiver's clock")
	ErrSignature = errors.New("whsig: no webhook-signature matches")
)

// Verify checks a message against key: the three headers present, the
// timestamp within Tolerance of now, and at least one v1 signature that
// matches (compared in constant time). It returns the message id.
func Verify(key []byte, h http.Header, body []byte, now time.Time) (string, error) {
	id, stamp, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || stamp == "" || sigs == "" {
		return "", ErrMissing
	}
	sec, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return "", ErrTimestamp
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return "", ErrTimestamp
	}
	want := mac(key, id, stamp, body)
	for _, s := range strings.Fields(sigs) {
		v, ok := strings.CutPrefix(s, "v1,")
		if !ok {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(v)
		if err == nil && hmac.Equal(got, want) {
			return id, nil
		}
	}
	return "", ErrSignature
}
