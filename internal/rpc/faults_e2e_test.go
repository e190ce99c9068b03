package rpc_test

// Faults of the database, through the HTTP API (issue 9, defects 8 and 9):
// a call that reaches a database that is restarting, that terminated its
// session, or that holds the row it needs locked elsewhere answers
// UNAVAILABLE with retryAfterMs, never INTERNAL_ERROR; the service comes
// back by itself within seconds; and a held row lock stalls only the calls
// that need that row, while other calls, /readyz and the workers' leases
// carry on.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/dbtest"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
)

// outcomes tallies the answers of calls made under a fault: successes,
// UNAVAILABLE answers (each must carry a retry hint) and anything else.
type outcomes struct {
	ok, unavailable atomic.Int64
	mu              sync.Mutex
	other           []string
}

func (o *outcomes) record(err error) {
	if err == nil {
		o.ok.Add(1)
		return
	}
	e, isAPI := computeclient.AsError(err)
	if isAPI && e.Code == "UNAVAILABLE" && e.Status == http.StatusServiceUnavailable && e.RetryAfterMs != nil && *e.RetryAfterMs > 0 {
		o.unavailable.Add(1)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.other = append(o.other, err.Error())
}

func (o *outcomes) others() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.other...)
}

// hammer calls fn from n goroutines until stop is closed.
func hammer(n int, stop <-chan struct{}, fn func()) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				fn()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	return &wg
}

func boundedClient(t *testing.T, env *testenv.Env, token string) *computeclient.Client {
	return env.Client(t, computeclient.WithToken(token), computeclient.WithHTTPClient(&http.Client{Timeout: 20 * time.Second}))
}

func TestDatabaseRestartAndTerminatedBackendsAnswerOnlyUnavailable(t *testing.T) {
	t.Parallel()
	cluster := dbtest.NewCluster(t)
	st, err := store.Open(t.Context(), cluster.URL())
	require.NoError(t, err)
	require.NoError(t, st.Migrate(t.Context()))
	env := testenv.Start(t, testenv.WithStore(st))
	c := boundedClient(t, env, env.Key(t, "acme", "ann", "owner"))
	site, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "restart-1",
	})
	require.NoError(t, err)
	get := func() error {
		_, err := c.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: site.Data.SiteId})
		return err
	}
	write := func(i int64) error {
		_, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
			TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west",
			IdempotencyKey: fmt.Sprintf("load-%d", i),
		})
		return err
	}

	var res outcomes
	var writes atomic.Int64
	stop := make(chan struct{})
	load := hammer(4, stop, func() { res.record(get()) })
	writers := hammer(2, stop, func() { res.record(write(writes.Add(1))) })

	time.Sleep(300 * time.Millisecond)
	cluster.Restart(time.Second)
	recovered := waitForSuccess(t, get, 10*time.Second)
	t.Logf("restart: served again %v after the cluster was back", recovered)

	// Terminate every session of the service, three times, under load.
	admin, err := pgx.Connect(t.Context(), cluster.URL())
	require.NoError(t, err)
	defer admin.Close(context.Background())
	for range 3 {
		_, err := admin.Exec(t.Context(), `select pg_terminate_backend(pid) from pg_stat_activity
			where backend_type = 'client backend' and pid <> pg_backend_pid()`)
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
	}
	recovered = waitForSuccess(t, get, 10*time.Second)
	t.Logf("terminated backends: served again after %v", recovered)
	close(stop)
	load.Wait()
	writers.Wait()

	assert.Empty(t, res.others(), "every answer under the faults is a success or UNAVAILABLE with retryAfterMs")
	assert.Positive(t, res.unavailable.Load(), "the faults were seen by some calls")
	assert.Positive(t, res.ok.Load())
	t.Logf("ok %d, unavailable %d", res.ok.Load(), res.unavailable.Load())

	// Nothing half-done: every site a call reported created exists, and
	// the audit holds one row per site (no audit row of a rolled-back call).
	var sites, audited int
	require.NoError(t, admin.QueryRow(t.Context(), `select count(*) from sites`).Scan(&sites))
	require.NoError(t, admin.QueryRow(t.Context(),
		`select count(distinct resource_id) from audit_log where method = 'sites.create'`).Scan(&audited))
	assert.Equal(t, sites, audited, "one audit row per site created")
}

// waitForSuccess calls fn until it succeeds and returns how long that took.
func waitForSuccess(t *testing.T, fn func() error, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < within {
		if err = fn(); err == nil {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err, "the service did not recover within %v", within)
	return 0
}

func TestHeldRowLockStallsOnlyTheCallsThatNeedTheRow(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := boundedClient(t, env, env.Key(t, "acme", "ann", "owner"))
	put := func(name, key string) error {
		_, err := c.SecretsPut(t.Context(), &client.SecretsPutInput{TenantId: "acme", Name: name, Value: "v-" + key, IdempotencyKey: key})
		return err
	}
	require.NoError(t, put("locked", "k0"))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runner := env.Host.Workers()
	require.NotNil(t, runner)
	require.NoError(t, runner.Start(ctx))
	defer func() { _ = runner.Stop(context.Background()) }()
	require.Eventually(t, func() bool { return len(runner.Held()) > 0 }, 10*time.Second, 50*time.Millisecond)
	before := runner.Held()

	// Another session takes the secret's row and sits on it, idle in
	// transaction, as a stuck client would.
	holder, err := pgx.Connect(t.Context(), env.Store.Pool().Config().ConnString())
	require.NoError(t, err)
	defer holder.Close(context.Background())
	tx, err := holder.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `select 1 from secrets where reference = 'secret://tenants/acme/locked' for update`)
	require.NoError(t, err)

	var blocked, others outcomes
	var n atomic.Int64
	stop := make(chan struct{})
	// More callers on the locked row than the pool has connections, each
	// retrying as soon as it is answered.
	onRow := hammer(int(env.Store.Pool().Config().MaxConns)+2, stop, func() {
		start := time.Now()
		err := put("locked", fmt.Sprintf("k%d", n.Add(1)))
		blocked.record(err)
		if err == nil {
			blocked.record(fmt.Errorf("a put succeeded while its row was locked"))
		} else if d := time.Since(start); d > 5*time.Second {
			blocked.record(fmt.Errorf("a put waited %v for the lock", d))
		}
	})
	offRow := hammer(2, stop, func() {
		_, err := c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		others.record(err)
		others.record(put("other", fmt.Sprintf("o%d", n.Add(1))))
	})
	ready := hammer(1, stop, func() {
		resp, err := http.Get(env.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("/readyz answered %d", resp.StatusCode)
			}
		}
		others.record(err)
	})
	time.Sleep(8 * time.Second)
	close(stop)
	onRow.Wait()
	offRow.Wait()
	ready.Wait()

	assert.Empty(t, blocked.others(), "calls on the locked row answer UNAVAILABLE with retryAfterMs, in bounded time")
	assert.Zero(t, blocked.ok.Load())
	assert.Positive(t, blocked.unavailable.Load())
	assert.Empty(t, others.others(), "calls that do not need the row, and /readyz, are served")
	assert.Positive(t, others.ok.Load())
	assert.Zero(t, others.unavailable.Load(), "no unrelated call was shed")
	after := runner.Held()
	for _, l := range before {
		assert.Contains(t, after, l, "lease %s kept with its epoch", l.Name)
	}

	require.NoError(t, tx.Rollback(t.Context()))
	assert.NoError(t, put("locked", "after"), "the row serves again once released")
}
