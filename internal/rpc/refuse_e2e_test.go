package rpc_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/rpc"
)

// TestRefusalAtTheLimitIsAnsweredBeforeAnyWork: while the in-flight limit
// is reached, a call is answered RATE_LIMITED exactly as the envelope
// answers it (the error envelope with retryAfterMs, Retry-After, the
// request id), the checks that come first in the envelope still come
// first, and the refusal allocates next to nothing: it is decided in
// front of the whole HTTP surface (rpc.Handler.RefuseEarly), not after
// forwarding headers, routing and the envelope's own set-up (27
// allocations a refusal before).
func TestRefusalAtTheLimitIsAnsweredBeforeAnyWork(t *testing.T) {
	s := newRefusedBench(t)
	handler := s.env.Host.Handler()
	url := s.env.Config.BasePath + "/sites/get"
	se, full := s.env.Host.Admission().Full()
	require.True(t, full, "the one slot is held")

	// The answer: WriteError's for the admission's refusal, with the
	// caller's request id.
	req := s.request(url)
	req.Header.Set("X-Request-Id", "caller-1")
	got := httptest.NewRecorder()
	handler.ServeHTTP(got, req)
	want := httptest.NewRecorder()
	want.Header().Set("X-Request-Id", "caller-1")
	rpc.WriteError(want, slog.New(slog.DiscardHandler), se)
	assert.Equal(t, http.StatusTooManyRequests, got.Code)
	assert.Equal(t, want.Header(), got.Header())
	assert.Equal(t, want.Body.String(), got.Body.String())
	var body struct {
		Error struct {
			Code         string `json:"code"`
			RetryAfterMs int64  `json:"retryAfterMs"`
		} `json:"error"`
		RetryAfterMs int64 `json:"retryAfterMs"`
	}
	require.NoError(t, json.Unmarshal(got.Body.Bytes(), &body))
	assert.Equal(t, "RATE_LIMITED", body.Error.Code)
	assert.Positive(t, body.RetryAfterMs)
	assert.Equal(t, body.RetryAfterMs, body.Error.RetryAfterMs)
	assert.NotEmpty(t, got.Header().Get("Retry-After"))

	// Without a request id, one is generated.
	got = httptest.NewRecorder()
	handler.ServeHTTP(got, s.request(url))
	assert.Equal(t, http.StatusTooManyRequests, got.Code)
	assert.Regexp(t, regexp.MustCompile(`^req_[0-9a-hjkmnp-tv-z]{26}$`), got.Header().Get("X-Request-Id"))

	// What the envelope checks before admission is still answered first.
	codeOf := func(r *http.Request) string {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		var b struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		return b.Error.Code
	}
	assert.Equal(t, "NOT_FOUND", codeOf(s.request(s.env.Config.BasePath+"/sites/nosuch")))
	noService := s.request(url)
	noService.Header.Del("X-Service")
	assert.Equal(t, "CSRF_REJECTED", codeOf(noService))
	wrongType := s.request(url)
	wrongType.Header.Set("Content-Type", "text/plain")
	assert.Equal(t, "CSRF_REJECTED", codeOf(wrongType))
	get := s.request(url)
	get.Method = http.MethodGet
	assert.Equal(t, "METHOD_NOT_ALLOWED", codeOf(get))

	// Next to nothing allocated per refusal: the request id and its
	// header value, and the writer's own.
	req = s.request(url)
	req.Body = io.NopCloser(bytes.NewReader(s.body)) // never read by a refusal
	w := &discardWriter{h: http.Header{}}
	allocs := testing.AllocsPerRun(200, func() {
		clear(w.h)
		w.status = 0
		handler.ServeHTTP(w, req)
	})
	assert.Equal(t, http.StatusTooManyRequests, w.status)
	assert.LessOrEqual(t, allocs, 4.0, "allocations per refusal")
	t.Logf("%.0f allocations per refusal", allocs)
}
