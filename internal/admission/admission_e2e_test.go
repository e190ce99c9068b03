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

	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

// TestATenantPastItsRateIsRefusedBeforeAnyWork: with admission.tenantRate
// set, a tenant's call past its bucket answers RATE_LIMITED with
// retryAfterMs and Retry-After and writes nothing; another tenant is
// served.
func TestATenantPastItsRateIsRefusedBeforeAnyWork(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "admission: {tenantRate: 0.5, tenantBurst: 2}\n")))
	acme := env.Client(t, withToken(env.Key(t, "acme", "ann", "owner")))
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
	_, err := globex.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
	require.NoError(t, err, "another tenant has its own bucket")

	var n int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(),
		`select count(*) from secrets where reference like 'secret://tenants/acme/%'`).Scan(&n))
	assert.Equal(t, 2, n, "the refused put wrote nothing")

	// Over plain HTTP: the status and the header.
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
