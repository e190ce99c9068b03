package metrics

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testToken = "0123456789abcdef-metrics-token"

func TestEnabled(t *testing.T) {
	assert.False(t, Enabled(""))
	assert.False(t, Enabled(strings.Repeat("x", MinTokenLen-1)))
	assert.True(t, Enabled(strings.Repeat("x", MinTokenLen)))
	assert.True(t, Enabled(testToken))
	// Chars, not bytes: 8 two-byte chars are 16 bytes but only 8 chars.
	assert.False(t, Enabled(strings.Repeat("é", 8)))
	assert.True(t, Enabled(strings.Repeat("é", 16)))
}

func serve(h http.Handler, method, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, DefaultPath, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func assertJSONError(t *testing.T, rec *httptest.ResponseRecorder, code string) {
	t.Helper()
	assert.Contains(t, rec.Header().Get("Content-Type"), "application/json")
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	assert.Equal(t, code, body.Error.Code)
	assert.NotEmpty(t, body.Error.Message)
	assert.Less(t, rec.Body.Len(), 256)
}

func TestHandlerAuth(t *testing.T) {
	reg := NewRegistry()
	rpc, err := NewRPC(reg)
	require.NoError(t, err)
	rpc.Observe("sites.create", CodeOK, 200, time.Millisecond)
	h := Handler(testToken, reg)

	t.Run("right token", func(t *testing.T) {
		rec := serve(h, http.MethodGet, "Bearer "+testToken)
		require.Equal(t, http.StatusOK, rec.Code)
		body := rec.Body.String()
		assert.Contains(t, body, `compute_rpc_requests_total{code="OK",method="sites.create"} 1`)
		assert.Contains(t, body, "compute_rpc_duration_seconds_bucket")
		assert.Contains(t, body, "go_goroutines")
		assert.Empty(t, rec.Header().Get("WWW-Authenticate"))
	})

	t.Run("scheme is case-insensitive", func(t *testing.T) {
		rec := serve(h, http.MethodGet, "bearer "+testToken)
		assert.Equal(t, http.StatusOK, rec.Code)
	})

	unauthorized := map[string]string{
		"no token":           "",
		"wrong token":        "Bearer " + testToken + "x",
		"token prefix":       "Bearer " + testToken[:len(testToken)-1],
		"empty bearer":       "Bearer ",
		"bearer only":        "Bearer",
		"wrong scheme":       "Basic " + testToken,
		"no scheme":          testToken,
		"token with suffix":  "Bearer " + testToken + " extra",
		"case-changed token": "Bearer " + strings.ToUpper(testToken),
	}
	for name, auth := range unauthorized {
		t.Run(name, func(t *testing.T) {
			rec := serve(h, http.MethodGet, auth)
			assert.Equal(t, http.StatusUnauthorized, rec.Code)
			assert.Equal(t, "Bearer", rec.Header().Get("WWW-Authenticate"))
			assertJSONError(t, rec, "UNAUTHENTICATED")
			assert.NotContains(t, rec.Body.String(), "compute_rpc")
		})
	}

	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodHead, http.MethodOptions} {
		t.Run(method+" gives 405", func(t *testing.T) {
			for _, auth := range []string{"", "Bearer " + testToken} {
				rec := serve(h, method, auth)
				assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
				assert.Equal(t, http.MethodGet, rec.Header().Get("Allow"))
				if method != http.MethodHead {
					assertJSONError(t, rec, "METHOD_NOT_ALLOWED")
				}
			}
		})
	}
}

func TestHandlerDisabledFailsClosed(t *testing.T) {
	reg := NewRegistry()
	short := strings.Repeat("x", MinTokenLen-1)
	h := Handler(short, reg)
	for _, auth := range []string{"", "Bearer " + short, "Bearer "} {
		rec := serve(h, http.MethodGet, auth)
		assert.Equal(t, http.StatusNotFound, rec.Code)
		assert.NotContains(t, rec.Body.String(), "go_goroutines")
	}
	rec := serve(Handler(testToken, nil), http.MethodGet, "Bearer "+testToken)
	assert.Equal(t, http.StatusNotFound, rec.Code)
}

func TestHandlerOverHTTP(t *testing.T) {
	reg := NewRegistry()
	mux := http.NewServeMux()
	if Enabled(testToken) {
		mux.Handle(DefaultPath, Handler(testToken, reg))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()

	req, err := http.NewRequest(http.MethodGet, srv.URL+DefaultPath, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "process_")

	resp, err = client.Post(srv.URL+DefaultPath, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET", resp.Header.Get("Allow"))

	resp, err = client.Get(srv.URL + DefaultPath)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, "Bearer", resp.Header.Get("WWW-Authenticate"))
}

func TestBearerToken(t *testing.T) {
	cases := map[string]struct {
		tok string
		ok  bool
	}{
		"Bearer abc":   {"abc", true},
		"BEARER abc":   {"abc", true},
		"Bearer   abc": {"abc", true},
		"Bearer ":      {"", false},
		"Bearer":       {"", false},
		"Bearerabc":    {"", false},
		"Basic abc":    {"", false},
		"":             {"", false},
	}
	for in, want := range cases {
		tok, ok := bearerToken(in)
		assert.Equal(t, want.tok, tok, in)
		assert.Equal(t, want.ok, ok, in)
	}
}
