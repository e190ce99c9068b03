package admission_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/admission"
	"computeplane/internal/testenv"
)

// lockSecret writes secret name of acme and holds its row locked until
// the test ends: puts of it then hold their connection (and their
// in-flight slot) while they wait for the lock.
func lockSecret(t *testing.T, env *testenv.Env, put func(name, key string) error, name string) {
	t.Helper()
	require.NoError(t, put(name, "k0"))
	holder, err := pgx.Connect(t.Context(), env.Store.Pool().Config().ConnString())
	require.NoError(t, err)
	tx, err := holder.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()); holder.Close(context.Background()) })
	_, err = tx.Exec(t.Context(), `select 1 from secrets where reference = 'secret://tenants/acme/'||$1 for update`, name)
	require.NoError(t, err)
}

// hammer runs n goroutines calling f in a loop until the returned stop is
// called (which waits for them).
func hammer(n int, f func(w, i int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				f(w, i)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// rawPost sends body to url over plain HTTP with the envelope's
// headers and returns the status, the Retry-After header and the body.
func rawPost(t *testing.T, hc *http.Client, url, token, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Service", "1")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// TestTheAcquireWaitLimitRefusesBeforeAnyWork: every connection of the
// pool is held by puts stuck on a locked row, and more puts wait for a
// connection until the queue bound sheds them (50 ms, past the 1 ms
// target): the adaptive limit comes down from its ceiling (above every
// call the test makes) to the calls in flight, and the next call is
// refused (in front of the envelope while the limit is reached,
// rpc.Handler.RefuseEarly; the envelope's own check answers the same for
// a call that raced it), RATE_LIMITED with retryAfterMs and
// Retry-After through the generated client, before its body is read (a
// malformed one is refused, not answered INVALID_INPUT) and with nothing
// written. Once the lock is gone the acquires are quick again and the
// limit grows back: calls are served. With a fixed limit at the same
// ceiling nothing would be refused.
func TestTheAcquireWaitLimitRefusesBeforeAnyWork(t *testing.T) {
	t.Parallel()
	const ceiling = 256
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, fmt.Sprintf(
		"admission: {adaptive: true, maxInFlight: %d, minInFlight: 1, acquireTargetMs: 1, maxQueueMs: 50}\n", ceiling))))
	conns := int(env.Store.Pool().Config().MaxConns)
	require.Less(t, 2*conns, ceiling, "the test's calls stay below the ceiling")
	token := env.Key(t, "acme", "ann", "owner")
	rec := &headerRecorder{}
	c := env.Client(t, withToken(token), computeclient.WithHTTPClient(&http.Client{Transport: rec}))
	put := func(name, key string) error {
		_, err := c.SecretsPut(context.Background(), &client.SecretsPutInput{TenantId: "acme", Name: name, Value: "v-" + key, IdempotencyKey: key})
		return err
	}
	lockSecret(t, env, put, "locked")
	require.Equal(t, ceiling, env.Host.Admission().Limit(), "the limit starts at its ceiling")

	stuck := env.Client(t, withToken(token))
	stop := hammer(2*conns, func(w, i int) {
		_, err := stuck.SecretsPut(context.Background(), &client.SecretsPutInput{TenantId: "acme", Name: "locked", Value: "v", IdempotencyKey: fmt.Sprintf("w%d-%d", w, i)})
		if e, ok := asAPI(err); ok && e.Code == "RATE_LIMITED" {
			time.Sleep(10 * time.Millisecond)
		}
	})
	var refusal *computeclient.Error
	var refused string // the name of the refused put
	require.Eventually(t, func() bool {
		name := fmt.Sprint("fresh-", time.Now().UnixNano())
		err := put(name, name)
		if e, ok := asAPI(err); ok && e.Code == "RATE_LIMITED" && strings.Contains(e.Message, "calls in flight") {
			refusal, refused = e, name
			return true
		}
		return false
	}, 20*time.Second, 5*time.Millisecond, "the limit came down to the calls in flight")
	require.NotNil(t, refusal.RetryAfterMs)
	assert.EqualValues(t, admission.InFlightRetryAfter.Milliseconds(), *refusal.RetryAfterMs)
	assert.Equal(t, "1", rec.last(), "Retry-After in whole seconds, rounded up")
	assert.Less(t, env.Host.Admission().Limit(), 2*conns, "the limit followed the waits down")

	// Before the body is read: a malformed one is refused all the same.
	var status int
	var retryAfter, body string
	require.Eventually(t, func() bool {
		status, retryAfter, body = rawPost(t, http.DefaultClient, env.APIURL+"/secrets/put", token, `{"tenantId": "acme", "name": `)
		return status == http.StatusTooManyRequests
	}, 10*time.Second, 5*time.Millisecond, "last: %d %s", status, body)
	assert.Contains(t, body, "RATE_LIMITED")
	assert.Equal(t, "1", retryAfter)

	stop()
	var n int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(),
		`select count(*) from secrets where reference = 'secret://tenants/acme/'||$1`, refused).Scan(&n))
	assert.Zero(t, n, "the refused put wrote nothing")
	require.Eventually(t, func() bool {
		_, err := c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "served again once acquires are quick")
}

// slowConn sends each write's first byte, then the rest after a delay:
// the server's arrival time of a request (the kernel's receive time of its
// first bytes, admission.ArrivalListener) is that delay before the request
// is whole, as if it had waited that long in the socket. The delay grows
// by 1 ms per write (writes counts them), from 40 ms: a queue that stands
// and grows, which the check judges as such in every interval.
type slowConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c slowConn) Write(p []byte) (int, error) {
	if len(p) < 2 {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(p[:1]); err != nil {
		return 0, err
	}
	time.Sleep(40*time.Millisecond + time.Duration(min(c.writes.Add(1), 500))*time.Millisecond)
	n, err := c.Conn.Write(p[1:])
	return n + 1, err
}

// TestTheWaitCheckRefusesOnTheEarlyPath: with the wait check on
// (queueTargetMs 5) and a call in flight, requests that each waited 40 ms
// and more between their first byte and the rest (a queue before
// admission, as the server sees it) make a queue stand; after two
// intervals a share of them
// is refused in front of the envelope (rpc.Handler.RefuseEarly,
// admission.CheckWaitOf): RATE_LIMITED with retryAfterMs and Retry-After
// through the generated client, and a malformed body refused rather than
// answered INVALID_INPUT, so before the body is read.
func TestTheWaitCheckRefusesOnTheEarlyPath(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "admission: {maxInFlight: 0, queueTargetMs: 5}\n")))
	// testenv's server does not time arrivals: serve the same handler on
	// a listener that does, as the host does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: env.Host.Handler(), ConnContext: admission.ArrivalContext, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(admission.ArrivalListener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String() + env.Config.BasePath
	var writes atomic.Int64
	slow := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return slowConn{Conn: conn, writes: &writes}, nil
	}}
	t.Cleanup(slow.CloseIdleConnections)
	token := env.Key(t, "acme", "ann", "owner")
	rec := &headerRecorder{}
	c, err := computeclient.New(url, withToken(token), computeclient.WithHTTPClient(&http.Client{Transport: &recordingTransport{rt: slow, rec: rec}}))
	require.NoError(t, err)
	put := func(name, key string) error {
		_, err := env.Client(t, withToken(token)).SecretsPut(context.Background(), &client.SecretsPutInput{TenantId: "acme", Name: name, Value: "v-" + key, IdempotencyKey: key})
		return err
	}
	lockSecret(t, env, put, "locked")
	holdOne := hammer(1, func(w, i int) { _ = put("locked", fmt.Sprint("held-", i)) }) // a call in flight
	defer holdOne()

	var refusal *computeclient.Error
	var mu sync.Mutex
	stopLate := hammer(8, func(int, int) { // calls that each waited 40 ms
		_, err := c.SitesList(context.Background(), &client.SitesListInput{TenantId: "acme"})
		if e, ok := asAPI(err); ok && e.Code == "RATE_LIMITED" {
			mu.Lock()
			refusal = e
			mu.Unlock()
		}
	})
	defer stopLate()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return refusal != nil }, 20*time.Second, 10*time.Millisecond,
		"a share of the late calls is refused")
	mu.Lock()
	assert.Contains(t, refusal.Message, "waited more than 5 ms")
	require.NotNil(t, refusal.RetryAfterMs)
	assert.EqualValues(t, admission.InFlightRetryAfter.Milliseconds(), *refusal.RetryAfterMs)
	mu.Unlock()
	assert.Equal(t, "1", rec.last(), "Retry-After in whole seconds, rounded up")

	hc := &http.Client{Transport: slow}
	var status int
	var retryAfter, body string
	require.Eventually(t, func() bool {
		status, retryAfter, body = rawPost(t, hc, url+"/sites/list", token, `{"tenantId": `)
		return status == http.StatusTooManyRequests
	}, 20*time.Second, time.Millisecond, "last: %d %s", status, body)
	assert.Contains(t, body, "waited more than 5 ms")
	assert.Equal(t, "1", retryAfter)
}

// recordingTransport keeps, in rec, the Retry-After of the last 429 that
// rt received.
type recordingTransport struct {
	rt  http.RoundTripper
	rec *headerRecorder
}

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		r.rec.mu.Lock()
		r.rec.retryAfter = resp.Header.Get("Retry-After")
		r.rec.mu.Unlock()
	}
	return resp, err
}
