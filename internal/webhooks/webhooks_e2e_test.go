package webhooks_test

// The rules of the specification's webhooks section (1-8), its Limits rows
// and the webhook fields, through the generated client over HTTP against
// the real host and PostgreSQL. Deliveries are in delivery_e2e_test.go.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/plugins"
	"computeplane/internal/testenv"
	"computeplane/internal/webhooks"
)

const hookURL = "https://hooks.example.com/in"

func TestCreateReturnsTheSecretOnceAndStoresItSealed(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "site.*", "security.secret.put")
	assert.Regexp(t, `^whk_[0-9a-hjkmnp-tv-z]{26}$`, w.Webhook.WebhookId)
	assert.Regexp(t, `^whsec_[A-Za-z0-9+/]{43}=$`, w.Secret)
	assert.Equal(t, "acme", w.Webhook.TenantId)
	assert.Equal(t, hookURL, w.Webhook.URL)
	assert.Equal(t, []string{"site.*", "security.secret.put"}, w.Webhook.Events)
	assert.Equal(t, "", w.Webhook.Description)
	assert.True(t, w.Webhook.Active)
	assert.Equal(t, int64(1), w.Webhook.Version)
	assert.True(t, w.Webhook.PreviousSecretExpiresAt.Null)

	// get and list return no secret, in any field.
	got, err := f.acme.WebhooksGet(t.Context(), &client.WebhooksGetInput{TenantId: "acme", WebhookId: w.Webhook.WebhookId})
	require.NoError(t, err)
	assert.Equal(t, w.Webhook, got.Data)
	raw, err := json.Marshal(got.Data)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "whsec_")
	assert.NotContains(t, string(raw), strings.TrimPrefix(w.Secret, "whsec_"))

	// At rest the secret is sealed: neither the text nor the key bytes.
	var sealed []byte
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(), "SELECT secret_sealed FROM webhooks WHERE webhook_id = $1", w.Webhook.WebhookId).Scan(&sealed))
	assert.NotContains(t, string(sealed), w.Secret)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhooks WHERE position(convert_to($1, 'UTF8') in secret_sealed) > 0", strings.TrimPrefix(w.Secret, "whsec_")))

	// Audited, naming the webhook; no event.
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'webhooks.create' AND resource_type = 'compute-webhook' AND resource_id = $1 AND tenant_id = 'acme'", w.Webhook.WebhookId))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM outbox"))

	withDesc, err := f.acme.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{
		TenantId: "acme", URL: hookURL, Events: []string{"*"}, Description: client.NewOptString(strings.Repeat("d", 256)),
	})
	require.NoError(t, err)
	assert.Len(t, withDesc.Data.Webhook.Description, 256)
	assert.NotEqual(t, w.Secret, withDesc.Data.Secret)
}

// Rule 1: exact types, families and *; a pattern matching nothing in the
// catalog is INVALID_INPUT unless the deployment accepts any pattern.
func TestPatterns(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	for _, ok := range [][]string{{"*"}, {"site.created"}, {"site.*"}, {"sandbox.*"}, {"sandbox.volume.*"}, {"node.*"}, {"webhook.ping"}, {"site.created", "site.created"},
		// The families the specification names, served or not yet.
		{"reservation.*"}, {"node.cordoned"}, {"reservation.preempted", "node.*"}} {
		_, err := create(t, f.acme, "acme", hookURL, ok...)
		require.NoError(t, err, ok)
	}
	for _, bad := range [][]string{{"reservations.*"}, {"node.exploded"}, {"site.exploded"}, {"site"}, {"sites.*"}, {"site.*", "nope.*"}} {
		_, err := create(t, f.acme, "acme", hookURL, bad...)
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, bad)
		assert.Contains(t, e.Message, "matches no event type", bad)
	}
	for _, bad := range [][]string{{}, {"Site.created"}, {"site.**"}, {"*.created"}, {"site.*.created"}, {""}, {strings.Repeat("a", 129)}} {
		_, err := create(t, f.acme, "acme", hookURL, bad...)
		assert.Equal(t, "INVALID_INPUT", code(t, err), "syntax or count: %q", bad)
	}
	twenty := make([]string, 20)
	for i := range twenty {
		twenty[i] = "site.created"
	}
	_, err := create(t, f.acme, "acme", hookURL, twenty...)
	require.NoError(t, err, "20 patterns")
	_, err = create(t, f.acme, "acme", hookURL, append(twenty, "site.created")...)
	assert.Equal(t, "INVALID_INPUT", code(t, err), "21 patterns")

	// update checks patterns the same way.
	w := mustCreate(t, f.acme, "acme", hookURL, "*")
	_, err = update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: w.Webhook.WebhookId, Events: []string{"nope.*"}})
	assert.Equal(t, "INVALID_INPUT", code(t, err))

	// The deployment switch.
	open := setup(t, "{acceptAnyPattern: true}")
	_, err = create(t, open.acme, "acme", hookURL, "nope.*", "plugin.thing.done")
	require.NoError(t, err)
}

// Rule 2: absolute https, no credentials, no non-public address; update
// checks the URL the same way.
func TestURLRules(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	bad := []string{
		"http://hooks.example.com/in", "hooks.example.com/in", "https://user:pw@hooks.example.com/",
		"https://127.0.0.1/", "https://10.0.0.8/", "https://169.254.169.254/latest", "https://100.64.0.1/",
		"https://[::1]/", "https://[::ffff:127.0.0.1]/", "https://[fd00::1]/", "https://[fe80::1]/",
		"https://224.0.0.1/", "https://0.0.0.0/", "https://192.0.2.1/", "https://localhost:8443/",
		"https://2130706433/", "https://hooks.example.com/#x", "https://" + strings.Repeat("a", 2040) + ".com/",
	}
	for _, u := range bad {
		_, err := create(t, f.acme, "acme", u, "*")
		assert.Equal(t, "INVALID_INPUT", code(t, err), u)
	}
	for _, u := range []string{"https://8.8.8.8/hook", "https://[2606:4700::1111]:8443/x?token=abc", "https://hooks.example.com"} {
		_, err := create(t, f.acme, "acme", u, "*")
		require.NoError(t, err, u)
	}
	w := mustCreate(t, f.acme, "acme", hookURL, "*")
	for _, u := range bad[:6] {
		_, err := update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: w.Webhook.WebhookId, URL: client.NewOptString(u)})
		assert.Equal(t, "INVALID_INPUT", code(t, err), u)
	}
	// Private targets for tests and on-premises installs.
	private := setup(t, "{allowPrivateTargets: true}")
	for _, u := range []string{"https://127.0.0.1:8443/", "https://10.0.0.8/", "https://localhost/"} {
		_, err := create(t, private.acme, "acme", u, "*")
		require.NoError(t, err, u)
	}
	_, err := create(t, private.acme, "acme", "http://10.0.0.8/", "*")
	assert.Equal(t, "INVALID_INPUT", code(t, err), "still https")
}

// Rule 3: 20 webhooks per tenant by default, one more is QUOTA_EXCEEDED;
// rule 4: no idempotency key, a retry creates a second webhook.
func TestPerTenantLimitAndNoIdempotency(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	a := mustCreate(t, f.acme, "acme", hookURL, "*")
	b := mustCreate(t, f.acme, "acme", hookURL, "*")
	assert.NotEqual(t, a.Webhook.WebhookId, b.Webhook.WebhookId, "the same request twice makes two webhooks")
	for range 18 {
		mustCreate(t, f.acme2, "acme", hookURL, "*")
	}
	_, err := create(t, f.acme, "acme", hookURL, "*")
	e := testenv.APIError(t, err)
	assert.Equal(t, "QUOTA_EXCEEDED", e.Code)
	assert.EqualValues(t, 20, e.Details["limit"])
	mustCreate(t, f.globex, "globex", hookURL, "*") // per tenant
	// A delete frees a place.
	_, err = f.acme.WebhooksDelete(t.Context(), &client.WebhooksDeleteInput{TenantId: "acme", WebhookId: a.Webhook.WebhookId})
	require.NoError(t, err)
	mustCreate(t, f.acme, "acme", hookURL, "*")
	assert.Equal(t, 20, f.count(t, "SELECT count(*) FROM webhooks WHERE tenant_id = 'acme'"))

	// The limit holds under concurrent creates, and is configurable.
	small := setup(t, "{maxPerTenant: 3}")
	var wg sync.WaitGroup
	codes := make([]string, 10)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := create(t, small.acme, "acme", hookURL, "*"); err != nil {
				codes[i] = code(t, err)
			} else {
				codes[i] = "OK"
			}
		}()
	}
	wg.Wait()
	slices.Sort(codes)
	assert.Equal(t, []string{"OK", "OK", "OK", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED"}, codes)
	assert.Equal(t, 3, small.count(t, "SELECT count(*) FROM webhooks"))
}

func TestListOldestFirstWithoutSecrets(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	var made []string
	for range 4 {
		made = append(made, mustCreate(t, f.acme, "acme", hookURL, "*").Webhook.WebhookId)
		time.Sleep(2 * time.Millisecond)
	}
	mustCreate(t, f.globex, "globex", hookURL, "*")
	res, err := f.acme.WebhooksList(t.Context(), &client.WebhooksListInput{TenantId: "acme"})
	require.NoError(t, err)
	var listed []string
	for _, w := range res.Data.Items {
		listed = append(listed, w.WebhookId)
	}
	assert.Equal(t, made, listed, "oldest first, only the tenant's")
	raw, err := json.Marshal(res.Data)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "whsec_")
	empty, err := f.globex.WebhooksList(t.Context(), &client.WebhooksListInput{TenantId: "globex"})
	require.NoError(t, err)
	assert.Len(t, empty.Data.Items, 1)
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "*").Webhook
	base := client.WebhooksUpdateInput{TenantId: "acme", WebhookId: w.WebhookId}

	_, err := update(t, f.acme, base)
	assert.Equal(t, "INVALID_INPUT", code(t, err), "no change named")

	in := base
	in.URL, in.Events, in.Description = client.NewOptString("https://other.example.com/x"), []string{"site.created", "node.*"}, client.NewOptString("ops")
	got, err := update(t, f.acme, in)
	require.NoError(t, err)
	assert.Equal(t, int64(2), got.Version, "version incremented")
	assert.Equal(t, "https://other.example.com/x", got.URL)
	assert.Equal(t, []string{"site.created", "node.*"}, got.Events)
	assert.Equal(t, "ops", got.Description)
	assert.True(t, got.Active)

	same, err := update(t, f.acme, in)
	require.NoError(t, err)
	assert.Equal(t, int64(2), same.Version, "equal values change nothing")

	pause := base
	pause.Active = client.NewOptBool(false)
	paused, err := update(t, f.acme, pause)
	require.NoError(t, err)
	assert.False(t, paused.Active)
	assert.Equal(t, int64(3), paused.Version)
	clear := base
	clear.Description = client.NewOptString("")
	cleared, err := update(t, f.acme, clear)
	require.NoError(t, err)
	assert.Equal(t, "", cleared.Description)
	assert.Equal(t, "https://other.example.com/x", cleared.URL, "omitted fields keep their values")

	long := base
	long.Description = client.NewOptString(strings.Repeat("d", 257))
	_, err = update(t, f.acme, long)
	assert.Equal(t, "INVALID_INPUT", code(t, err), "description at most 256")
	none := base
	none.Events = []string{}
	_, err = update(t, f.acme, none)
	assert.Equal(t, "INVALID_INPUT", code(t, err), "1 to 20 patterns")
	assert.Equal(t, 4, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'webhooks.update' AND resource_id = $1", w.WebhookId))
}

// Rule 5 (the signing side is in delivery_e2e_test.go).
func TestRotateSecret(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "*")
	rotate := func(keep client.OptInt64) (*client.WebhookWithSecret, error) {
		res, err := f.acme.WebhooksRotateSecret(t.Context(), &client.WebhooksRotateSecretInput{TenantId: "acme", WebhookId: w.Webhook.WebhookId, KeepPreviousSeconds: keep})
		if err != nil {
			return nil, err
		}
		return &res.Data, nil
	}
	r1, err := rotate(client.OptInt64{})
	require.NoError(t, err)
	assert.NotEqual(t, w.Secret, r1.Secret)
	assert.Regexp(t, `^whsec_`, r1.Secret)
	assert.Equal(t, int64(2), r1.Webhook.Version)
	assert.True(t, r1.Webhook.PreviousSecretExpiresAt.Null, "0 (the default) stops the old one at once")

	before := time.Now()
	r2, err := rotate(client.NewOptInt64(86400))
	require.NoError(t, err)
	until, ok := r2.Webhook.PreviousSecretExpiresAt.Get()
	require.True(t, ok)
	assert.WithinDuration(t, before.Add(24*time.Hour), until, 5*time.Second)
	got, err := f.acme.WebhooksGet(t.Context(), &client.WebhooksGetInput{TenantId: "acme", WebhookId: w.Webhook.WebhookId})
	require.NoError(t, err)
	assert.Equal(t, until, got.Data.PreviousSecretExpiresAt.Value)

	for _, bad := range []int64{-1, 86401} {
		_, err := rotate(client.NewOptInt64(bad))
		assert.Equal(t, "INVALID_INPUT", code(t, err), bad)
	}
	assert.Equal(t, 2, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'webhooks.rotateSecret'"))
}

// Rule 6: ping queues a delivery and writes nothing to the outbox.
func TestPingIsADeliveryOnly(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "site.created").Webhook
	res, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	d := res.Data
	assert.Regexp(t, `^dlv_[0-9a-hjkmnp-tv-z]{26}$`, d.DeliveryId)
	assert.Regexp(t, `^evt_`, d.EventId)
	assert.Equal(t, w.WebhookId, d.WebhookId)
	assert.Equal(t, "webhook.ping", d.EventType)
	assert.Equal(t, client.DeliveryStatePending, d.State)
	assert.Zero(t, d.Attempts)
	next, ok := d.NextAttemptAt.Get()
	require.True(t, ok)
	assert.WithinDuration(t, time.Now(), next, 5*time.Second, "due now")
	assert.True(t, d.LastStatus.Null)
	assert.True(t, d.LastError.Null)
	assert.True(t, d.LastAttemptAt.Null)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM outbox"), "not in the outbox")
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'webhooks.ping'"))
	assert.Equal(t, []client.Delivery{d}, deliveries(t, f.acme, "acme", w.WebhookId))
}

func TestDeliveriesNewestFirstWithStateAndLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "*").Webhook
	var made []string
	for range 5 {
		res, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
		require.NoError(t, err)
		made = append(made, res.Data.DeliveryId)
		time.Sleep(2 * time.Millisecond)
	}
	_, err := f.env.Store.Pool().Exec(t.Context(),
		"UPDATE webhook_deliveries SET state = 'dead', next_attempt_at = NULL, attempts = 10, last_status = 500 WHERE delivery_id = $1", made[1])
	require.NoError(t, err)
	list := func(in client.WebhooksDeliveriesInput) ([]string, error) {
		in.TenantId, in.WebhookId = "acme", w.WebhookId
		res, err := f.acme.WebhooksDeliveries(t.Context(), &in)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, d := range res.Data.Items {
			out = append(out, d.DeliveryId)
		}
		return out, nil
	}
	all, err := list(client.WebhooksDeliveriesInput{})
	require.NoError(t, err)
	want := slices.Clone(made)
	slices.Reverse(want)
	assert.Equal(t, want, all, "newest first")
	two, err := list(client.WebhooksDeliveriesInput{Limit: client.NewOptInt64(2)})
	require.NoError(t, err)
	assert.Equal(t, want[:2], two)
	dead, err := list(client.WebhooksDeliveriesInput{State: client.NewOptWebhooksDeliveriesInputState(client.WebhooksDeliveriesInputStateDead)})
	require.NoError(t, err)
	assert.Equal(t, []string{made[1]}, dead)
	for _, bad := range []int64{0, 201} {
		_, err := list(client.WebhooksDeliveriesInput{Limit: client.NewOptInt64(bad)})
		assert.Equal(t, "INVALID_INPUT", code(t, err), bad)
	}
	// 200 at most, 50 by default.
	for range 55 {
		_, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
		require.NoError(t, err)
	}
	def, err := list(client.WebhooksDeliveriesInput{})
	require.NoError(t, err)
	assert.Len(t, def, 50)
	most, err := list(client.WebhooksDeliveriesInput{Limit: client.NewOptInt64(200)})
	require.NoError(t, err)
	assert.Len(t, most, 60)
	d := delivery(t, f.acme, "acme", w.WebhookId, made[1])
	assert.Equal(t, client.DeliveryStateDead, d.State)
	assert.Equal(t, int64(500), d.LastStatus.Value)
	assert.True(t, d.NextAttemptAt.Null, "null unless pending")
}

// Rule 7 (the delivering side is in delivery_e2e_test.go).
func TestRedeliverRules(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "*").Webhook
	ping, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	id := ping.Data.DeliveryId
	_, err = f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: id})
	assert.Equal(t, "INVALID_STATE", code(t, err), "still pending")

	for _, state := range []string{"dead", "cancelled", "delivered"} {
		_, err := f.env.Store.Pool().Exec(t.Context(),
			"UPDATE webhook_deliveries SET state = $2, next_attempt_at = NULL, attempts = 4, last_status = 503, last_attempt_at = now() WHERE delivery_id = $1", id, state)
		require.NoError(t, err)
		res, err := f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: id})
		require.NoError(t, err, state)
		d := res.Data
		assert.Equal(t, id, d.DeliveryId, "the same id")
		assert.Equal(t, client.DeliveryStatePending, d.State)
		assert.Zero(t, d.Attempts, "attempt count reset")
		assert.WithinDuration(t, time.Now(), d.NextAttemptAt.Value, 5*time.Second, "due now")
		assert.True(t, d.LastStatus.Null)
	}
	assert.Equal(t, 3, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'webhooks.redeliver' AND resource_type = 'compute-webhook-delivery' AND resource_id = $1", id))

	// Another tenant's delivery, or one of a paused webhook, is NOT_FOUND.
	_, err = f.env.Store.Pool().Exec(t.Context(), "UPDATE webhook_deliveries SET state = 'dead', next_attempt_at = NULL WHERE delivery_id = $1", id)
	require.NoError(t, err)
	_, err = f.globex.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "globex", DeliveryId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = update(t, f.acme, client.WebhooksUpdateInput{TenantId: "acme", WebhookId: w.WebhookId, Active: client.NewOptBool(false)})
	require.NoError(t, err)
	_, err = f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err), "paused")
	_, err = f.acme.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: "acme", DeliveryId: "dlv_0000000000000000000000000z"})
	assert.Equal(t, "NOT_FOUND", code(t, err))
}

// Rule 8: every method but list and eventTypes answers NOT_FOUND for
// another tenant's webhook.
func TestOtherTenantsWebhooksAreNotFound(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "*").Webhook
	ctx := t.Context()
	id := w.WebhookId
	calls := map[string]func() error{
		"get": func() error {
			_, err := f.globex.WebhooksGet(ctx, &client.WebhooksGetInput{TenantId: "globex", WebhookId: id})
			return err
		},
		"update": func() error {
			_, err := f.globex.WebhooksUpdate(ctx, &client.WebhooksUpdateInput{TenantId: "globex", WebhookId: id, Active: client.NewOptBool(false)})
			return err
		},
		"rotateSecret": func() error {
			_, err := f.globex.WebhooksRotateSecret(ctx, &client.WebhooksRotateSecretInput{TenantId: "globex", WebhookId: id})
			return err
		},
		"delete": func() error {
			_, err := f.globex.WebhooksDelete(ctx, &client.WebhooksDeleteInput{TenantId: "globex", WebhookId: id})
			return err
		},
		"ping": func() error {
			_, err := f.globex.WebhooksPing(ctx, &client.WebhooksPingInput{TenantId: "globex", WebhookId: id})
			return err
		},
		"deliveries": func() error {
			_, err := f.globex.WebhooksDeliveries(ctx, &client.WebhooksDeliveriesInput{TenantId: "globex", WebhookId: id})
			return err
		},
	}
	for name, call := range calls {
		assert.Equal(t, "NOT_FOUND", code(t, call()), name)
	}
	// Nothing changed.
	got, err := f.acme.WebhooksGet(ctx, &client.WebhooksGetInput{TenantId: "acme", WebhookId: id})
	require.NoError(t, err)
	assert.Equal(t, w, got.Data)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries"))
	// Absent ones too.
	_, err = f.acme.WebhooksGet(ctx, &client.WebhooksGetInput{TenantId: "acme", WebhookId: "whk_0000000000000000000000000z"})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	// Naming the other tenant is refused before any data is read; the
	// fleet operators act in every tenant.
	_, err = f.globex.WebhooksGet(ctx, &client.WebhooksGetInput{TenantId: "acme", WebhookId: id})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = f.root.WebhooksGet(ctx, &client.WebhooksGetInput{TenantId: "acme", WebhookId: id})
	require.NoError(t, err)
	// Viewers do not manage webhooks (every method decides compute:webhooks:manage).
	_, err = f.viewer.WebhooksList(ctx, &client.WebhooksListInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = f.viewer.WebhooksGet(ctx, &client.WebhooksGetInput{TenantId: "acme", WebhookId: id})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
}

func TestDeleteDeletesQueueAndHistory(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	w := mustCreate(t, f.acme, "acme", hookURL, "*").Webhook
	keep := mustCreate(t, f.acme, "acme", hookURL, "*").Webhook
	for _, id := range []string{w.WebhookId, w.WebhookId, keep.WebhookId} {
		_, err := f.acme.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: "acme", WebhookId: id})
		require.NoError(t, err)
	}
	_, err := f.env.Store.Pool().Exec(t.Context(), "UPDATE webhook_deliveries SET state = 'delivered', next_attempt_at = NULL WHERE delivery_id IN (SELECT delivery_id FROM webhook_deliveries WHERE webhook_id = $1 LIMIT 1)", w.WebhookId)
	require.NoError(t, err)
	res, err := f.acme.WebhooksDelete(t.Context(), &client.WebhooksDeleteInput{TenantId: "acme", WebhookId: w.WebhookId})
	require.NoError(t, err)
	assert.True(t, res.Data.Deleted)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1", w.WebhookId), "queue and history gone")
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1", keep.WebhookId))
	_, err = f.acme.WebhooksGet(t.Context(), &client.WebhooksGetInput{TenantId: "acme", WebhookId: w.WebhookId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = f.acme.WebhooksDelete(t.Context(), &client.WebhooksDeleteInput{TenantId: "acme", WebhookId: w.WebhookId})
	assert.Equal(t, "NOT_FOUND", code(t, err), "a second delete")
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'webhooks.delete' AND resource_id = $1", w.WebhookId))
}

func TestEventTypesIsTheEventCatalog(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	res, err := f.acme.WebhooksEventTypes(t.Context(), &client.WebhooksEventTypesInput{TenantId: "acme"})
	require.NoError(t, err)
	// Without plugins configured: the service's own types, in catalog order.
	own := plugins.EventTypes(nil)
	require.Len(t, res.Data.Items, len(own))
	for i, e := range own {
		got := res.Data.Items[i]
		assert.Equal(t, client.EventType{Type: e.Type, Subject: e.Subject, Module: e.Module, Description: e.Description,
			Served: webhooks.Served(e.Module)}, got)
	}
	types := map[string]client.EventType{}
	for _, e := range res.Data.Items {
		types[e.Type] = e
	}
	assert.Equal(t, "sites", types["site.created"].Module)
	assert.True(t, types["site.created"].Served)
	assert.Equal(t, "webhooks", types["webhook.ping"].Module)
	assert.True(t, types["webhook.ping"].Served)
	// The families the specification names are listed and served now
	// (reservations.create publishes reservation.created, nodes.cordon
	// node.cordoned).
	for _, typ := range []string{"reservation.created", "reservation.placed", "reservation.active", "reservation.ended",
		"reservation.cancelled", "reservation.failed", "reservation.preempting", "reservation.preempted"} {
		e, ok := types[typ]
		require.True(t, ok, typ)
		assert.Equal(t, "reservations", e.Module, typ)
		assert.True(t, e.Served, typ)
		assert.NotEmpty(t, e.Subject, typ)
		assert.NotEmpty(t, e.Description, typ)
	}
	for _, typ := range []string{"node.cordoned", "node.uncordoned", "node.draining", "node.retired", "node.down", "node.labeled"} {
		e, ok := types[typ]
		require.True(t, ok, typ)
		assert.Equal(t, "nodes", e.Module, typ)
		assert.True(t, e.Served, typ)
	}
	// A module's events are served once it has a registered method.
	for _, typ := range []string{"provider.bootstrap.started", "sandbox.volume.created", "sandbox.created", "sandbox.snapshot.created", "workflow.started"} {
		assert.True(t, types[typ].Served, typ)
	}
	_, err = f.viewer.WebhooksEventTypes(t.Context(), &client.WebhooksEventTypesInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = f.globex.WebhooksEventTypes(t.Context(), &client.WebhooksEventTypesInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err), "the tenant pre-check")
}

func TestRefusedCallsLeaveNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	_, err := create(t, f.viewer, "acme", hookURL, "*")
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = create(t, f.acme, "acme", "http://insecure.example.com", "*")
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = f.acme.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{TenantId: strings.Repeat("a", 129), URL: hookURL, Events: []string{"*"}})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	for _, tb := range []string{"webhooks", "webhook_deliveries", "audit_log", "outbox"} {
		assert.Zero(t, f.count(t, fmt.Sprintf("SELECT count(*) FROM %s", tb)), tb)
	}
}
