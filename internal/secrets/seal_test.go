package secrets

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/keys"
)

func testSealer(t *testing.T, secret string) *sealer {
	t.Helper()
	s, err := newSealer(keys.Derive(secret, keys.Secrets))
	require.NoError(t, err)
	return s
}

const (
	refA = "secret://tenants/acme/db-password"
	refB = "secret://tenants/globex/db-password"
)

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	s := testSealer(t, "0123456789abcdef0123456789abcdef")
	for _, plain := range [][]byte{[]byte("x"), []byte("hunter2"), bytes.Repeat([]byte("é"), 32768)} {
		nonce, sealed, err := s.seal(refA, 3, plain)
		require.NoError(t, err)
		assert.Len(t, nonce, 12)
		assert.Len(t, sealed, len(plain)+16, "ciphertext plus the GCM tag")
		if len(plain) >= 4 { // a shorter plaintext can occur in random bytes by chance
			assert.NotContains(t, string(sealed), string(plain))
		}
		got, err := s.open(refA, 3, nonce, sealed)
		require.NoError(t, err)
		assert.Equal(t, plain, got)
	}
}

func TestSealUsesAFreshNonceEachTime(t *testing.T) {
	t.Parallel()
	s := testSealer(t, "0123456789abcdef0123456789abcdef")
	n1, c1, err := s.seal(refA, 1, []byte("same"))
	require.NoError(t, err)
	n2, c2, err := s.seal(refA, 1, []byte("same"))
	require.NoError(t, err)
	assert.NotEqual(t, n1, n2)
	assert.NotEqual(t, c1, c2)
}

func TestOpenRefusesAnotherRow(t *testing.T) {
	t.Parallel()
	s := testSealer(t, "0123456789abcdef0123456789abcdef")
	nonce, sealed, err := s.seal(refA, 2, []byte("hunter2"))
	require.NoError(t, err)
	for name, open := range map[string]func() ([]byte, error){
		"another reference": func() ([]byte, error) { return s.open(refB, 2, nonce, sealed) },
		"another version":   func() ([]byte, error) { return s.open(refA, 1, nonce, sealed) },
		"fleet reference":   func() ([]byte, error) { return s.open("secret://fleet/db-password", 2, nonce, sealed) },
		"another key": func() ([]byte, error) {
			return testSealer(t, "another-secret-0123456789abcdef0").open(refA, 2, nonce, sealed)
		},
	} {
		got, err := open()
		assert.ErrorIs(t, err, errOpen, name)
		assert.Nil(t, got, name)
	}
}

func TestOpenRefusesTampering(t *testing.T) {
	t.Parallel()
	s := testSealer(t, "0123456789abcdef0123456789abcdef")
	nonce, sealed, err := s.seal(refA, 1, []byte("hunter2"))
	require.NoError(t, err)
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x01
		_, err := s.open(refA, 1, nonce, bad)
		assert.ErrorIs(t, err, errOpen, "byte %d flipped", i)
	}
	badNonce := bytes.Clone(nonce)
	badNonce[0] ^= 0x80
	_, err = s.open(refA, 1, badNonce, sealed)
	assert.ErrorIs(t, err, errOpen, "nonce flipped")
	_, err = s.open(refA, 1, nonce[:11], sealed)
	assert.ErrorIs(t, err, errOpen, "short nonce")
	_, err = s.open(refA, 1, nonce, sealed[:len(sealed)-1])
	assert.ErrorIs(t, err, errOpen, "truncated")
	_, err = s.open(refA, 1, nonce, nil)
	assert.ErrorIs(t, err, errOpen, "empty")
}

func TestAdditionalDataIsUnambiguous(t *testing.T) {
	t.Parallel()
	// Version 12 of r is not version 2 of r+"1"; the NUL separates them.
	assert.NotEqual(t, additionalData("secret://fleet/a1", 2), additionalData("secret://fleet/a", 12))
}

func TestNewSealerWantsAnAES256Key(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 16, 24, 31, 33} {
		_, err := newSealer(make([]byte, n))
		assert.Error(t, err, n)
	}
	assert.Panics(t, func() { New("root", StoreDatabase, make([]byte, 16)) })
}
