package webhooks_test

// Delivery: the specification's delivery state table, Events rules 3 and 4,
// Standard Webhooks signatures checked with the reference library, the
// retry schedule on an injected clock, 410 Gone, Retry-After, claims that
// come back, the in-flight bounds and the isolation of tenants. The API
// runs in testenv; FanOut and Deliver are called directly (or through Run).

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/metrics"
	"computeplane/internal/outbox"
	"computeplane/internal/webhooks"
)

const private = "{allowPrivateTargets: true}"

// verify checks a request with the Standard Webhooks reference library.
func verify(t *testing.T, secret string, r received) error {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	return wh.Verify(r.body, r.header)
}

func TestDeliveryIsSignedPerStandardWebhooks(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	reg := metrics.NewRegistry()
	e := f.engine(t, nil, webhooks.EngineOptions{Metrics: reg})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "site.*")
	siteID := publishSite(t, f.acme, "acme")

	f.fanOut(t, e)
	ds := deliveries(t, f.acme, "acme", w.Webhook.WebhookId)
	require.Len(t, ds, 1)
	d := ds[0]
	assert.Equal(t, "site.created", d.EventType)
	assert.Equal(t, client.DeliveryStatePending, d.State)
	require.Equal(t, 1, deliver(t, e))

	got := rc.requests()
	require.Len(t, got, 1)
	r := got[0]
	require.NoError(t, verify(t, w.Secret, r), "the reference library verifies it")
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	assert.Equal(t, d.DeliveryId, r.header.Get("webhook-id"))
	assert.Equal(t, d.DeliveryId, r.header.Get("X-Service-Delivery"))
	assert.WithinDuration(t, time.Now(), time.Unix(mustInt(t, r.header.Get("webhook-timestamp")), 0), 5*time.Second)
	assert.Regexp(t, `^v1,[A-Za-z0-9+/]{43}=$`, r.header.Get("webhook-signature"), "one signature")

	// The body is the event's CloudEvents envelope.
	var ev outbox.CloudEvent
	require.NoError(t, json.Unmarshal(r.body, &ev))
	assert.Equal(t, "1.0", ev.SpecVersion)
	assert.Equal(t, "site.created", ev.Type)
	assert.Equal(t, siteID, ev.Subject)
	assert.Equal(t, "acme", ev.TenantID)
	assert.Equal(t, "computeplane/sites", ev.Source)
	assert.Equal(t, d.EventId, ev.ID)
	assert.JSONEq(t, `{"siteId":"`+siteID+`","kind":"custom","region":"eu-west","iamRegion":"eu-west","version":1}`, string(ev.Data))

	// A tampered body, another secret or a stale timestamp do not verify.
	tampered := r
	tampered.body = []byte(strings.Replace(string(r.body), "eu-west", "us-east", 1))
	assert.Error(t, verify(t, w.Secret, tampered))
	other := mustCreate(t, f.acme, "acme", rc.URL(), "node.*")
	assert.Error(t, verify(t, other.Secret, r))

	done := delivery(t, f.acme, "acme", w.Webhook.WebhookId, d.DeliveryId)
	assert.Equal(t, client.DeliveryStateDelivered, done.State)
	assert.Equal(t, int64(1), done.Attempts)
	assert.Equal(t, int64(200), done.LastStatus.Value)
	assert.True(t, done.NextAttemptAt.Null)
	assert.False(t, done.LastAttemptAt.Null)

	// Metrics: the delivery and its lag.
	families, err := reg.Prometheus().Gather()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, mf := range families {
		seen[mf.GetName()] = true
	}
	assert.True(t, seen[webhooks.MetricDeliveries])
	assert.True(t, seen[webhooks.MetricLagSeconds])
	assert.True(t, seen[webhooks.MetricFannedOut])
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// During a rotation overlap both secrets sign, each verifying on its own;
// once the overlap ends, or with keepPreviousSeconds 0, only the new one.
func TestRotationOverlapSignsWithBothSecrets(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*")
	id := w.Webhook.WebhookId
	rotate := func(keep int64) string {
		res, err := f.acme.WebhooksRotateSecret(t.Context(), &client.WebhooksRotateSecretInput{TenantId: "acme", WebhookId: id, KeepPreviousSeconds: client.NewOptInt64(keep)})
		require.NoError(t, err)
		return res.Data.Secret
	}
	ping := func() received {
		t.Helper()
		_, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: id})
		require.NoError(t, err)
		before := len(rc.requests())
		require.Equal(t, 1, deliver(t, e))
		got := rc.requests()
		require.Len(t, got, before+1)
		return got[len(got)-1]
	}

	old := w.Secret
	r := ping()
	require.NoError(t, verify(t, old, r))

	// Overlap of 2 s: both sign.
	mid := rotate(2)
	r = ping()
	assert.Len(t, strings.Split(r.header.Get("webhook-signature"), " "), 2)
	require.NoError(t, verify(t, old, r), "the old secret verifies during the overlap")
	require.NoError(t, verify(t, mid, r), "the new one too")

	// After the overlap the old one stops.
	time.Sleep(2100 * time.Millisecond)
	r = ping()
	assert.Len(t, strings.Split(r.header.Get("webhook-signature"), " "), 1)
	assert.ErrorIs(t, verify(t, old, r), standardwebhooks.ErrNoMatchingSignature, "the old secret no longer verifies")
	require.NoError(t, verify(t, mid, r))

	// keepPreviousSeconds 0: the old one stops at once.
	last := rotate(0)
	r = ping()
	assert.ErrorIs(t, verify(t, mid, r), standardwebhooks.ErrNoMatchingSignature)
	require.NoError(t, verify(t, last, r))

	// A rotation during an overlap keeps only the latest previous secret.
	next := rotate(3600)
	newest := rotate(3600)
	r = ping()
	require.NoError(t, verify(t, newest, r))
	require.NoError(t, verify(t, next, r))
	assert.Error(t, verify(t, last, r))
}

// Events rule 4 and the state table's first row: only matching events the
// webhook's tenant commits after the webhook was written, while it is
// active.
func TestOnlyMatchingEventsCommittedAfterCreationAreDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{})
	ctx := context.Background()

	before := f.publish(t, "acme", "site.created", "before")
	// A transaction that has written its event and commits after the
	// webhook is created: committed after creation, so delivered.
	open, err := f.env.Store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	require.NoError(t, outbox.Write(ctx, open, outbox.Event{Type: "site.updated", Subject: "in-flight", TenantID: "acme", Data: map[string]string{}}))

	all := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	family := mustCreate(t, f.acme, "acme", rc.URL(), "site.*").Webhook
	exact := mustCreate(t, f.acme, "acme", rc.URL(), "site.deleted").Webhook
	nodes := mustCreate(t, f.acme, "acme", rc.URL(), "node.*").Webhook
	require.NoError(t, open.Commit(ctx))

	after := f.publish(t, "acme", "site.created", "after")
	deleted := f.publish(t, "acme", "site.deleted", "gone")
	cordoned := f.publish(t, "acme", "node.cordoned", "n1")
	f.publish(t, "globex", "site.created", "other-tenant")
	var inFlight string
	require.NoError(t, f.env.Store.Pool().QueryRow(ctx, "SELECT id FROM outbox WHERE subject = 'in-flight'").Scan(&inFlight))

	f.fanOut(t, e)
	events := func(w client.Webhook) []string {
		var out []string
		for _, d := range deliveries(t, f.acme, "acme", w.WebhookId) {
			out = append(out, d.EventId)
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	assert.Equal(t, sorted(inFlight, after, deleted, cordoned), events(all))
	assert.Equal(t, sorted(inFlight, after, deleted), events(family))
	assert.Equal(t, sorted(deleted), events(exact))
	assert.Equal(t, sorted(cordoned), events(nodes))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE event_id = $1", before), "committed before creation")

	// Delivered once each; a second fan-out adds nothing.
	assert.Equal(t, 9, deliver(t, e))
	assert.Len(t, rc.requests(), 9)
	f.fanOut(t, e)
	assert.Zero(t, deliver(t, e))
	assert.Equal(t, 9, f.count(t, "SELECT count(*) FROM webhook_deliveries"))

	// Paused: nothing; re-activated: only what commits after.
	_, err = update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: all.WebhookId, Active: client.NewOptBool(false)})
	require.NoError(t, err)
	whilePaused := f.publish(t, "acme", "site.created", "paused")
	f.fanOut(t, e) // the fan-out has not seen it yet when the webhook comes back
	_, err = f.env.Store.Pool().Exec(ctx, "UPDATE webhook_fanout SET after_xid = '0', after_seq = 0")
	require.NoError(t, err)
	_, err = update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: all.WebhookId, Active: client.NewOptBool(true)})
	require.NoError(t, err)
	resumed := f.publish(t, "acme", "site.created", "resumed")
	f.fanOut(t, e)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND event_id = $2", all.WebhookId, whilePaused))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND event_id = $2", all.WebhookId, resumed))
	// 9 before, then paused and resumed for site.*, resumed for *.
	assert.Equal(t, 12, f.count(t, "SELECT count(*) FROM webhook_deliveries"), "re-reading the outbox made no duplicates")
}

// The fence runs in every write transaction: when it fails nothing is
// written and the fan-out's cursor stays.
func TestFenceGuardsEveryWrite(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{})
	mustCreate(t, f.acme, "acme", rc.URL(), "*")
	publishSite(t, f.acme, "acme")
	lost := errors.New("lease lost")
	var calls atomic.Int32
	fence := func(ctx context.Context, tx pgx.Tx) error {
		calls.Add(1)
		var one int
		if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			return err
		}
		return lost
	}
	require.Eventually(t, func() bool {
		_, err := e.FanOut(context.Background(), fence, 100)
		return errors.Is(err, lost)
	}, 5*time.Second, 5*time.Millisecond)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries"))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM webhook_fanout WHERE after_seq = 0"))
	f.fanOut(t, e)
	_, err := e.Deliver(context.Background(), fence, 10)
	assert.ErrorIs(t, err, lost)
	assert.Equal(t, 0, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE claimed_until IS NOT NULL"))
	assert.Empty(t, rc.requests())
	assert.GreaterOrEqual(t, calls.Load(), int32(2))
}

// The retry schedule on an injected clock: 5 s, 5 min, 30 min, 2 h, 5 h,
// 10 h, 14 h, 20 h, 24 h, then dead with the last status kept.
func TestRetryScheduleThenDead(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	rc.status(http.StatusInternalServerError)
	clk := &clock{}
	e := f.engine(t, clk, webhooks.EngineOptions{Rand: func() float64 { return 0.5 }}) // jitter at its middle: exact waits
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	publishSite(t, f.acme, "acme")
	f.fanOut(t, e)
	id := deliveries(t, f.acme, "acme", w.WebhookId)[0].DeliveryId
	var nextAt []time.Duration
	for attempt := 1; attempt <= 10; attempt++ {
		require.Equal(t, 1, deliver(t, e), "attempt %d", attempt)
		d := delivery(t, f.acme, "acme", w.WebhookId, id)
		assert.Equal(t, int64(attempt), d.Attempts)
		assert.Equal(t, int64(500), d.LastStatus.Value)
		if attempt == 10 {
			assert.Equal(t, client.DeliveryStateDead, d.State, "dead after every attempt failed")
			assert.True(t, d.NextAttemptAt.Null)
			break
		}
		assert.Equal(t, client.DeliveryStatePending, d.State)
		wait := d.NextAttemptAt.Value.Sub(clk.Now())
		nextAt = append(nextAt, wait)
		assert.InDelta(t, float64(webhooks.Backoff[attempt-1]), float64(wait), float64(2*time.Second), "attempt %d", attempt)
		// Not due before its time.
		clk.Advance(wait - time.Second)
		assert.Zero(t, deliver(t, e), "not yet due after attempt %d", attempt)
		clk.Advance(time.Second + time.Millisecond)
	}
	assert.Len(t, rc.requests(), 10)
	assert.Zero(t, deliver(t, e), "a dead delivery is not tried again")

	// Jitter: ±10 % around the schedule.
	jittery := f.engine(t, clk, webhooks.EngineOptions{})
	rc2 := newReceiver(t)
	rc2.status(http.StatusBadGateway)
	w2 := mustCreate(t, f.acme, "acme", rc2.URL(), "*").Webhook
	for range 20 {
		_, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w2.WebhookId})
		require.NoError(t, err)
	}
	deliver(t, jittery)
	var waits []float64
	for _, d := range deliveries(t, f.acme, "acme", w2.WebhookId) {
		require.Equal(t, client.DeliveryStatePending, d.State)
		waits = append(waits, d.NextAttemptAt.Value.Sub(d.LastAttemptAt.Value).Seconds())
	}
	require.Len(t, waits, 20)
	sort.Float64s(waits)
	assert.GreaterOrEqual(t, waits[0], 4.5)
	assert.LessOrEqual(t, waits[len(waits)-1], 5.5)
	assert.Greater(t, waits[len(waits)-1]-waits[0], 0.05, "spread, not one value")
}

// 410 Gone pauses the webhook and cancels its pending deliveries.
func TestGonePausesTheWebhook(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{PerWebhook: 1})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	rc.status(http.StatusGone)
	for range 3 {
		publishSite(t, f.acme, "acme")
	}
	f.fanOut(t, e)
	require.Equal(t, 1, deliver(t, e), "one in flight per webhook here")
	got, err := f.acme.WebhooksGet(t.Context(), &client.WebhooksGetInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	assert.False(t, got.Data.Active, "paused")
	assert.Equal(t, int64(2), got.Data.Version)
	ds := deliveries(t, f.acme, "acme", w.WebhookId)
	require.Len(t, ds, 3)
	statuses := map[int64]int{}
	for _, d := range ds {
		assert.Equal(t, client.DeliveryStateCancelled, d.State)
		statuses[d.LastStatus.Or(0)]++
	}
	assert.Equal(t, map[int64]int{410: 1, 0: 2}, statuses, "the 410 kept on the one that got it")
	// Paused: new events make no deliveries; a ping is cancelled by the worker.
	publishSite(t, f.acme, "acme")
	f.fanOut(t, e)
	assert.Len(t, deliveries(t, f.acme, "acme", w.WebhookId), 3)
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	assert.Equal(t, client.DeliveryStatePending, ping.Data.State)
	assert.Zero(t, deliver(t, e))
	assert.Equal(t, client.DeliveryStateCancelled, delivery(t, f.acme, "acme", w.WebhookId, ping.Data.DeliveryId).State)
	assert.Len(t, rc.requests(), 1)
	// Redeliver is NOT_FOUND while paused.
	_, err = f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: ping.Data.DeliveryId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
}

// 429 and 503 wait what Retry-After asks instead of the schedule.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	clk := &clock{}
	e := f.engine(t, clk, webhooks.EngineOptions{Rand: func() float64 { return 0.5 }})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	ping := func() string {
		res, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
		require.NoError(t, err)
		return res.Data.DeliveryId
	}
	wait := func(id string) time.Duration {
		d := delivery(t, f.acme, "acme", w.WebhookId, id)
		require.Equal(t, client.DeliveryStatePending, d.State)
		return d.NextAttemptAt.Value.Sub(d.LastAttemptAt.Value)
	}

	rc.respond(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	a := ping()
	require.Equal(t, 1, deliver(t, e))
	assert.InDelta(t, float64(120*time.Second), float64(wait(a)), float64(time.Second), "429 Retry-After: 120")
	assert.Equal(t, int64(429), delivery(t, f.acme, "acme", w.WebhookId, a).LastStatus.Value)

	rc.respond(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", clk.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	b := ping()
	require.Equal(t, 1, deliver(t, e))
	assert.InDelta(t, float64(time.Hour), float64(wait(b)), float64(2*time.Second), "503 Retry-After as a date")

	rc.status(http.StatusServiceUnavailable) // without Retry-After: the schedule
	c := ping()
	require.Equal(t, 1, deliver(t, e))
	assert.InDelta(t, float64(5*time.Second), float64(wait(c)), float64(time.Second))

	// Honoured: not tried before.
	rc.status(http.StatusOK)
	clk.Advance(119 * time.Second)
	require.Equal(t, 1, deliver(t, e), "only c (5 s) is due")
	assert.Equal(t, client.DeliveryStateDelivered, delivery(t, f.acme, "acme", w.WebhookId, c).State)
	clk.Advance(2 * time.Second)
	require.Equal(t, 1, deliver(t, e))
	assert.Equal(t, client.DeliveryStateDelivered, delivery(t, f.acme, "acme", w.WebhookId, a).State)
	assert.Equal(t, client.DeliveryStatePending, delivery(t, f.acme, "acme", w.WebhookId, b).State)
}

// A 3xx is a failure and its Location is never followed.
func TestRedirectIsAFailure(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	target := newReceiver(t)
	rc := newReceiver(t)
	rc.respond(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL(), http.StatusTemporaryRedirect)
	})
	e := f.engine(t, nil, webhooks.EngineOptions{})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	require.Equal(t, 1, deliver(t, e))
	d := delivery(t, f.acme, "acme", w.WebhookId, ping.Data.DeliveryId)
	assert.Equal(t, client.DeliveryStatePending, d.State)
	assert.Equal(t, int64(307), d.LastStatus.Value)
	assert.Empty(t, target.requests())
}

// A connection refused by the guard is a failed attempt naming why.
func TestForbiddenTargetAtConnectTime(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	// The webhook was made while private targets were allowed; a
	// deployment that refuses them refuses at connect time.
	w := mustCreate(t, f.acme, "acme", "https://127.0.0.1:9/hook", "*").Webhook
	o := webhooks.OptionsFrom(f.env.Config)
	o.AllowPrivateTargets = false
	e, err := webhooks.NewEngine(f.env.Store, o, webhooks.EngineOptions{})
	require.NoError(t, err)
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	require.Equal(t, 1, deliver(t, e))
	d := delivery(t, f.acme, "acme", w.WebhookId, ping.Data.DeliveryId)
	assert.Equal(t, client.DeliveryStatePending, d.State)
	assert.True(t, d.LastStatus.Null)
	assert.Contains(t, d.LastError.Value, "target address 127.0.0.1 is not public (loopback)")
}

// Pausing cancels pending deliveries, claimed ones too: an attempt in
// flight then records nothing.
func TestPauseCancelsPendingDeliveries(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	release := make(chan struct{})
	rc.respond(func(w http.ResponseWriter, _ *http.Request) { <-release })
	e := f.engine(t, nil, webhooks.EngineOptions{})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	for range 4 {
		publishSite(t, f.acme, "acme")
	}
	f.fanOut(t, e)
	n, err := e.Deliver(context.Background(), nil, 10)
	require.NoError(t, err)
	require.Equal(t, 2, n, "two in flight per webhook by default")
	require.Eventually(t, func() bool { return len(rc.requests()) == 2 }, 5*time.Second, 5*time.Millisecond)
	_, err = update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: w.WebhookId, Active: client.NewOptBool(false)})
	require.NoError(t, err)
	close(release)
	e.Wait()
	for _, d := range deliveries(t, f.acme, "acme", w.WebhookId) {
		assert.Equal(t, client.DeliveryStateCancelled, d.State)
		assert.Zero(t, d.Attempts, "the attempts in flight recorded nothing")
		assert.True(t, d.NextAttemptAt.Null)
	}
	// Redeliver after resuming: same id, delivered again.
	_, err = update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: w.WebhookId, Active: client.NewOptBool(true)})
	require.NoError(t, err)
	id := deliveries(t, f.acme, "acme", w.WebhookId)[0].DeliveryId
	_, err = f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: id})
	require.NoError(t, err)
	rc.status(http.StatusNoContent)
	require.Equal(t, 1, deliver(t, e))
	got := rc.requests()
	assert.Equal(t, id, got[len(got)-1].header.Get("X-Service-Delivery"))
	assert.Equal(t, client.DeliveryStateDelivered, delivery(t, f.acme, "acme", w.WebhookId, id).State)
}

// Redeliver keeps the id, so X-Service-Delivery (and webhook-id) carry the
// same value; the attempt count restarts.
func TestRedeliverSendsTheSameDeliveryAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*")
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.Webhook.WebhookId})
	require.NoError(t, err)
	id := ping.Data.DeliveryId
	require.Equal(t, 1, deliver(t, e))
	res, err := f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: id})
	require.NoError(t, err)
	assert.Equal(t, client.DeliveryStatePending, res.Data.State)
	require.Equal(t, 1, deliver(t, e))
	got := rc.requests()
	require.Len(t, got, 2)
	for _, r := range got {
		assert.Equal(t, id, r.header.Get("X-Service-Delivery"))
		assert.Equal(t, id, r.header.Get("webhook-id"))
		require.NoError(t, verify(t, w.Secret, r))
	}
	assert.Equal(t, got[0].body, got[1].body, "the same body")
	var ev outbox.CloudEvent
	require.NoError(t, json.Unmarshal(got[0].body, &ev))
	assert.Equal(t, "webhook.ping", ev.Type)
	assert.Equal(t, w.Webhook.WebhookId, ev.Subject)
	assert.Equal(t, "computeplane/webhooks", ev.Source)
	assert.JSONEq(t, `{"webhookId":"`+w.Webhook.WebhookId+`"}`, string(ev.Data))
	d := delivery(t, f.acme, "acme", w.Webhook.WebhookId, id)
	assert.Equal(t, int64(1), d.Attempts, "reset, then one attempt")
	assert.Equal(t, client.DeliveryStateDelivered, d.State)
}

// A killed process's claims come back when they expire.
func TestExpiredClaimsComeBack(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	clk := &clock{}
	e := f.engine(t, clk, webhooks.EngineOptions{ClaimTTL: time.Minute})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	// A process claimed it and died.
	_, err = f.env.Store.Pool().Exec(t.Context(),
		"UPDATE webhook_deliveries SET claimed_until = $2, claim_token = 'clm_dead' WHERE delivery_id = $1", ping.Data.DeliveryId, clk.Now().Add(time.Minute))
	require.NoError(t, err)
	assert.Zero(t, deliver(t, e), "claimed elsewhere")
	clk.Advance(time.Minute + time.Second)
	require.Equal(t, 1, deliver(t, e), "the claim expired")
	assert.Equal(t, client.DeliveryStateDelivered, delivery(t, f.acme, "acme", w.WebhookId, ping.Data.DeliveryId).State)
	// The dead process's late result records nothing.
	n := f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE claim_token = 'clm_dead'")
	assert.Zero(t, n)
}

// At most PerWebhook attempts per webhook are in flight, across processes.
func TestInFlightLimitPerWebhookAcrossProcesses(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	release := make(chan struct{})
	var now, peak atomic.Int32
	rc.respond(func(w http.ResponseWriter, _ *http.Request) {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		now.Add(-1)
	})
	a := f.engine(t, nil, webhooks.EngineOptions{PerWebhook: 2})
	b := f.engine(t, nil, webhooks.EngineOptions{PerWebhook: 2})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	for range 6 {
		_, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
		require.NoError(t, err)
	}
	n, err := a.Deliver(context.Background(), nil, 10)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	m, err := b.Deliver(context.Background(), nil, 10)
	require.NoError(t, err)
	assert.Zero(t, m, "the other process finds the webhook at its limit")
	require.Eventually(t, func() bool { return now.Load() == 2 }, 5*time.Second, 5*time.Millisecond)
	close(release)
	a.Wait()
	for {
		x, err := b.Deliver(context.Background(), nil, 10)
		require.NoError(t, err)
		b.Wait()
		if x == 0 {
			break
		}
	}
	assert.Equal(t, int32(2), peak.Load())
	assert.Equal(t, 6, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'"))
}

// One receiver hanging until the attempt times out does not slow another
// tenant's deliveries: both measured while Run drives the engine.
func TestHangingReceiverDoesNotDelayOtherTenants(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	const timeout = 4 * time.Second
	hang := newReceiver(t)
	hang.respond(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	fast := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{Timeout: timeout, ClaimTTL: time.Minute, Concurrency: 8, PerWebhook: 2})
	mustCreate(t, f.acme, "acme", hang.URL(), "*")
	mustCreate(t, f.globex, "globex", fast.URL(), "*")

	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { e.Run(ctx, nil, wake, 20*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()

	// acme floods its hanging receiver first, then both publish in turn.
	for range 10 {
		f.publish(t, "acme", "site.created", "a")
	}
	time.Sleep(100 * time.Millisecond)
	var mu sync.Mutex
	sent := map[string]time.Time{}
	for i := range 20 {
		id := f.publish(t, "globex", "site.created", "g")
		mu.Lock()
		sent[id] = time.Now()
		mu.Unlock()
		if i%2 == 0 {
			f.publish(t, "acme", "site.created", "a")
		}
		select {
		case wake <- struct{}{}:
		default:
		}
		time.Sleep(25 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return len(fast.requests()) >= 20 }, 10*time.Second, 10*time.Millisecond)
	var lat []time.Duration
	for _, r := range fast.requests() {
		var ev outbox.CloudEvent
		require.NoError(t, json.Unmarshal(r.body, &ev))
		mu.Lock()
		at, ok := sent[ev.ID]
		mu.Unlock()
		require.True(t, ok)
		lat = append(lat, r.at.Sub(at))
	}
	slices.Sort(lat)
	p50, worst := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("globex (fast receiver): %d deliveries, p50 %s, max %s, while acme's receiver hangs %s per attempt", len(lat), p50, worst, timeout)
	// Far below one timeout even when other databases on the cluster hold
	// the outbox's horizon back for a moment.
	assert.Less(t, worst, timeout/2, "no globex delivery waited for acme's hanging receiver")

	// acme's attempts end by the timeout, two at a time.
	require.Eventually(t, func() bool {
		return f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE tenant_id = 'acme' AND attempts > 0") >= 2
	}, 3*timeout, 50*time.Millisecond)
	var lastErr string
	require.NoError(t, f.env.Store.Pool().QueryRow(context.Background(),
		"SELECT last_error FROM webhook_deliveries WHERE tenant_id = 'acme' AND attempts > 0 LIMIT 1").Scan(&lastErr))
	assert.Contains(t, lastErr, "no answer within 4s")
	got := len(hang.requests())
	t.Logf("acme (hanging receiver): %d attempts started in %s", got, time.Since(fast.requests()[0].at))
	assert.LessOrEqual(t, got, 6, "at most two in flight for the hanging webhook at a time")
}

// Run delivers what commits, woken at once, and gives claims back when it
// stops mid-attempt.
func TestRunDeliversAndStopsCleanly(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{})
	w := mustCreate(t, f.acme, "acme", rc.URL(), "*").Webhook
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx, nil, nil, 20*time.Millisecond); close(done) }()
	publishSite(t, f.acme, "acme")
	select {
	case <-rc.notify:
	case <-time.After(10 * time.Second):
		t.Fatal("not delivered")
	}
	// Stop while an attempt hangs: its claim is given back uncounted.
	rc.respond(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	select {
	case <-rc.notify:
	case <-time.After(10 * time.Second):
		t.Fatal("ping not attempted")
	}
	cancel()
	<-done
	d := delivery(t, f.acme, "acme", w.WebhookId, ping.Data.DeliveryId)
	assert.Equal(t, client.DeliveryStatePending, d.State)
	assert.Zero(t, d.Attempts)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE claimed_until IS NOT NULL"), "claim released")
}
