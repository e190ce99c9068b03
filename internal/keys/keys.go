// Package keys derives the service's symmetric keys from the service
// secret with HKDF-SHA256, one label per purpose, so that no two purposes
// ever share a key and the secret itself is never used directly.
package keys

import (
	"crypto/hkdf"
	"crypto/sha256"
)

// Purposes, each with its own key.
const (
	Secrets  = "computeplane/secrets/v1"
	PKI      = "computeplane/pki/v1"
	Webhooks = "computeplane/webhooks/v1"
	Cursors  = "computeplane/cursors/v1"
	Previews = "computeplane/previews/v1" // preview URL tokens (tunnels)
	// SecretDigests keys the HMAC of secret values that tells a put's retry
	// from a different value under the same idempotency key.
	SecretDigests = "computeplane/secret-digests/v1"
)

// Size is the length of every derived key (AES-256, HMAC-SHA256).
const Size = 32

// Derive returns the key for purpose.
func Derive(secret, purpose string) []byte {
	k, err := hkdf.Key(sha256.New, []byte(secret), nil, purpose, Size)
	if err != nil {
		// Only a key length beyond 255*32 bytes fails.
		panic(err)
	}
	return k
}
