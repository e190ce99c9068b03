package whsig

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVerifyAgreesWithTheReferenceLibrary(t *testing.T) {
	t.Parallel()
	secret, key, err := NewSecret()
	require.NoError(t, err)
	ref, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	body := []byte(`{"id":"evt_1"}`)
	now := time.Now()
	header := func(ts time.Time, sig string) http.Header {
		h := http.Header{}
		h.Set(HeaderID, "evt_1")
		h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		h.Set(HeaderSignature, sig)
		return h
	}
	refSig, err := ref.Sign("evt_1", now, body)
	require.NoError(t, err)
	id, err := Verify(key, header(now, refSig), body, now)
	require.NoError(t, err, "the reference library's signature verifies")
	assert.Equal(t, "evt_1", id)
	_, other, _ := NewSecret()
	_, err = Verify(key, header(now, "v1,bm9wZQ== "+Sign([][]byte{other, key}, "evt_1", now, body)), body, now)
	require.NoError(t, err, "any matching signature of several")

	_, err = Verify(key, header(now, Sign([][]byte{other}, "evt_1", now, body)), body, now)
	assert.ErrorIs(t, err, ErrSignature)
	_, err = Verify(key, header(now, refSig), append(body, ' '), now)
	assert.ErrorIs(t, err, ErrSignature, "another body")
	old := now.Add(-Tolerance - time.Second)
	_, err = Verify(key, header(old, Sign([][]byte{key}, "evt_1", old, body)), body, now)
	assert.ErrorIs(t, err, ErrTimestamp, "stale")
	future := now.Add(Tolerance + time.Second)
	_, err = Verify(key, header(future, Sign([][]byte{key}, "evt_1", future, body)), body, now)
	assert.ErrorIs(t, err, ErrTimestamp, "from the future")
	_, err = Verify(key, http.Header{}, body, now)
	assert.ErrorIs(t, err, ErrMissing)
}
