package iam_test

// POST /iam/events, the identity service's signed event webhook, through
// real HTTP against the api role: signed events land in the inbox once per
// id and revoke sessions at once; unsigned, badly signed and stale ones are
// 401; without a secret the route does not exist.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/testenv"
	"computeplane/internal/whsig"
)

type hookAnswer struct {
	status int
	body   map[string]any
}

// postEvent posts body to url signed by sign (nil: unsigned) as message id
// at ts.
func postEvent(t *testing.T, url, id string, ts time.Time, body []byte, keys ...[]byte) hookAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if len(keys) > 0 {
		req.Header.Set(whsig.HeaderID, id)
		req.Header.Set(whsig.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		req.Header.Set(whsig.HeaderSignature, whsig.Sign(keys, id, ts, body))
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = json.Unmarshal(raw, &out)
	return hookAnswer{status: res.StatusCode, body: out}
}

func errCode(a hookAnswer) string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func eventBody(t *testing.T, fields map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(fields)
	require.NoError(t, err)
	return b
}

// watch opens GET /watch for token and returns a channel closed when the
// stream ends, with the lines it carried.
func watch(t *testing.T, base, token string) <-chan []string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/watch?tenantId=acme", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Body.Close() })
	require.Equal(t, http.StatusOK, res.StatusCode)
	done := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		done <- lines
	}()
	return done
}

func TestIdentityEventWebhook(t *testing.T) {
	t.Parallel()
	secret, key, err := whsig.NewSecret()
	require.NoError(t, err)
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "iam: {events: {secret: '"+secret+"'}}\n")))
	url := env.URL + "/iam/events"
	inbox := func(id string) int {
		var n int
		require.NoError(t, env.Store.Pool().QueryRow(t.Context(), "SELECT count(*) FROM iam.inbox WHERE event_id = $1", id).Scan(&n))
		return n
	}
	token, keyID := env.NewKey(t, "acme", "ann", "owner")
	other := env.Key(t, "acme", "bob", "owner")
	revoked := watch(t, env.URL, token)
	kept := watch(t, env.URL, other)

	// A signed event lands in the inbox and drops the session at once:
	// its open stream closes, the other session's stays.
	now := time.Now()
	body := eventBody(t, map[string]any{"id": "evt-1", "type": "session.revoked", "identityId": "ann", "session": "key:" + keyID,
		"at": now.UTC().Format(time.RFC3339)})
	a := postEvent(t, url, "evt-1", now, body, key)
	require.Equal(t, http.StatusOK, a.status, a.body)
	assert.Equal(t, true, a.body["recorded"])
	assert.Equal(t, 1, inbox("evt-1"))
	select {
	case lines := <-revoked:
		assert.Contains(t, strings.Join(lines, "\n"), "revoked")
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked session's stream stayed open")
	}
	select {
	case <-kept:
		t.Fatal("another session's stream closed")
	case <-time.After(300 * time.Millisecond):
	}

	// The same event again records nothing: idempotent by event id.
	a = postEvent(t, url, "evt-1", time.Now(), body, key)
	require.Equal(t, http.StatusOK, a.status, a.body)
	assert.Equal(t, false, a.body["recorded"])
	assert.Equal(t, 1, inbox("evt-1"))

	// Refused with 401, recording nothing: unsigned, signed with another
	// secret, stale or from the future, a body changed after signing.
	fresh := eventBody(t, map[string]any{"id": "evt-2", "type": "session.revoked", "session": "key:x"})
	_, otherKey, err := whsig.NewSecret()
	require.NoError(t, err)
	for name, a := range map[string]hookAnswer{
		"unsigned":     postEvent(t, url, "evt-2", time.Now(), fresh),
		"other secret": postEvent(t, url, "evt-2", time.Now(), fresh, otherKey),
		"stale":        postEvent(t, url, "evt-2", time.Now().Add(-6*time.Minute), fresh, key),
		"future":       postEvent(t, url, "evt-2", time.Now().Add(6*time.Minute), fresh, key),
	} {
		assert.Equal(t, http.StatusUnauthorized, a.status, name)
		assert.Equal(t, "UNAUTHENTICATED", errCode(a), name)
	}
	// Badly signed: the signature of another message id, or of the body
	// before it was changed.
	changed := append(bytes.Clone(fresh[:len(fresh)-1]), []byte(`,"identityId":"x"}`)...)
	for name, c := range map[string]struct {
		signedID string
		sent     []byte
	}{"another message id": {"evt-3", fresh}, "another body": {"evt-2", changed}} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(c.sent))
		require.NoError(t, err)
		ts := time.Now()
		req.Header.Set(whsig.HeaderID, "evt-2")
		req.Header.Set(whsig.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		req.Header.Set(whsig.HeaderSignature, whsig.Sign([][]byte{key}, c.signedID, ts, fresh))
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, res.StatusCode, name)
	}
	assert.Equal(t, 0, inbox("evt-2"))

	// Signed but malformed: INVALID_INPUT; the body's id must be the
	// message's.
	a = postEvent(t, url, "evt-4", time.Now(), eventBody(t, map[string]any{"id": "evt-5", "type": "session.revoked"}), key)
	assert.Equal(t, http.StatusBadRequest, a.status)
	assert.Equal(t, "INVALID_INPUT", errCode(a))
	a = postEvent(t, url, "evt-4", time.Now(), []byte(`{"id":"evt-4","type":"session.revoked","extra":1}`), key)
	assert.Equal(t, "INVALID_INPUT", errCode(a), "unknown fields")
	assert.Equal(t, 0, inbox("evt-4"))

	// Only POST.
	res, err := http.Get(url)
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
}

func TestIdentityEventWebhookPathAndAbsence(t *testing.T) {
	t.Parallel()
	secret, key, err := whsig.NewSecret()
	require.NoError(t, err)
	body := []byte(`{"id":"evt-1","type":"credential.revoked","session":"key:x"}`)

	// Without a secret the route is not mounted.
	bare := testenv.Start(t)
	assert.Equal(t, http.StatusNotFound, postEvent(t, bare.URL+"/iam/events", "evt-1", time.Now(), body, key).status)

	// The path is configurable.
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t,
		"iam: {events: {path: /hooks/identity, secret: '"+secret+"'}}\n")))
	assert.Equal(t, http.StatusNotFound, postEvent(t, env.URL+"/iam/events", "evt-1", time.Now(), body, key).status)
	a := postEvent(t, env.URL+"/hooks/identity", "evt-1", time.Now(), body, key)
	assert.Equal(t, http.StatusOK, a.status, a.body)
	assert.Equal(t, true, a.body["recorded"])
}
