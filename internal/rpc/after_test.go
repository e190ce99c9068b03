package rpc

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/uow"
)

// deleter answers secrets.delete without a store: a mutation that commits.
type deleter struct {
	api.UnimplementedSecretsService
}

func (deleter) Delete(context.Context, *api.SecretsDeleteInput) (*api.SecretDeleted, error) {
	return &api.SecretDeleted{Deleted: true}, nil
}

// TestAMutationIsAnsweredBeforeItsWakes: a committed mutation that does not
// wait is written to the caller (with its length, not chunked) before
// AfterCommit runs, so the work its wakes start does not delay the answer.
// Here AfterCommit waits for the caller to have read the whole answer: run
// before the answer, it would wait its 5 s out and the answer would come
// after it.
func TestAMutationIsAnsweredBeforeItsWakes(t *testing.T) {
	read := make(chan struct{})
	woke := make(chan bool, 1)
	h := &Handler{Services: &api.Services{Secrets: deleter{}}, Store: noTx{},
		AfterCommit: func(context.Context, *Call, *uow.Unit) {
			select {
			case <-read:
				woke <- true
			case <-time.After(5 * time.Second):
				woke <- false
			}
		}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/secrets/delete",
		strings.NewReader(`{"tenantId": "acme", "name": "db-password"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderService, "1")
	start := time.Now()
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	close(read)
	assert.Less(t, time.Since(start), 4*time.Second, "answered without waiting for AfterCommit")
	assert.Equal(t, http.StatusOK, res.StatusCode, string(body))
	assert.JSONEq(t, `{"data": {"deleted": true}}`, string(body))
	assert.Equal(t, strconv.Itoa(len(body)), res.Header.Get("Content-Length"))
	assert.Empty(t, res.TransferEncoding)
	assert.True(t, <-woke, "AfterCommit ran, after the answer was read")
}
