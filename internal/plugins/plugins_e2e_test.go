package plugins_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/host"
	"computeplane/internal/outbox"
	"computeplane/internal/testenv"
	"computeplane/internal/webhooks"
)

func buildExample(t *testing.T) (path, sum string) { return testenv.ExamplePlugin(t) }

func pluginConfig(t *testing.T) string {
	return "webhooks: {allowPrivateTargets: true}\n" + testenv.ExamplePluginConfig(t)
}

// The example plugin end to end: its methods through the generated client
// over HTTP against the real server and PostgreSQL, one decision on
// compute:example:*, its event delivered by a webhook, the audit row in
// the call's transaction, and the plugin killed: UNAVAILABLE until it is
// restarted, its state kept.
func TestExamplePluginEndToEnd(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, pluginConfig(t))))
	c := func(tenant, identity, role string) *computeclient.Client {
		return env.Client(t, computeclient.WithToken(env.Key(t, tenant, identity, role)))
	}
	mia, vic, gus := c("acme", "mia", "member"), c("acme", "vic", "viewer"), c("globex", "gus", "owner")
	ctx := t.Context()

	// The plugin's family is in the deployment's event catalog, and a
	// webhook subscribes to it.
	types, err := mia.WebhooksEventTypes(ctx, &client.WebhooksEventTypesInput{TenantId: "acme"})
	require.NoError(t, err)
	var family []string
	for _, e := range types.Data.Items {
		if e.Module == "example" {
			family = append(family, e.Type)
			assert.True(t, e.Served, e.Type)
		}
	}
	assert.ElementsMatch(t, []string{"example.note.created", "example.note.deleted"}, family)
	rc := newReceiver(t)
	hook, err := mia.WebhooksCreate(ctx, &client.WebhooksCreateInput{TenantId: "acme", URL: rc.URL(), Events: []string{"example.note.*"}})
	require.NoError(t, err)

	// A member writes a note: the plugin keeps it and publishes its event.
	created, err := mia.ExampleNotesCreate(ctx, &client.ExampleNotesCreateInput{TenantId: "acme", Title: "hello", Body: client.NewOptString("from the plugin")})
	require.NoError(t, err)
	note := created.Data
	assert.Regexp(t, `^note_[0-9a-z]{26}$`, note.NoteId)
	assert.Equal(t, "acme", note.TenantId)
	assert.Equal(t, "hello", note.Title)
	assert.NotEmpty(t, note.CreatedBy)
	var audits int
	require.NoError(t, env.Store.Pool().QueryRow(ctx,
		"SELECT count(*) FROM audit_log WHERE method = 'example.notes.create' AND tenant_id = 'acme'").Scan(&audits))
	assert.Equal(t, 1, audits, "the audit row is written with the call")

	list, err := vic.ExampleNotesList(ctx, &client.ExampleNotesListInput{TenantId: "acme"})
	require.NoError(t, err, "a viewer reads: compute:example:read")
	require.Len(t, list.Data.Items, 1)
	assert.Equal(t, note.NoteId, list.Data.Items[0].NoteId)

	// Refusals: the viewer lacks compute:example:write, another tenant's
	// owner every compute:example:* in acme; input is validated by the
	// generated decoder before any of it.
	_, err = vic.ExampleNotesCreate(ctx, &client.ExampleNotesCreateInput{TenantId: "acme", Title: "no"})
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	_, err = gus.ExampleNotesList(ctx, &client.ExampleNotesListInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	_, err = gus.ExampleNotesDelete(ctx, &client.ExampleNotesDeleteInput{TenantId: "acme", NoteId: note.NoteId})
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	raw := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "mia", "member")), computeclient.WithRequestEditor(func(r *http.Request) {
		r.Body = io.NopCloser(strings.NewReader(`{"tenantId":"acme","title":""}`))
		r.ContentLength = -1
	}))
	_, err = raw.ExampleNotesCreate(ctx, &client.ExampleNotesCreateInput{TenantId: "acme", Title: "x"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Message, "title")
	// The plugin's own answer: a note acme does not have.
	_, err = mia.ExampleNotesDelete(ctx, &client.ExampleNotesDeleteInput{TenantId: "acme", NoteId: "note_00000000000000000000000000"})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	list, err = gus.ExampleNotesList(ctx, &client.ExampleNotesListInput{TenantId: "globex"})
	require.NoError(t, err)
	assert.Empty(t, list.Data.Items, "notes are per tenant")

	// The event reaches the webhook, signed, as a CloudEvent of the
	// plugin's module.
	eng := engine(t, env)
	require.Eventually(t, func() bool {
		_, err := eng.FanOut(context.Background(), nil, 100)
		require.NoError(t, err)
		_, err = eng.Deliver(context.Background(), nil, 100)
		require.NoError(t, err)
		eng.Wait()
		return len(rc.bodies()) > 0
	}, 30*time.Second, 20*time.Millisecond, "the webhook delivery")
	var ev outbox.CloudEvent
	require.NoError(t, json.Unmarshal(rc.bodies()[0], &ev))
	assert.Equal(t, "example.note.created", ev.Type)
	assert.Equal(t, note.NoteId, ev.Subject)
	assert.Equal(t, "acme", ev.TenantID)
	assert.Equal(t, "computeplane/example", ev.Source)
	assert.JSONEq(t, `{"noteId":"`+note.NoteId+`","title":"hello"}`, string(ev.Data))
	ds, err := mia.WebhooksDeliveries(ctx, &client.WebhooksDeliveriesInput{TenantId: "acme", WebhookId: hook.Data.Webhook.WebhookId})
	require.NoError(t, err)
	require.Len(t, ds.Data.Items, 1)
	assert.Equal(t, client.DeliveryStateDelivered, ds.Data.Items[0].State)

	// The plugin is killed: calls answer UNAVAILABLE with a retry hint
	// until it is restarted; what it kept survives.
	plugins := env.Host.Plugins()
	pid := plugins.Pid("example")
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	_, err = mia.ExampleNotesList(ctx, &client.ExampleNotesListInput{TenantId: "acme"})
	e = testenv.APIError(t, err)
	assert.Equal(t, "UNAVAILABLE", e.Code)
	assert.Equal(t, http.StatusServiceUnavailable, e.Status)
	require.NotNil(t, e.RetryAfterMs)
	assert.Positive(t, *e.RetryAfterMs)
	var back *client.ExampleNotesListResult
	require.Eventually(t, func() bool {
		res, err := mia.ExampleNotesList(ctx, &client.ExampleNotesListInput{TenantId: "acme"})
		if err != nil {
			e := testenv.APIError(t, err)
			require.Equal(t, "UNAVAILABLE", e.Code, "only UNAVAILABLE until it is back")
			require.NotNil(t, e.RetryAfterMs)
			return false
		}
		back = res
		return true
	}, 30*time.Second, 50*time.Millisecond, "the plugin is restarted")
	require.Len(t, back.Data.Items, 1)
	assert.Equal(t, note.NoteId, back.Data.Items[0].NoteId)
	assert.NotEqual(t, pid, plugins.Pid("example"), "a new process")

	// system.selfCheck reports the plugin.
	ops := c("root", "ops", "admin")
	check, err := ops.SystemSelfCheck(ctx, &client.SystemSelfCheckInput{})
	require.NoError(t, err)
	assert.True(t, check.Data.Ok, "%+v", check.Data.Findings)
	var seen bool
	for _, f := range check.Data.Findings {
		if f.Check == "plugins" {
			seen = true
			assert.Contains(t, f.Message, "plugin example is running")
		}
	}
	assert.True(t, seen, "a finding of the plugins check")

	// After the restart, writes and their events work again.
	del, err := mia.ExampleNotesDelete(ctx, &client.ExampleNotesDeleteInput{TenantId: "acme", NoteId: note.NoteId})
	require.NoError(t, err)
	assert.True(t, del.Data.Deleted)
}

// A plugin the deployment does not configure is not mounted: NOT_FOUND
// before authentication, and its family is not in the event catalog.
func TestUnconfiguredPluginIsNotMounted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	mia := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "mia", "member")))
	_, err := mia.ExampleNotesList(t.Context(), &client.ExampleNotesListInput{TenantId: "acme"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "NOT_FOUND", e.Code)
	assert.Contains(t, e.Message, "plugin example is not configured")
	// Before authentication: a caller from another tenant hears the same.
	gus := env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "viewer")))
	_, err = gus.ExampleNotesCreate(t.Context(), &client.ExampleNotesCreateInput{TenantId: "acme", Title: "x"})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	types, err := mia.WebhooksEventTypes(t.Context(), &client.WebhooksEventTypesInput{TenantId: "acme"})
	require.NoError(t, err)
	for _, et := range types.Data.Items {
		assert.NotEqual(t, "example", et.Module, et.Type)
	}
	_, err = mia.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{TenantId: "acme", URL: "https://hooks.example.com/x", Events: []string{"example.note.*"}})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code)
}

// Every plugin setting is checked at start: INVALID_CONFIG naming the
// field.
func TestPluginConfigRefusedAtStart(t *testing.T) {
	t.Parallel()
	bin, sum := buildExample(t)
	notExec := filepath.Join(t.TempDir(), "plain")
	require.NoError(t, os.WriteFile(notExec, []byte("x"), 0o644))
	other := "'" + strings.Repeat("0", 64) + "'" // quoted: YAML reads 000... as a number
	for _, tc := range []struct{ name, entry, option, message string }{
		{"checksum mismatch", "{id: example, path: " + bin + ", sha256: " + other + "}", "plugins[0].sha256", "has SHA-256 " + sum},
		{"missing binary", "{id: example, path: /nonexistent/example, sha256: " + sum + "}", "plugins[0].path", "cannot be read"},
		{"not executable", "{id: example, path: " + notExec + ", sha256: " + sum + "}", "plugins[0].path", "not an executable"},
		{"not built in", "{id: billing, path: " + bin + ", sha256: " + sum + "}", "plugins[0].id", `no plugin "billing" is built into this binary`},
		{"bad id", "{id: Bad-Id, path: " + bin + ", sha256: " + sum + "}", "plugins[0].id", "a-z and 0-9"},
		{"no checksum", "{id: example, path: " + bin + "}", "plugins[0].sha256", "64 lowercase hex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := testenv.ConfigFile(t, "plugins:\n  - "+tc.entry+"\n")
			env := map[string]string{"SERVICE_CONFIG": file, "SERVICE_DATABASE_URL": "postgres://unused", "SERVICE_SECRET": testenv.TestSecret}
			_, err := host.CheckConfig(func(k string) string { return env[k] }, builtin.All())
			require.Error(t, err)
			var found bool
			for _, p := range config.Problems(err) {
				found = found || (p.Option == tc.option && strings.Contains(p.Message, tc.message))
			}
			assert.Truef(t, found, "no problem names %s with %q: %v", tc.option, tc.message, err)
		})
	}
}

// engine is a webhook delivery engine on env's database that trusts the
// test receivers' certificate.
func engine(t *testing.T, env *testenv.Env) *webhooks.Engine {
	t.Helper()
	roots := x509.NewCertPool()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	roots.AddCert(srv.Certificate()) // every httptest TLS server shares it
	srv.Close()
	e, err := webhooks.NewEngine(env.Store, webhooks.OptionsFrom(env.Config), webhooks.EngineOptions{RootCAs: roots})
	require.NoError(t, err)
	t.Cleanup(e.Wait)
	return e
}

type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got [][]byte
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, b)
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) URL() string { return rc.srv.URL + "/hook" }

func (rc *receiver) bodies() [][]byte {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([][]byte(nil), rc.got...)
}
