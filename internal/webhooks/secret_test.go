package webhooks

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/keys"
)

func TestSecretsAndSignaturesFollowStandardWebhooks(t *testing.T) {
	t.Parallel()
	s1, k1, err := newSecret()
	require.NoError(t, err)
	s2, k2, err := newSecret()
	require.NoError(t, err)
	assert.Regexp(t, `^whsec_[A-Za-z0-9+/]{43}=$`, s1, "whsec_ and the base64 of 32 bytes")
	assert.Len(t, k1, 32)
	assert.NotEqual(t, s1, s2)
	parsed, err := ParseSecret(s1)
	require.NoError(t, err)
	assert.Equal(t, k1, parsed)
	_, err = ParseSecret("nope")
	assert.Error(t, err)

	body := []byte(`{"specversion":"1.0","id":"evt_1"}`)
	ts := time.Now()
	header := func(sig string) http.Header {
		h := http.Header{}
		h.Set(HeaderID, "dlv_01")
		h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		h.Set(HeaderSignature, sig)
		return h
	}
	one := Sign([][]byte{k1}, "dlv_01", ts, body)
	both := Sign([][]byte{k2, k1}, "dlv_01", ts, body)
	assert.True(t, strings.HasPrefix(one, "v1,"))
	assert.Len(t, strings.Split(both, " "), 2, "one signature per secret, space-separated")

	w1, err := standardwebhooks.NewWebhook(s1)
	require.NoError(t, err)
	w2, err := standardwebhooks.NewWebhook(s2)
	require.NoError(t, err)
	require.NoError(t, w1.Verify(body, header(one)))
	require.NoError(t, w1.Verify(body, header(both)))
	require.NoError(t, w2.Verify(body, header(both)))
	assert.Error(t, w2.Verify(body, header(one)), "a secret that did not sign")
	assert.Error(t, w1.Verify(append(bytes.Clone(body), ' '), header(one)), "another body")
	// The reference library's own signature is ours.
	ref, err := w1.Sign("dlv_01", ts, body)
	require.NoError(t, err)
	assert.Equal(t, ref, one)
}

func TestSealedSecretsOpenOnlyForTheirWebhookAndGeneration(t *testing.T) {
	t.Parallel()
	s := newSealer(keys.Derive("a-service-secret-of-at-least-32-characters", keys.Webhooks))
	other := newSealer(keys.Derive("another-service-secret-of-32-characters!", keys.Webhooks))
	key := []byte("0123456789abcdef0123456789abcdef")
	nonce, sealed, err := s.seal("whk_a", 3, key)
	require.NoError(t, err)
	assert.NotContains(t, string(sealed), string(key))
	got, err := s.open("whk_a", 3, nonce, sealed)
	require.NoError(t, err)
	assert.Equal(t, key, got)
	for name, open := range map[string]func() ([]byte, error){
		"other webhook":    func() ([]byte, error) { return s.open("whk_b", 3, nonce, sealed) },
		"other generation": func() ([]byte, error) { return s.open("whk_a", 2, nonce, sealed) },
		"other key":        func() ([]byte, error) { return other.open("whk_a", 3, nonce, sealed) },
		"bad nonce":        func() ([]byte, error) { return s.open("whk_a", 3, nonce[:5], sealed) },
	} {
		_, err := open()
		assert.ErrorIs(t, err, errOpen, name)
	}
	assert.Panics(t, func() { newSealer([]byte("short")) })
}
