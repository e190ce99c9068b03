package rpc

import (
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

// A refusal answered from the cache is the answer WriteError writes, byte
// for byte and header for header, the first time and after; other errors
// are left to WriteError.
func TestWriteShedIsWriteErrorsAnswer(t *testing.T) {
	for _, ms := range []int64{50, 2500} {
		se := api.Errorf(api.CodeRateLimited, "the server is at its limit of %d calls in flight; retry later", 8).
			WithDetails(map[string]any{"retryAfterMs": ms})
		want := httptest.NewRecorder()
		WriteError(want, slog.New(slog.DiscardHandler), se)
		for range 2 {
			got := httptest.NewRecorder()
			require.True(t, writeShed(got, se))
			assert.Equal(t, want.Code, got.Code)
			assert.Equal(t, want.Body.String(), got.Body.String())
			assert.Equal(t, want.Header(), got.Header())
		}
	}
	assert.False(t, writeShed(httptest.NewRecorder(), api.Errorf(api.CodeNotFound, "no")))
	assert.False(t, writeShed(httptest.NewRecorder(), api.Errorf(api.CodeRateLimited, "no hint")))
	assert.False(t, writeShed(httptest.NewRecorder(), api.Errorf(api.CodeRateLimited, "more").
		WithDetails(map[string]any{"retryAfterMs": 5, "other": 1})))
}
