package release

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVerify(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	otherPub, otherPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	bin := []byte("the binary")
	sum := sha256.Sum256(bin)
	sig := Sign(priv, "compute-agent", "v1.2.0", "linux-amd64", sum)
	keys := []ed25519.PublicKey{otherPub, pub}

	require.NoError(t, Verify(keys, "compute-agent", "v1.2.0", "linux-amd64", sum, sum, sig), "any pinned key verifies")

	tampered := sha256.Sum256([]byte("the binary, changed"))
	require.ErrorIs(t, Verify(keys, "compute-agent", "v1.2.0", "linux-amd64", tampered, sum, sig), ErrChecksum,
		"bytes that do not match the published checksum")
	require.ErrorIs(t, Verify(keys, "compute-agent", "v1.2.0", "linux-amd64", tampered, tampered, sig), ErrSignature,
		"bytes and checksum both replaced: the signature is of the other checksum")
	require.ErrorIs(t, Verify(keys, "compute-agent", "v1.3.0", "linux-amd64", sum, sum, sig), ErrSignature,
		"a signed v1.2.0 served as v1.3.0")
	require.ErrorIs(t, Verify(keys, "compute-guest", "v1.2.0", "linux-amd64", sum, sum, sig), ErrSignature,
		"another agent's name")
	require.ErrorIs(t, Verify(keys, "compute-agent", "v1.2.0", "linux-arm64", sum, sum, sig), ErrSignature,
		"another platform")
	require.ErrorIs(t, Verify([]ed25519.PublicKey{otherPub}, "compute-agent", "v1.2.0", "linux-amd64", sum, sum, sig), ErrSignature,
		"signed by a key that is not pinned")
	forged := Sign(otherPriv, "compute-agent", "v1.2.0", "linux-amd64", sum)
	require.ErrorIs(t, Verify([]ed25519.PublicKey{pub}, "compute-agent", "v1.2.0", "linux-amd64", sum, sum, forged), ErrSignature)
	require.ErrorIs(t, Verify(nil, "compute-agent", "v1.2.0", "linux-amd64", sum, sum, sig), ErrNoKey)
	require.ErrorIs(t, Verify(keys, "compute-agent", "v1.2.0", "linux-amd64", sum, sum, sig[:10]), ErrSignature)
}

func TestHighestIsSemverOrder(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "v1.10.0", Highest([]string{"v1.2.0", "v1.10.0", "v1.9.9", "v1.10.0-rc.1", "junk", "1.99.0"}),
		"numeric, not lexical; a pre-release below its release; names that are no version are left out")
	assert.Equal(t, "v2.0.0-rc.2", Highest([]string{"v1.0.0", "v2.0.0-rc.1", "v2.0.0-rc.2"}))
	assert.Equal(t, "", Highest([]string{"latest", "v1"}), "v1 alone is not a full version")
	assert.Equal(t, "", Highest(nil))
}

func TestNames(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"v1.2.3", "v0.0.0-20260101000000-abcdef012345", "v1.3.0-rc.1"} {
		assert.NoError(t, CheckVersion(v), v)
	}
	for _, v := range []string{"1.2.3", "v1.2", "v1.2.3+meta", "latest", "../v1.2.3", ""} {
		assert.Error(t, CheckVersion(v), v)
	}
	assert.NoError(t, CheckPlatform("linux-amd64"))
	for _, p := range []string{"linux", "linux-amd64.sha256", "../x-y", "Linux-AMD64"} {
		assert.Error(t, CheckPlatform(p), p)
	}
	assert.NoError(t, CheckAgent("compute-agent"))
	for _, a := range []string{"", "..", "Compute", "a/b", "-x"} {
		assert.Error(t, CheckAgent(a), a)
	}
}

func TestChecksumFileAndKeyRoundTrip(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("x"))
	got, err := ParseChecksum(ChecksumFile("linux-amd64", sum))
	require.NoError(t, err)
	assert.Equal(t, sum, got)
	_, err = ParseChecksum([]byte("nothex  linux-amd64\n"))
	assert.Error(t, err)

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	k, err := ParsePublicKey(PublicKeyPEM(pub))
	require.NoError(t, err)
	assert.Equal(t, pub, k)
	_, err = ParsePublicKey([]byte("not a key"))
	assert.Error(t, err)
}
