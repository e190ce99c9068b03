package admission_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

// headerRecorder keeps the Retry-After header of the last answer the
// generated client received.
type headerRecorder struct {
	mu         sync.Mutex
	retryAfter string
}

func (h *headerRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		h.mu.Lock()
		h.retryAfter = resp.Header.Get("Retry-After")
		h.mu.Unlock()
	}
	return resp, err
}

func (h *headerRecorder) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.retryAfter
}

// TestATenantPastItsRateIsRefusedBeforeAnyWork: with a bucket of its own
// (admission.tenants), a tenant's call past its bucket answers
// RATE_LIMITED with retryAfterMs and Retry-After through the generated
// client and writes nothing; another tenant, under the default
// admission.tenantRate, is served meanwhile.
func TestATenantPastItsRateIsRefusedBeforeAnyWork(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t,
		"admission: {tenantRate: 100, globalRate: 1000, tenants: {acme: {rate: 0.5, burst: 2}}}\n")))
	rec := &headerRecorder{}
	acme := env.Client(t, withToken(env.Key(t, "acme", "ann", "owner")), computeclient.WithHTTPClient(&http.Client{Transport: rec}))
	globex := env.Client(t, withToken(env.Key(t, "globex", "gus", "owner")))
	put := func(name string) error {
		_, err := acme.SecretsPut(t.Context(), &client.SecretsPutInput{TenantId: "acme", Name: name, Value: "v", IdempotencyKey: name})
		return err
	}
	require.NoError(t, put("one"))
	require.NoError(t, put("two"))
	e := testenv.APIError(t, put("three"))
	assert.Equal(t, "RATE_LIMITED", e.Code)
	require.NotNil(t, e.RetryAfterMs)
	assert.InDelta(t, 2000, *e.RetryAfterMs, 1000, "a token every 2 s")
	assert.Equal(t, "2", rec.last(), "Retry-After in whole seconds, rounded up")
	for i := range 5 {
		_, err := globex.SecretsPut(t.Context(), &client.SecretsPutInput{TenantId: "globex", Name: "g", Value: "v", IdempotencyKey: fmt.Sprint("g", i)})
		require.NoError(t, err, "another tenant has its own bucket")
	}
	var n int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(),
		`select count(*) from secrets where reference like 'secret://tenants/acme/%'`).Scan(&n))
	assert.Equal(t, 2, n, "the refused put wrote nothing")
	// Over plain HTTP, without a credential: refused before the decision.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.APIURL+"/sites/list", strings.NewReader(`{"tenantId":"acme"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Service", "1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
}

// TestACallThatWouldWaitOnThePoolIsShedAtTheQueueBound: every connection
// of the pool is held by puts stuck on a locked row; another put, which
// needs no lock, is refused RATE_LIMITED after the queue bound (50 ms)
// instead of UNAVAILABLE after the store's 2 s wait, and is served again
// once the lock is gone.
func TestACallThatWouldWaitOnThePoolIsShedAtTheQueueBound(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "admission: {maxInFlight: 0, maxQueueMs: 50}\n")))
	c := env.Client(t, withToken(env.Key(t, "acme", "ann", "owner")))
	put := func(name, key string) error {
		_, err := c.SecretsPut(context.Background(), &client.SecretsPutInput{TenantId: "acme", Name: name, Value: "v-" + key, IdempotencyKey: key})
		return err
	}
	require.NoError(t, put("locked", "k0"))
	holder, err := pgx.Connect(t.Context(), env.Store.Pool().Config().ConnString())
	require.NoError(t, err)
	defer holder.Close(context.Background())
	tx, err := holder.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `select 1 from secrets where reference = 'secret://tenants/acme/locked' for update`)
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range int(env.Store.Pool().Config().MaxConns) + 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_ = put("locked", fmt.Sprintf("w%d-%d", w, i)) // holds a connection while it waits for the lock
			}
		})
	}
	var shed time.Duration
	require.Eventually(t, func() bool {
		start := time.Now()
		err := put("free", fmt.Sprint("free-", start.UnixNano()))
		if e, ok := asAPI(err); ok && e.Code == "RATE_LIMITED" {
			shed = time.Since(start)
			require.NotNil(t, e.RetryAfterMs)
			assert.EqualValues(t, 50, *e.RetryAfterMs)
			return true
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "a call that would wait on the pool is shed")
	assert.Less(t, shed, time.Second, "shed at the queue bound, not after the store's 2 s")
	close(stop)
	require.NoError(t, tx.Rollback(t.Context()))
	wg.Wait()
	require.NoError(t, put("free", "after"), "served again once connections are free")
}

// TestCallsBeyondTheInFlightLimitAreShedAtOnce: two calls stuck on a
// locked row hold the process's two slots; a third call, which needs no
// lock, is refused at once instead of queueing, and is served again once
// the slots are free.
func TestCallsBeyondTheInFlightLimitAreShedAtOnce(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "admission: {maxInFlight: 2}\n")))
	c := env.Client(t, withToken(env.Key(t, "acme", "ann", "owner")))
	put := func(key string) error {
		_, err := c.SecretsPut(context.Background(), &client.SecretsPutInput{TenantId: "acme", Name: "locked", Value: "v-" + key, IdempotencyKey: key})
		return err
	}
	require.NoError(t, put("k0"))

	holder, err := pgx.Connect(t.Context(), env.Store.Pool().Config().ConnString())
	require.NoError(t, err)
	defer holder.Close(context.Background())
	tx, err := holder.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `select 1 from secrets where reference = 'secret://tenants/acme/locked' for update`)
	require.NoError(t, err)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_ = put(fmt.Sprintf("w%d-%d", w, i)) // waits for the lock, then UNAVAILABLE
			}
		})
	}
	var shed time.Duration
	require.Eventually(t, func() bool {
		start := time.Now()
		_, err := c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		if e, ok := asAPI(err); ok && e.Code == "RATE_LIMITED" {
			shed = time.Since(start)
			require.NotNil(t, e.RetryAfterMs)
			return true
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "a call beyond the limit is shed")
	assert.Less(t, shed, 500*time.Millisecond, "shed at once, not after a wait")

	close(stop)
	require.NoError(t, tx.Rollback(t.Context()))
	wg.Wait()
	_, err = c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
	require.NoError(t, err, "served again once the slots are free")
}
