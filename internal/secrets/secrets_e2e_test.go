package secrets_test

// The rules of the specification's secrets section, the Secret resource,
// Authentication rule 14 and the Limits rows that apply, through the
// generated client over HTTP against the real host and PostgreSQL; and the
// resolver other modules use, against the same database.

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/gen/db"
	"computeplane/internal/keys"
	"computeplane/internal/outbox"
	"computeplane/internal/rpc"
	"computeplane/internal/secrets"
	"computeplane/internal/testenv"
	"computeplane/internal/wire"
)

// recorder keeps every response body the clients saw.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.bodies = append(r.bodies, body)
	r.mu.Unlock()
	res.Body = io.NopCloser(bytes.NewReader(body))
	return res, nil
}

func (r *recorder) all() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.bodies)
}

type fixture struct {
	env                     *testenv.Env
	rec                     *recorder
	root, rootViewer        *computeclient.Client
	acmeOwner, acmeMember   *computeclient.Client
	acmeMember2, acmeViewer *computeclient.Client
	globex                  *computeclient.Client
	resolver                *secrets.Service
}

func setup(t *testing.T, opts ...testenv.Option) *fixture {
	t.Helper()
	env := testenv.Start(t, opts...)
	rec := &recorder{}
	hc := &http.Client{Transport: rec}
	c := func(tenant, identity, role string) *computeclient.Client {
		return env.Client(t, computeclient.WithToken(env.Key(t, tenant, identity, role)), computeclient.WithHTTPClient(hc))
	}
	return &fixture{
		env:         env,
		rec:         rec,
		root:        c("root", "ops", "admin"),
		rootViewer:  c("root", "watcher", "viewer"),
		acmeOwner:   c("acme", "olivia", "owner"),
		acmeMember:  c("acme", "mia", "member"),
		acmeMember2: c("acme", "max", "member"),
		acmeViewer:  c("acme", "vic", "viewer"),
		globex:      c("globex", "gus", "owner"),
		resolver: secrets.New(env.Config.RootTenantID, string(env.Config.Secrets.Store),
			keys.Derive(env.Config.Secret, keys.Secrets)),
	}
}

func code(t *testing.T, err error) string { t.Helper(); return testenv.APIError(t, err).Code }

type putIn struct {
	tenant, name, value, key string
	fleet                    bool
}

func put(t *testing.T, c *computeclient.Client, in putIn) (*client.SecretVersion, error) {
	t.Helper()
	req := &client.SecretsPutInput{TenantId: in.tenant, Name: in.name, Value: in.value, IdempotencyKey: in.key}
	if in.fleet {
		req.Scope = client.NewOptSecretsPutInputScope(client.SecretsPutInputScopeFleet)
	}
	res, err := c.SecretsPut(t.Context(), req)
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

func mustPut(t *testing.T, c *computeclient.Client, in putIn) *client.SecretVersion {
	t.Helper()
	v, err := put(t, c, in)
	require.NoError(t, err)
	return v
}

func del(t *testing.T, c *computeclient.Client, tenant, name string, fleet bool) (bool, error) {
	t.Helper()
	req := &client.SecretsDeleteInput{TenantId: tenant, Name: name}
	if fleet {
		req.Scope = client.NewOptSecretsDeleteInputScope(client.SecretsDeleteInputScopeFleet)
	}
	res, err := c.SecretsDelete(t.Context(), req)
	if err != nil {
		return false, err
	}
	return res.Data.Deleted, nil
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(), query, args...).Scan(&n))
	return n
}

func (f *fixture) versions(t *testing.T, ref string) int {
	return f.count(t, "SELECT count(*) FROM secret_versions WHERE reference = $1", ref)
}

func (f *fixture) events(t *testing.T, typ, ref string) int {
	return f.count(t, "SELECT count(*) FROM outbox WHERE type = $1 AND subject = $2", typ, ref)
}

// eventData returns the payloads of an event type for a reference, oldest first.
func (f *fixture) eventData(t *testing.T, typ, ref string) []map[string]any {
	t.Helper()
	rows, err := f.env.Store.Pool().Query(t.Context(), "SELECT data::text FROM outbox WHERE type = $1 AND subject = $2 ORDER BY seq", typ, ref)
	require.NoError(t, err)
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(s), &m))
		out = append(out, m)
	}
	require.NoError(t, rows.Err())
	return out
}

func (f *fixture) resolve(t *testing.T, tenant, ref string) (string, int64, error) {
	t.Helper()
	v, version, err := f.resolver.Resolve(t.Context(), db.New(f.env.Store.Pool()), tenant, ref)
	return string(v), version, err
}

func serviceCode(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		return string(e.Code)
	}
	return ""
}

func TestPutWritesVersionsAndPublishes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	v1 := mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "db-password", value: "first value", key: "k1"})
	assert.Equal(t, "secret://tenants/acme/db-password", v1.Reference)
	assert.Equal(t, int64(1), v1.Version)
	v2 := mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "db-password", value: "second value", key: "k2"})
	assert.Equal(t, v1.Reference, v2.Reference)
	assert.Equal(t, int64(2), v2.Version, "a second put with the same name writes a new version")
	assert.Equal(t, 2, f.versions(t, v1.Reference))

	// The head records the store and the current version.
	var store string
	var version int64
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(),
		"SELECT store, version FROM secrets WHERE reference = $1", v1.Reference).Scan(&store, &version))
	assert.Equal(t, "database", store)
	assert.Equal(t, int64(2), version)

	// Events carry reference, name and version only.
	data := f.eventData(t, "security.secret.put", v1.Reference)
	require.Len(t, data, 2)
	for i, d := range data {
		assert.Equal(t, map[string]any{"reference": v1.Reference, "name": "db-password", "version": float64(i + 1)}, d)
	}
	var tenant, source string
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(),
		"SELECT tenant_id, source FROM outbox WHERE subject = $1 LIMIT 1", v1.Reference).Scan(&tenant, &source))
	assert.Equal(t, "acme", tenant)
	assert.Equal(t, "computeplane/secrets", source)

	// Audit rows name the secret by its reference.
	assert.Equal(t, 2, f.count(t,
		"SELECT count(*) FROM audit_log WHERE method = 'secrets.put' AND resource_type = 'compute-secret' AND resource_id = $1 AND tenant_id = 'acme'",
		v1.Reference))

	// The resolver reads the current version.
	value, ver, err := f.resolve(t, "acme", v1.Reference)
	require.NoError(t, err)
	assert.Equal(t, "second value", value)
	assert.Equal(t, int64(2), ver)

	// Names are per tenant: globex's secret of the same name is its own.
	g := mustPut(t, f.globex, putIn{tenant: "globex", name: "db-password", value: "globex value", key: "k1"})
	assert.Equal(t, "secret://tenants/globex/db-password", g.Reference)
	assert.Equal(t, int64(1), g.Version)
}

func TestRetryWithTheCurrentKeyWritesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := putIn{tenant: "acme", name: "api-token", value: "v-one", key: "k1"}
	mustPut(t, f.acmeMember, in)
	in.key, in.value = "k2", "v-two"
	cur := mustPut(t, f.acmeMember, in)
	require.Equal(t, int64(2), cur.Version)

	// The retry of the put that wrote the current version returns it.
	again := mustPut(t, f.acmeMember, in)
	assert.Equal(t, *cur, *again)
	// The key is not scoped to the identity: another caller's retry with
	// the same value is a retry too.
	other := mustPut(t, f.acmeOwner, putIn{tenant: "acme", name: "api-token", value: "v-two", key: "k2"})
	assert.Equal(t, *cur, *other)
	// The same key with another value is no retry: CONFLICT (the general
	// Idempotency rule), whoever calls.
	for _, c := range []*computeclient.Client{f.acmeMember, f.acmeOwner} {
		_, err := put(t, c, putIn{tenant: "acme", name: "api-token", value: "something else", key: "k2"})
		e := testenv.APIError(t, err)
		assert.Equal(t, "CONFLICT", e.Code)
		assert.Equal(t, 409, e.Status)
		assert.NotContains(t, e.Message, "something else", "never the value")
	}
	assert.Equal(t, 2, f.versions(t, cur.Reference), "no version written")
	assert.Equal(t, 2, f.events(t, "security.secret.put", cur.Reference), "nothing published")
	value, _, err := f.resolve(t, "acme", cur.Reference)
	require.NoError(t, err)
	assert.Equal(t, "v-two", value, "the value stays")

	// The key of an older version is no retry: it writes a new version.
	in.key, in.value = "k1", "v-three"
	v3 := mustPut(t, f.acmeMember, in)
	assert.Equal(t, int64(3), v3.Version)
	assert.Equal(t, 3, f.versions(t, cur.Reference))
	assert.Equal(t, 3, f.events(t, "security.secret.put", cur.Reference))
	value, ver, err := f.resolve(t, "acme", cur.Reference)
	require.NoError(t, err)
	assert.Equal(t, "v-three", value)
	assert.Equal(t, int64(3), ver)
}

func TestFleetScope(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := putIn{tenant: "root", name: "registry-token", value: "fleet value", key: "k1", fleet: true}
	v := mustPut(t, f.root, in)
	assert.Equal(t, "secret://fleet/registry-token", v.Reference)
	assert.Equal(t, int64(1), v.Version)
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM secrets WHERE reference = $1 AND tenant_id = 'root' AND scope = 'fleet'", v.Reference))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM outbox WHERE subject = $1 AND tenant_id = 'root'", v.Reference))

	// The root tenant's tenant secret of the same name is another secret.
	own := mustPut(t, f.root, putIn{tenant: "root", name: "registry-token", value: "root's own", key: "k1"})
	assert.Equal(t, "secret://tenants/root/registry-token", own.Reference)
	assert.Equal(t, int64(1), own.Version)

	// Decided on compute-fleet/global: a root viewer is refused; a tenant
	// owner asking for scope fleet in its tenant is INVALID_INPUT first
	// (validation runs before authentication).
	_, err := put(t, f.acmeOwner, putIn{tenant: "acme", name: "registry-token", value: "x", key: "k1", fleet: true})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = put(t, f.rootViewer, in)
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = del(t, f.acmeOwner, "acme", "registry-token", true)
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	// Only in the root tenant.
	_, err = put(t, f.root, putIn{tenant: "acme", name: "registry-token", value: "x", key: "k1", fleet: true})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Message, "root tenant")
	_, err = del(t, f.root, "acme", "registry-token", true)
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	assert.Equal(t, 1, f.versions(t, v.Reference))

	// Fleet secrets resolve for the root tenant (fleet-level consumers) only.
	value, _, err := f.resolve(t, "root", v.Reference)
	require.NoError(t, err)
	assert.Equal(t, "fleet value", value)
	_, _, err = f.resolve(t, "acme", v.Reference)
	assert.Equal(t, "NOT_FOUND", serviceCode(err))

	deleted, err := del(t, f.root, "root", "registry-token", true)
	require.NoError(t, err)
	assert.True(t, deleted)
	value, _, err = f.resolve(t, "root", own.Reference)
	require.NoError(t, err)
	assert.Equal(t, "root's own", value, "the tenant secret stays")
}

func TestAccess(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ref := mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "n", value: "v", key: "k1"}).Reference
	_, err := put(t, f.acmeViewer, putIn{tenant: "acme", name: "n", value: "v", key: "k2"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err), "viewers do not manage secrets")
	_, err = del(t, f.acmeViewer, "acme", "n", false)
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = put(t, f.globex, putIn{tenant: "acme", name: "n", value: "v", key: "k2"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err), "another tenant")
	_, err = del(t, f.globex, "acme", "n", false)
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	anonymous := f.env.Client(t, computeclient.WithToken("unused"),
		computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Del("Authorization") }))
	_, err = put(t, anonymous, putIn{tenant: "acme", name: "n", value: "v", key: "k2"})
	assert.Equal(t, "UNAUTHENTICATED", code(t, err))
	assert.Equal(t, 1, f.versions(t, ref))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM outbox"))

	// Another member of the tenant writes the next version; the fleet
	// operators act in every tenant.
	assert.Equal(t, int64(2), mustPut(t, f.acmeMember2, putIn{tenant: "acme", name: "n", value: "v", key: "k2"}).Version)
	assert.Equal(t, int64(3), mustPut(t, f.root, putIn{tenant: "acme", name: "n", value: "v", key: "k3"}).Version)

	// A tenant's secret does not resolve for another tenant, nor for root.
	for _, tenant := range []string{"globex", "root"} {
		_, _, err := f.resolve(t, tenant, ref)
		assert.Equal(t, "NOT_FOUND", serviceCode(err), tenant)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := func(name, value, key string) putIn { return putIn{tenant: "acme", name: name, value: value, key: key} }

	// value: 1 to 65536 characters.
	_, err := put(t, f.acmeMember, in("n", "", "k"))
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code, "empty value")
	assert.Equal(t, "value", e.Issues()[0].Path)
	_, err = put(t, f.acmeMember, in("n", strings.Repeat("v", 65537), "k"))
	assert.Equal(t, "INVALID_INPUT", code(t, err), "65537 characters")
	// A request body is at most 64 KiB (Limits), so the largest value that
	// reaches the method is 64 KiB less the rest of the body; a value of
	// 65536 characters can only be refused by the body limit. The schema
	// bound itself is checked on the decoder in TestValueBoundOfTheSchema.
	overhead := len(`{"idempotencyKey":"k","name":"n","tenantId":"acme","value":""}`)
	largest := strings.Repeat("v", rpc.MaxBody-overhead)
	v := mustPut(t, f.acmeMember, in("n", largest, "k"))
	value, _, err := f.resolve(t, "acme", v.Reference)
	require.NoError(t, err)
	assert.Equal(t, largest, value)
	_, err = put(t, f.acmeMember, in("n", largest+"v", "k2"))
	e = testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Message, "body exceeds")
	_, err = put(t, f.acmeMember, in("n", strings.Repeat("v", 65536), "k2"))
	e = testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code, "65536 characters exceed the 64 KiB body")
	assert.Contains(t, e.Message, "body exceeds")
	// Characters, not bytes: 2-byte characters.
	_, err = put(t, f.acmeMember, in("multi", strings.Repeat("é", 20000), "k"))
	require.NoError(t, err)

	// name: SecretName.
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "a b", "a:b", "ä", strings.Repeat("n", 129)} {
		_, err = put(t, f.acmeMember, in(bad, "v", "k"))
		assert.Equal(t, "INVALID_INPUT", code(t, err), "name %q", bad)
		_, err = del(t, f.acmeMember, "acme", bad, false)
		assert.Equal(t, "INVALID_INPUT", code(t, err), "delete name %q", bad)
	}
	for _, good := range []string{"A", "0", "a.b_c-D9", strings.Repeat("n", 128)} {
		v, err := put(t, f.acmeMember, in(good, "v", "k"))
		require.NoError(t, err, good)
		assert.Equal(t, "secret://tenants/acme/"+good, v.Reference)
	}
	// idempotencyKey: IdemKeyB, required; scope: tenant or fleet.
	_, err = put(t, f.acmeMember, in("n", "v", ""))
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = put(t, f.acmeMember, in("n", "v", "a key"))
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = put(t, f.acmeMember, in("n", "v", strings.Repeat("k", 129)))
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = f.acmeMember.SecretsPut(t.Context(), &client.SecretsPutInput{
		TenantId: "acme", Name: "n", Value: "v", IdempotencyKey: "k", Scope: client.NewOptSecretsPutInputScope("project"),
	})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = put(t, f.acmeMember, in("n", "v", "k~/+=:.-_1"))
	require.NoError(t, err, "the whole IdemKeyB alphabet")
}

func TestValueBoundOfTheSchema(t *testing.T) {
	t.Parallel()
	m := api.Lookup("/secrets/put")
	require.NotNil(t, m)
	for n, ok := range map[int]bool{0: false, 1: true, 65536: true, 65537: false} {
		var iss wire.Issues
		m.Decode(map[string]any{"tenantId": "acme", "name": "n", "value": strings.Repeat("é", n), "idempotencyKey": "k"}, &iss)
		assert.Equal(t, ok, iss.Empty(), "%d characters: %v", n, iss.List)
	}
}

func TestDelete(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := putIn{tenant: "acme", name: "n", value: "v1", key: "k1"}
	mustPut(t, f.acmeMember, in)
	in.key, in.value = "k2", "v2"
	v := mustPut(t, f.acmeMember, in)

	deleted, err := del(t, f.acmeMember, "acme", "n", false)
	require.NoError(t, err)
	assert.True(t, deleted)
	assert.Zero(t, f.versions(t, v.Reference), "every version goes")
	data := f.eventData(t, "security.secret.deleted", v.Reference)
	require.Len(t, data, 1)
	assert.Equal(t, map[string]any{"reference": v.Reference, "name": "n", "version": float64(2)}, data[0], "the last version")
	_, _, err = f.resolve(t, "acme", v.Reference)
	assert.Equal(t, "NOT_FOUND", serviceCode(err))

	// Again: none exists.
	deleted, err = del(t, f.acmeMember, "acme", "n", false)
	require.NoError(t, err)
	assert.False(t, deleted)
	deleted, err = del(t, f.acmeMember, "acme", "never-was", false)
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Equal(t, 1, f.events(t, "security.secret.deleted", v.Reference), "no second event")

	// A later put continues after the last version, and the key of the
	// deleted current version is no retry.
	again := mustPut(t, f.acmeMember, in)
	assert.Equal(t, int64(3), again.Version)
	value, ver, err := f.resolve(t, "acme", v.Reference)
	require.NoError(t, err)
	assert.Equal(t, "v2", value)
	assert.Equal(t, int64(3), ver)
	assert.Equal(t, 1, f.versions(t, v.Reference))
}

func TestNoStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	f := setup(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "secrets: {store: none}\n")))
	require.Equal(t, "none", string(f.env.Config.Secrets.Store))

	_, err := put(t, f.acmeMember, putIn{tenant: "acme", name: "n", value: "v", key: "k"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "UNAVAILABLE", e.Code)
	assert.Equal(t, 503, e.Status)
	require.NotNil(t, e.RetryAfterMs, "UNAVAILABLE always carries its retry hint (the Errors table)")
	assert.Positive(t, *e.RetryAfterMs)
	_, err = del(t, f.acmeMember, "acme", "n", false)
	assert.Equal(t, "UNAVAILABLE", code(t, err))
	// The decision and the input come first.
	_, err = put(t, f.acmeViewer, putIn{tenant: "acme", name: "n", value: "v", key: "k"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = put(t, f.root, putIn{tenant: "acme", name: "n", value: "v", key: "k", fleet: true})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM secrets"))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM outbox"))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM audit_log"))

	_, _, err = f.resolve(t, "acme", "secret://tenants/acme/n")
	assert.Equal(t, "UNAVAILABLE", serviceCode(err))
}

func TestSecretInAnotherStoreIsInvalidState(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := putIn{tenant: "acme", name: "n", value: "v", key: "k1"}
	v := mustPut(t, f.acmeMember, in)
	_, err := f.env.Store.Pool().Exec(t.Context(), "UPDATE secrets SET store = 'vault' WHERE reference = $1", v.Reference)
	require.NoError(t, err)

	_, err = put(t, f.acmeMember, putIn{tenant: "acme", name: "n", value: "v", key: "k2"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_STATE", e.Code)
	assert.Contains(t, e.Message, "vault")
	_, err = put(t, f.acmeMember, in)
	assert.Equal(t, "INVALID_STATE", code(t, err), "even the retry")
	_, err = del(t, f.acmeMember, "acme", "n", false)
	assert.Equal(t, "INVALID_STATE", code(t, err))
	_, _, err = f.resolve(t, "acme", v.Reference)
	assert.Equal(t, "INVALID_STATE", serviceCode(err))
	assert.Equal(t, 1, f.versions(t, v.Reference))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM outbox"))

	// Back in this store, it is managed again.
	_, err = f.env.Store.Pool().Exec(t.Context(), "UPDATE secrets SET store = 'database' WHERE reference = $1", v.Reference)
	require.NoError(t, err)
	deleted, err := del(t, f.acmeMember, "acme", "n", false)
	require.NoError(t, err)
	assert.True(t, deleted)
	// A tombstone lives in no store: a put revives it in this one.
	_, err = f.env.Store.Pool().Exec(t.Context(), "UPDATE secrets SET store = 'vault' WHERE reference = $1", v.Reference)
	require.NoError(t, err)
	deleted, err = del(t, f.acmeMember, "acme", "n", false)
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Equal(t, int64(2), mustPut(t, f.acmeMember, in).Version)
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM secrets WHERE reference = $1 AND store = 'database'", v.Reference))
}

func TestConcurrentPutsGetConsecutiveVersions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const n = 16
	for _, name := range []string{"fresh", "existing"} {
		start := 0
		if name == "existing" {
			mustPut(t, f.acmeMember, putIn{tenant: "acme", name: name, value: "v0", key: "k-first"})
			start = 1
		}
		got := make([]int64, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				v, err := put(t, f.acmeMember, putIn{tenant: "acme", name: name, value: fmt.Sprintf("value-%d", i), key: fmt.Sprintf("k%d", i)})
				errs[i] = err
				if err == nil {
					got[i] = v.Version
				}
			})
		}
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
		}
		slices.Sort(got)
		want := make([]int64, n)
		for i := range want {
			want[i] = int64(start + i + 1)
		}
		assert.Equal(t, want, got, "%s: versions %d..%d, no gaps, no duplicates", name, start+1, start+n)
		ref := "secret://tenants/acme/" + name
		assert.Equal(t, start+n, f.versions(t, ref))
		assert.Equal(t, start+n, f.events(t, "security.secret.put", ref))
		// Each version opens to the value of the put that wrote it.
		_, ver, err := f.resolve(t, "acme", ref)
		require.NoError(t, err)
		assert.Equal(t, int64(start+n), ver)
	}
}

func TestResolver(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "n", value: "acme value", key: "k"})
	g := mustPut(t, f.globex, putIn{tenant: "globex", name: "n", value: "globex value", key: "k"})

	value, ver, err := f.resolve(t, "acme", a.Reference)
	require.NoError(t, err)
	assert.Equal(t, "acme value", value)
	assert.Equal(t, int64(1), ver)

	for _, bad := range []string{"", "secret://", "secret://tenants/acme/a/b", "vault://x", "secret://tenants/acme/ n"} {
		_, _, err := f.resolve(t, "acme", bad)
		assert.Equal(t, "INVALID_INPUT", serviceCode(err), bad)
	}
	_, _, err = f.resolve(t, "acme", "secret://tenants/acme/missing")
	assert.Equal(t, "NOT_FOUND", serviceCode(err))

	// A sealed value moved to another row does not open: the reference and
	// version are its additional data.
	_, err = f.env.Store.Pool().Exec(t.Context(), `
		UPDATE secret_versions g SET nonce = a.nonce, sealed = a.sealed
		FROM secret_versions a WHERE a.reference = $1 AND g.reference = $2`, a.Reference, g.Reference)
	require.NoError(t, err)
	_, _, err = f.resolve(t, "globex", g.Reference)
	require.Error(t, err)
	assert.Empty(t, serviceCode(err), "an internal error, not a service answer")
	assert.NotContains(t, err.Error(), "acme value")

	// Under another service secret nothing opens.
	other := secrets.New("root", secrets.StoreDatabase, keys.Derive("another-service-secret-0123456789", keys.Secrets))
	_, _, err = other.Resolve(t.Context(), db.New(f.env.Store.Pool()), "acme", a.Reference)
	require.Error(t, err)

	// A tampered ciphertext does not open.
	_, err = f.env.Store.Pool().Exec(t.Context(),
		"UPDATE secret_versions SET sealed = set_byte(sealed, 0, get_byte(sealed, 0) # 1) WHERE reference = $1", a.Reference)
	require.NoError(t, err)
	_, _, err = f.resolve(t, "acme", a.Reference)
	require.Error(t, err)
}

// TestPlaintextIsNowhere puts distinctive values through every path, the
// refused ones included, then looks for them, and for their base64 and hex
// forms, in every column of every table of every schema, every log line,
// every outbox event and every response body: none is found.
func TestPlaintextIsNowhere(t *testing.T) {
	t.Parallel()
	f := setup(t)
	canary := "plaintext-canary-" + strings.ReplaceAll(t.Name(), "/", "") + "-7f3a9c2e51d84b06"
	fleetCanary := "fleet-canary-c0ffee-" + hex.EncodeToString([]byte("distinct"))

	// Writes that commit.
	v := mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "db-password", value: canary, key: "k1"})
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "db-password", value: canary, key: "k2"})
	mustPut(t, f.acmeOwner, putIn{tenant: "acme", name: "db-password", value: canary, key: "k2"}) // retry
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "second", value: canary, key: "k1"})
	mustPut(t, f.root, putIn{tenant: "root", name: "fleet-token", value: fleetCanary, key: "k1", fleet: true})
	deleted, err := del(t, f.acmeMember, "acme", "second", false)
	require.NoError(t, err)
	require.True(t, deleted)
	// Refusals of every kind, carrying the value.
	_, err = put(t, f.acmeViewer, putIn{tenant: "acme", name: "db-password", value: canary, key: "k3"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = put(t, f.globex, putIn{tenant: "acme", name: "db-password", value: canary, key: "k3"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = put(t, f.root, putIn{tenant: "acme", name: "db-password", value: canary, key: "k3", fleet: true})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = put(t, f.acmeMember, putIn{tenant: "acme", name: "bad/name", value: canary, key: "k3"})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = put(t, f.acmeMember, putIn{tenant: "acme", name: "db-password", value: canary, key: "bad key"})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "elsewhere", value: canary, key: "k1"})
	_, err = f.env.Store.Pool().Exec(t.Context(), "UPDATE secrets SET store = 'vault' WHERE name = 'elsewhere'")
	require.NoError(t, err)
	_, err = put(t, f.acmeMember, putIn{tenant: "acme", name: "elsewhere", value: canary, key: "k2"})
	assert.Equal(t, "INVALID_STATE", code(t, err))

	// The values are stored: the resolver reads them back.
	got, _, err := f.resolve(t, "acme", v.Reference)
	require.NoError(t, err)
	require.Equal(t, canary, got)
	got, _, err = f.resolve(t, "root", "secret://fleet/fleet-token")
	require.NoError(t, err)
	require.Equal(t, fleetCanary, got)

	needles := map[string]string{}
	for _, plain := range []string{canary, fleetCanary} {
		for name, form := range forms(plain) {
			needles[plain[:5]+" "+name] = form
		}
	}
	scan := func(where string, haystack []byte) {
		t.Helper()
		for name, needle := range needles {
			assert.Falsef(t, bytes.Contains(haystack, []byte(needle)), "%s holds the value (%s)", where, name)
		}
	}

	// The scan sees every schema and bytea columns too: a control table
	// holding the value in a schema of its own is found, then dropped.
	for _, stmt := range []string{"CREATE SCHEMA scan_control", "CREATE TABLE scan_control.t (b bytea)"} {
		_, err = f.env.Store.Pool().Exec(t.Context(), stmt)
		require.NoError(t, err)
	}
	_, err = f.env.Store.Pool().Exec(t.Context(), "INSERT INTO scan_control.t VALUES ($1)", []byte(canary))
	require.NoError(t, err)
	found := f.tablesHolding(t, []byte(hex.EncodeToString([]byte(canary))))
	assert.Equal(t, []string{`scan_control.t`}, found, "the control row is found")
	_, err = f.env.Store.Pool().Exec(t.Context(), "DROP SCHEMA scan_control CASCADE")
	require.NoError(t, err)

	// Every table of every schema, each row cast to text.
	tables := f.tables(t)
	require.Contains(t, tables, "public.secrets")
	require.Contains(t, tables, "public.secret_versions")
	require.Contains(t, tables, "public.outbox")
	require.Contains(t, tables, "public.audit_log")
	for _, tb := range tables {
		for _, row := range f.rows(t, tb) {
			scan("table "+tb, row)
		}
	}
	// Every log line.
	logs := f.env.Logs()
	require.NotEmpty(t, logs)
	for i, line := range strings.Split(logs, "\n") {
		scan(fmt.Sprintf("log line %d", i+1), []byte(line))
	}
	// Every outbox event, rendered as sinks and /watch see it.
	q := db.New(f.env.Store.Pool())
	// Outbox rows are read once their transactions are behind the
	// cluster-wide horizon, which parallel tests can hold back a moment.
	require.Eventually(t, func() bool {
		rows, err := outbox.Committed(t.Context(), q, "", outbox.Position{}, 1000)
		return err == nil && len(rows) >= 6
	}, 10*time.Second, 10*time.Millisecond)
	events := 0
	for _, tenant := range []string{"acme", "root", "globex"} {
		rows, err := outbox.Committed(t.Context(), q, tenant, outbox.Position{}, 1000)
		require.NoError(t, err)
		for _, row := range rows {
			ev := row.Event
			events++
			raw, err := json.Marshal(ev)
			require.NoError(t, err)
			scan("event "+ev.ID, raw)
			var data map[string]any
			require.NoError(t, json.Unmarshal(ev.Data, &data))
			assert.ElementsMatch(t, []string{"reference", "name", "version"}, slices.Collect(maps.Keys(data)), "only reference, name and version")
		}
	}
	assert.Equal(t, 6, events, "5 versions written, 1 delete")
	// Every response body.
	bodies := f.rec.all()
	assert.GreaterOrEqual(t, len(bodies), 13)
	for i, b := range bodies {
		scan(fmt.Sprintf("response %d", i+1), b)
	}
}

// forms are the ways a value could show up: itself, hex, and base64 in
// every alphabet, padded or not, at each of the three alignments a value
// inside a longer encoded blob can have.
func forms(plain string) map[string]string {
	out := map[string]string{
		"plain": plain,
		"hex":   hex.EncodeToString([]byte(plain)),
		"HEX":   strings.ToUpper(hex.EncodeToString([]byte(plain))),
	}
	for name, enc := range map[string]*base64.Encoding{
		"base64": base64.StdEncoding, "base64url": base64.URLEncoding,
		"base64raw": base64.RawStdEncoding, "base64rawurl": base64.RawURLEncoding,
	} {
		out[name] = enc.EncodeToString([]byte(plain))
		for shift := range 3 {
			// The middle of the encoding of the value preceded by shift
			// bytes: the same characters whatever came before it.
			s := enc.EncodeToString(append(make([]byte, shift), plain...))
			from := 4 * ((shift + 2) / 3) // the first group of value bytes only
			out[fmt.Sprintf("%s@%d", name, shift)] = s[from : len(s)-4]
		}
	}
	return out
}

// tables lists every base table of every schema but PostgreSQL's own.
func (f *fixture) tables(t *testing.T) []string {
	t.Helper()
	rows, err := f.env.Store.Pool().Query(t.Context(), `
		SELECT quote_ident(table_schema) || '.' || quote_ident(table_name)
		FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')
		ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// rows returns each row of table cast to text: every column, bytea as hex.
func (f *fixture) rows(t *testing.T, table string) [][]byte {
	t.Helper()
	rows, err := f.env.Store.Pool().Query(t.Context(), "SELECT t::text FROM "+table+" t")
	require.NoError(t, err)
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, []byte(s))
	}
	require.NoError(t, rows.Err())
	return out
}

func (f *fixture) tablesHolding(t *testing.T, needle []byte) []string {
	t.Helper()
	var out []string
	for _, tb := range f.tables(t) {
		for _, row := range f.rows(t, tb) {
			if bytes.Contains(row, needle) {
				out = append(out, tb)
				break
			}
		}
	}
	return out
}
