package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
)

// sealLabel starts the additional data of every seal; it changes with the
// sealing scheme.
const sealLabel = "computeplane/secrets/v1"

// sealer is the database store's AEAD: AES-256-GCM under the key derived
// for keys.Secrets, a random 12-byte nonce per seal, and the reference and
// version as additional data, so a sealed value opens only in the row it
// was written for.
type sealer struct{ aead cipher.AEAD }

// errOpen is every failure to open: wrong row, tampering or another key.
var errOpen = errors.New("secrets: the sealed value does not open for this reference and version")

func newSealer(key []byte) (*sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets: the key must be 32 bytes (AES-256), got %d", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block) // 12-byte nonce, 16-byte tag
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

// additionalData binds a seal to its row. References hold no NUL.
func additionalData(reference string, version int64) []byte {
	ad := make([]byte, 0, len(sealLabel)+len(reference)+24)
	ad = append(ad, sealLabel...)
	ad = append(ad, 0)
	ad = append(ad, reference...)
	ad = append(ad, 0)
	return strconv.AppendInt(ad, version, 10)
}

// seal encrypts plaintext for (reference, version) under a fresh nonce.
func (s *sealer) seal(reference string, version int64, plaintext []byte) (nonce, sealed []byte, err error) {
	nonce = make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, fmt.Errorf("secrets: nonce: %w", err)
	}
	return nonce, s.aead.Seal(nil, nonce, plaintext, additionalData(reference, version)), nil
}

// open decrypts what seal wrote for (reference, version).
func (s *sealer) open(reference string, version int64, nonce, sealed []byte) ([]byte, error) {
	if len(nonce) != s.aead.NonceSize() {
		return nil, errOpen
	}
	plain, err := s.aead.Open(nil, nonce, sealed, additionalData(reference, version))
	if err != nil {
		return nil, errOpen
	}
	return plain, nil
}
