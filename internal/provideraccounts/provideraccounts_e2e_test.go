package provideraccounts_test

// providerAccounts through the client against a real PostgreSQL: every
// rule of the specification's method section (create, list, get, offers,
// update, delete, bootstrap) and the bootstrap reconciler's failure path.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-faster/jx"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/builtin"
	"computeplane/internal/images"
	"computeplane/internal/pki"
	"computeplane/internal/provideraccounts"
	"computeplane/internal/testenv"
)

type world struct {
	env    *testenv.Env
	owner  *computeclient.Client
	member *computeclient.Client
	globex *computeclient.Client
	site   string
}

func setup(t *testing.T, yaml string, opts ...testenv.Option) *world {
	t.Helper()
	if yaml != "" {
		opts = append(opts, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, yaml)))
	}
	env := testenv.Start(t, append(opts, testenv.WithProviders(fakeFactory))...)
	w := &world{env: env, owner: env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner"))),
		member: env.Client(t, computeclient.WithToken(env.Key(t, "acme", "mo", "member"))),
		globex: env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gil", "owner")))}
	site, err := w.owner.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	w.site = site.Data.SiteId
	return w
}

func raw(v any) jx.Raw {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func code(t *testing.T, err error) string { t.Helper(); return testenv.APIError(t, err).Code }

var lqConfig = map[string]any{"image": "computeplane/minimal", "machineTypes": []any{
	map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256},
	map[string]any{"name": "medium", "vcpu": 2, "memoryMiB": 2048},
}}

func (w *world) account(t *testing.T, c *computeclient.Client, provider, name string, cfg any) *client.ProviderAccount {
	t.Helper()
	res, err := c.ProviderAccountsCreate(t.Context(), &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: provider, Name: name, Config: raw(cfg)})
	require.NoError(t, err)
	return &res.Data
}

func (w *world) pool(t *testing.T, name string, mutate func(*client.PoolsCreateInput)) string {
	t.Helper()
	in := &client.PoolsCreateInput{TenantId: "acme", SiteId: w.site, Name: name, Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: name}
	if mutate != nil {
		mutate(in)
	}
	res, err := w.owner.PoolsCreate(t.Context(), in)
	require.NoError(t, err)
	return res.Data.PoolId
}

func TestCreate(t *testing.T) {
	t.Parallel()
	w := setup(t, "")
	ctx := t.Context()
	key := client.NewOptString("k-1")
	in := &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "localqemu", Name: "lab", Config: raw(lqConfig), IdempotencyKey: key}
	first, err := w.owner.ProviderAccountsCreate(ctx, in)
	require.NoError(t, err)
	a := first.Data
	assert.Equal(t, "localqemu", a.Provider)
	assert.Equal(t, "lab", a.Name)
	assert.EqualValues(t, 1, a.Version)
	assert.JSONEq(t, string(raw(lqConfig)), string(a.Config))

	// A repeat returns the stored account, decided by no one: the member
	// who could not see the tenant's account is not asked again either,
	// since it is the same caller (ann) that repeats.
	again, err := w.owner.ProviderAccountsCreate(ctx, in)
	require.NoError(t, err)
	assert.Equal(t, a.AccountId, again.Data.AccountId)
	assert.Equal(t, a.CreatedAt, again.Data.CreatedAt)
	// Same key, other provider or name: CONFLICT.
	other := *in
	other.Name = "lab-2"
	assert.Equal(t, "CONFLICT", code(t, ignore(w.owner.ProviderAccountsCreate(ctx, &other))))
	other = *in
	other.Provider = "fake"
	other.Config = raw(map[string]any{"region": "x"})
	assert.Equal(t, "CONFLICT", code(t, ignore(w.owner.ProviderAccountsCreate(ctx, &other))))
	// The id derives from tenant, caller and key: another caller's key is
	// another account (whose name is taken: CONFLICT).
	e := testenv.APIError(t, ignore(w.member.ProviderAccountsCreate(ctx, in)))
	assert.Equal(t, "CONFLICT", e.Code)
	assert.Contains(t, e.Message, "name")
	// Without a key each create is a new account.
	noKey := &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "localqemu", Name: "lab-b", Config: raw(lqConfig)}
	b, err := w.owner.ProviderAccountsCreate(ctx, noKey)
	require.NoError(t, err)
	assert.NotEqual(t, a.AccountId, b.Data.AccountId)
	assert.Equal(t, "CONFLICT", code(t, ignore(w.owner.ProviderAccountsCreate(ctx, noKey))), "the name is taken")

	// An unknown provider: details.known lists the registered ones.
	e = testenv.APIError(t, ignore(w.owner.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "hetzner", Name: "h"})))
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Details["known"], "localqemu")
	assert.Contains(t, e.Details["known"], "fake")

	// A config the manifest rejects: every issue in details.issues; the
	// default config {} lacks what localqemu requires.
	e = testenv.APIError(t, ignore(w.owner.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "localqemu", Name: "bad"})))
	assert.Equal(t, "INVALID_INPUT", e.Code)
	require.NotEmpty(t, e.Details["issues"])
	bad := map[string]any{"image": "", "machineTypes": []any{map[string]any{"name": "x", "vcpu": 0, "memoryMiB": 256}}, "color": "red"}
	e = testenv.APIError(t, ignore(w.owner.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "localqemu", Name: "bad", Config: raw(bad)})))
	assert.Equal(t, "INVALID_INPUT", e.Code)
	paths := issuePaths(e.Details["issues"])
	assert.Contains(t, paths, "config.image")
	assert.Contains(t, paths, "config.machineTypes[0].vcpu")
	assert.Contains(t, paths, "config")

	// Secret-like fields: references only, at any depth and in any case.
	for name, cfg := range map[string]map[string]any{
		"a token in clear":        {"region": "eu", "apiToken": "tok-123"},
		"an ssh key nested":       {"region": "eu", "offers": []any{map[string]any{"sshKey": "ssh-ed25519 AAAA"}}},
		"a password as number":    {"region": "eu", "offers": []any{map[string]any{"rootPassword": 1234}}},
		"a malformed reference":   {"region": "eu", "apiToken": "secret://nowhere"},
		"an env reference path":   {"region": "eu", "ClientSecret": "env://A/B"},
		"another tenant's secret": {"region": "eu", "apiToken": "secret://tenants/globex/cloud-token"},
		"a fleet secret":          {"region": "eu", "apiToken": "secret://fleet/cloud-token"},
	} {
		e := testenv.APIError(t, ignore(w.owner.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "fake", Name: "f", Config: raw(cfg)})), name)
		assert.Equal(t, "INVALID_INPUT", e.Code, name)
		assert.NotEmpty(t, e.Details["issues"], name)
	}
	for i, ref := range []string{"secret://tenants/acme/cloud-token", "vault://kv/cloud#token", "env://COMPUTE_PROVIDER_TOKEN"} {
		_, err := w.owner.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "fake",
			Name: fmt.Sprintf("ref-%d", i), Config: raw(map[string]any{"region": "eu", "apiToken": ref})})
		require.NoError(t, err, ref)
	}

	// No refused create left an account behind.
	list, err := w.owner.ProviderAccountsList(ctx, &client.ProviderAccountsListInput{TenantId: "acme"})
	require.NoError(t, err)
	var names []string
	for _, x := range list.Data.Items {
		names = append(names, x.Name)
	}
	assert.Equal(t, []string{"lab", "lab-b", "ref-0", "ref-1", "ref-2"}, names, "sorted by name")
	// Stored config holds the references, never values.
	assert.Contains(t, string(list.Data.Items[2].Config), "secret://tenants/acme/cloud-token")
}

func ignore[T any](_ T, err error) error { return err }

func issuePaths(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, i := range list {
		if m, ok := i.(map[string]any); ok {
			out = append(out, fmt.Sprint(m["path"]))
		}
	}
	return out
}

func TestGetListAndTenants(t *testing.T) {
	t.Parallel()
	w := setup(t, "")
	ctx := t.Context()
	a := w.account(t, w.owner, "localqemu", "zeta", lqConfig)
	w.account(t, w.owner, "localqemu", "alpha", lqConfig)
	got, err := w.owner.ProviderAccountsGet(ctx, &client.ProviderAccountsGetInput{TenantId: "acme", AccountId: a.AccountId})
	require.NoError(t, err)
	assert.Equal(t, *a, got.Data)
	// Another tenant's or an absent account is NOT_FOUND.
	_, err = w.globex.ProviderAccountsGet(ctx, &client.ProviderAccountsGetInput{TenantId: "globex", AccountId: a.AccountId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.owner.ProviderAccountsGet(ctx, &client.ProviderAccountsGetInput{TenantId: "acme", AccountId: "pacct_0000000000000000000000000z"})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	list, err := w.globex.ProviderAccountsList(ctx, &client.ProviderAccountsListInput{TenantId: "globex"})
	require.NoError(t, err)
	assert.Empty(t, list.Data.Items)
	list, err = w.member.ProviderAccountsList(ctx, &client.ProviderAccountsListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 2)
	assert.Equal(t, "alpha", list.Data.Items[0].Name)
	// Names are per tenant.
	_, err = w.globex.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "globex", Provider: "localqemu", Name: "zeta", Config: raw(lqConfig)})
	require.NoError(t, err)
}

func offerIDs(t *testing.T, res *client.ProviderAccountsOffersResult) []string {
	t.Helper()
	var out []string
	for _, o := range res.Data.Items {
		var id string
		require.NoError(t, json.Unmarshal(o["offerId"], &id))
		out = append(out, id)
	}
	return out
}

func TestOffersAndUpdate(t *testing.T) {
	t.Parallel()
	w := setup(t, "")
	ctx := t.Context()
	a := w.account(t, w.owner, "localqemu", "lab", lqConfig)
	offers := func(q client.OptOfferQuery) (*client.ProviderAccountsOffersResult, error) {
		return w.member.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: a.AccountId, Query: q})
	}
	all, err := offers(client.OptOfferQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"small", "medium"}, offerIDs(t, all))
	// The query's filters narrow what the provider answered.
	for name, c := range map[string]struct {
		q    client.OfferQuery
		want []string
	}{
		"minVcpu":         {client.OfferQuery{MinVcpu: client.NewOptInt64(2)}, []string{"medium"}},
		"minMemoryGiB":    {client.OfferQuery{MinMemoryGiB: client.NewOptInt64(1)}, []string{"medium"}},
		"kind vps":        {client.OfferQuery{Kind: client.NewOptOfferQueryKind(client.OfferQueryKindVps)}, []string{"small", "medium"}},
		"kind metal":      {client.OfferQuery{Kind: client.NewOptOfferQueryKind(client.OfferQueryKindMetal)}, nil},
		"region local":    {client.OfferQuery{Region: client.NewOptString("local")}, []string{"small", "medium"}},
		"another region":  {client.OfferQuery{Region: client.NewOptString("eu")}, nil},
		"minGpus":         {client.OfferQuery{MinGpus: client.NewOptInt64(1)}, nil},
		"gpuModel":        {client.OfferQuery{GpuModel: client.NewOptString("L4")}, nil},
		"everything zero": {client.OfferQuery{MinGpus: client.NewOptInt64(0), MinVcpu: client.NewOptInt64(0)}, []string{"small", "medium"}},
	} {
		res, err := offers(client.NewOptOfferQuery(c.q))
		require.NoError(t, err, name)
		assert.Equal(t, c.want, offerIDs(t, res), name)
	}
	_, err = w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: "pacct_0000000000000000000000000z"})
	assert.Equal(t, "NOT_FOUND", code(t, err))

	// update: replaced, validated, version raised; provider and name stay;
	// the next call asks a client built from the new config.
	cfg2 := map[string]any{"image": "computeplane/minimal", "region": "lab-2", "machineTypes": []any{map[string]any{"name": "large", "vcpu": 4, "memoryMiB": 4096}}}
	up, err := w.owner.ProviderAccountsUpdate(ctx, &client.ProviderAccountsUpdateInput{TenantId: "acme", AccountId: a.AccountId, Config: raw(cfg2)})
	require.NoError(t, err)
	assert.EqualValues(t, 2, up.Data.Version)
	assert.Equal(t, "lab", up.Data.Name)
	assert.Equal(t, "localqemu", up.Data.Provider)
	res, err := offers(client.OptOfferQuery{})
	require.NoError(t, err)
	assert.Equal(t, []string{"large"}, offerIDs(t, res))
	e := testenv.APIError(t, ignore(w.owner.ProviderAccountsUpdate(ctx, &client.ProviderAccountsUpdateInput{TenantId: "acme", AccountId: a.AccountId,
		Config: raw(map[string]any{"image": "x"})})))
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, issuePaths(e.Details["issues"]), "config")
	_, err = w.owner.ProviderAccountsUpdate(ctx, &client.ProviderAccountsUpdateInput{TenantId: "acme", AccountId: "pacct_0000000000000000000000000z", Config: raw(cfg2)})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.globex.ProviderAccountsUpdate(ctx, &client.ProviderAccountsUpdateInput{TenantId: "globex", AccountId: a.AccountId, Config: raw(cfg2)})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	got, err := w.owner.ProviderAccountsGet(ctx, &client.ProviderAccountsGetInput{TenantId: "acme", AccountId: a.AccountId})
	require.NoError(t, err)
	assert.EqualValues(t, 2, got.Data.Version, "a refused update changed nothing")
}

// The fake provider: references resolved when the provider is called (a
// new secret version is seen by the next call, the stored config keeps the
// reference), a new client after an update, a provider failure.
func TestOffersReachTheProviderLive(t *testing.T) {
	// Not parallel: the fake provider's records are shared.
	w := setup(t, "")
	ctx := t.Context()
	_, err := w.owner.SecretsPut(ctx, &client.SecretsPutInput{TenantId: "acme", Name: "cloud-token", Value: "v1", IdempotencyKey: "p1"})
	require.NoError(t, err)
	cfg := map[string]any{"region": "eu", "apiToken": "secret://tenants/acme/cloud-token",
		"offers": []any{map[string]any{"offerId": "gpu-1", "kind": "metal", "vcpu": 32, "memoryMiB": 262144, "gpus": 8, "gpuModel": "H100"}}}
	a := w.account(t, w.owner, "fake", "cloud", cfg)
	fake.mu.Lock()
	built, seen := fake.built, len(fake.tokens)
	fake.mu.Unlock()
	q := client.NewOptOfferQuery(client.OfferQuery{Kind: client.NewOptOfferQueryKind(client.OfferQueryKindMetal), GpuModel: client.NewOptString("H100"), MinGpus: client.NewOptInt64(4)})
	res, err := w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: a.AccountId, Query: q})
	require.NoError(t, err)
	assert.Equal(t, []string{"gpu-1"}, offerIDs(t, res))
	_, err = w.owner.SecretsPut(ctx, &client.SecretsPutInput{TenantId: "acme", Name: "cloud-token", Value: "v2", IdempotencyKey: "p2"})
	require.NoError(t, err)
	_, err = w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: a.AccountId, Query: q})
	require.NoError(t, err)
	fake.mu.Lock()
	assert.Equal(t, []string{"v1", "v2"}, fake.tokens[seen:], "resolved at each call")
	assert.Equal(t, built+1, fake.built, "one client for both calls")
	last := fake.queries[len(fake.queries)-1]
	fake.mu.Unlock()
	assert.Equal(t, "metal", last.Kind, "the query reaches the provider")
	assert.EqualValues(t, 4, last.MinGPUs)
	// The stored rows hold the reference, never the value.
	var stored string
	require.NoError(t, w.env.Store.Pool().QueryRow(ctx, `select config::text from provider_accounts where account_id = $1`, a.AccountId).Scan(&stored))
	assert.Contains(t, stored, "secret://tenants/acme/cloud-token")
	assert.NotContains(t, stored, "v1")

	cfg["fail"] = true
	_, err = w.owner.ProviderAccountsUpdate(ctx, &client.ProviderAccountsUpdateInput{TenantId: "acme", AccountId: a.AccountId, Config: raw(cfg)})
	require.NoError(t, err)
	e := testenv.APIError(t, ignore(w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: a.AccountId})))
	assert.Equal(t, "PROVIDER_ERROR", e.Code)
	assert.Contains(t, e.Message, "the fake cloud is down")
	fake.mu.Lock()
	assert.Equal(t, built+2, fake.built, "the update built a new client")
	fake.mu.Unlock()

	// A reference that does not resolve fails the call, not the create.
	cfg = map[string]any{"region": "eu", "apiToken": "secret://tenants/acme/missing"}
	b := w.account(t, w.owner, "fake", "broken", cfg)
	_, err = w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: b.AccountId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	cfg = map[string]any{"region": "eu", "apiToken": "env://SERVICE_SECRET"}
	c := w.account(t, w.owner, "fake", "sneaky", cfg)
	e = testenv.APIError(t, ignore(w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: c.AccountId})))
	assert.Equal(t, "INVALID_INPUT", e.Code, "env:// never reads the service's own settings")
	t.Setenv("COMPUTE_PROVIDER_TOKEN_E2E", "from-env")
	cfg = map[string]any{"region": "eu", "apiToken": "env://COMPUTE_PROVIDER_TOKEN_E2E"}
	d := w.account(t, w.owner, "fake", "by-env", cfg)
	_, err = w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: d.AccountId})
	require.NoError(t, err)
	fake.mu.Lock()
	assert.Equal(t, "from-env", fake.tokens[len(fake.tokens)-1])
	fake.mu.Unlock()
}

func TestDelete(t *testing.T) {
	t.Parallel()
	w := setup(t, "")
	ctx := t.Context()
	a := w.account(t, w.owner, "localqemu", "lab", lqConfig)
	pool := w.pool(t, "prov", func(in *client.PoolsCreateInput) {
		in.Hosting = client.NewOptPoolsCreateInputHosting(client.PoolsCreateInputHostingProvider)
		in.AccountId = client.NewOptString(a.AccountId)
	})
	e := testenv.APIError(t, ignore(w.owner.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: "acme", AccountId: a.AccountId})))
	assert.Equal(t, "INVALID_STATE", e.Code)
	assert.EqualValues(t, 1, e.Details["pools"])
	// An instance that is not deleted keeps it too, even in an archived pool.
	_, err := w.owner.PoolsArchive(ctx, &client.PoolsArchiveInput{TenantId: "acme", PoolId: pool})
	require.NoError(t, err)
	// (instances of provider pools are not served yet: written by hand)
	_, err = w.env.Store.Pool().Exec(ctx, `insert into instances (instance_id, tenant_id, pool_id, flavor, image_id, boot, name, vcpu, memory_mib,
		disk_gib, desired_state, state, created_by, idem_request)
		values ('inst_00000000000000000000000000', 'acme', $1, 'f', 'i', '{}', 'i', 1, 256, 0, 'running', 'running', 'ann', '{}')`, pool)
	require.NoError(t, err)
	e = testenv.APIError(t, ignore(w.owner.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: "acme", AccountId: a.AccountId})))
	assert.Equal(t, "INVALID_STATE", e.Code, "an archived pool does not count, its instance does")
	assert.EqualValues(t, 0, e.Details["pools"])
	assert.EqualValues(t, 1, e.Details["instances"])
	_, err = w.env.Store.Pool().Exec(ctx, `update instances set state = 'deleted', desired_state = 'deleted' where pool_id = $1`, pool)
	require.NoError(t, err)
	_, err = w.globex.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: "globex", AccountId: a.AccountId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	del, err := w.owner.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: "acme", AccountId: a.AccountId})
	require.NoError(t, err)
	assert.True(t, del.Data.Deleted)
	_, err = w.owner.ProviderAccountsGet(ctx, &client.ProviderAccountsGetInput{TenantId: "acme", AccountId: a.AccountId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.owner.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: "acme", AccountId: a.AccountId})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	// The name is free again.
	w.account(t, w.owner, "localqemu", "lab", lqConfig)
}

// bootstrapEnv is a service with a PKI bundle and bootstrap options.
func bootstrapEnv(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	pkiFile := filepath.Join(dir, "pki.json")
	_, _, err := pki.Init(pkiFile, testenv.TestSecret, "test.local")
	require.NoError(t, err)
	return setup(t, "bootstrap: {agent: /bin/false}\n", testenv.WithEnv("SERVICE_PKI", pkiFile))
}

func TestBootstrapRules(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	// Without bootstrap options, or without PKI: INVALID_CONFIG.
	plain := setup(t, "")
	acct := plain.account(t, plain.owner, "localqemu", "lab", lqConfig)
	pool := plain.pool(t, "p", nil)
	in := &client.ProviderAccountsBootstrapInput{TenantId: "acme", AccountId: acct.AccountId, PoolId: pool, IdempotencyKey: "b", OfferId: client.NewOptString("small")}
	e := testenv.APIError(t, ignore(plain.owner.ProviderAccountsBootstrap(ctx, in)))
	assert.Equal(t, "INVALID_CONFIG", e.Code)
	assert.Contains(t, e.Message, "bootstrap")
	noPKI := setup(t, "bootstrap: {agent: /bin/false}\n", testenv.WithEnv("SERVICE_PKI", filepath.Join(t.TempDir(), "none.json")))
	acct2 := noPKI.account(t, noPKI.owner, "localqemu", "lab", lqConfig)
	in2 := *in
	in2.AccountId, in2.PoolId = acct2.AccountId, noPKI.pool(t, "p", nil)
	e = testenv.APIError(t, ignore(noPKI.owner.ProviderAccountsBootstrap(ctx, &in2)))
	assert.Equal(t, "INVALID_CONFIG", e.Code)
	assert.Contains(t, e.Message, "PKI")

	w := bootstrapEnv(t)
	a := w.account(t, w.owner, "localqemu", "lab", lqConfig)
	f := w.account(t, w.owner, "fake", "cloud", map[string]any{"region": "eu"})
	vps := w.pool(t, "vps", nil)
	metal := w.pool(t, "metal", func(in *client.PoolsCreateInput) { in.Class = client.PoolsCreateInputClassMetalHost })
	provPool := w.pool(t, "prov", func(in *client.PoolsCreateInput) {
		in.Hosting = client.NewOptPoolsCreateInputHosting(client.PoolsCreateInputHostingProvider)
		in.AccountId = client.NewOptString(a.AccountId)
	})
	archived := w.pool(t, "old", nil)
	_, err := w.owner.PoolsArchive(ctx, &client.PoolsArchiveInput{TenantId: "acme", PoolId: archived})
	require.NoError(t, err)
	gsite, err := w.globex.SitesCreate(ctx, &client.SitesCreateInput{TenantId: "globex", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "g"})
	require.NoError(t, err)
	gpool, err := w.globex.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: "globex", SiteId: gsite.Data.SiteId, Name: "g", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "g"})
	require.NoError(t, err)

	bs := func(key, account, pool string, machine, offer string) *client.ProviderAccountsBootstrapInput {
		in := &client.ProviderAccountsBootstrapInput{TenantId: "acme", AccountId: account, PoolId: pool, IdempotencyKey: key}
		if machine != "" {
			in.MachineId = client.NewOptString(machine)
		}
		if offer != "" {
			in.OfferId = client.NewOptString(offer)
		}
		return in
	}
	for name, c := range map[string]struct {
		in   *client.ProviderAccountsBootstrapInput
		code string
	}{
		"a provider that cannot bootstrap": {bs("u", f.AccountId, vps, "m-1", ""), "UNSUPPORTED"},
		"a missing account":                {bs("n1", "pacct_0000000000000000000000000z", vps, "", "small"), "NOT_FOUND"},
		"another tenant's pool":            {bs("n2", a.AccountId, gpool.Data.PoolId, "", "small"), "NOT_FOUND"},
		"a missing pool":                   {bs("n3", a.AccountId, "pool_0000000000000000000000000z", "", "small"), "NOT_FOUND"},
		"an archived pool":                 {bs("s1", a.AccountId, archived, "", "small"), "INVALID_STATE"},
		"a provider pool (no daemon)":      {bs("i1", a.AccountId, provPool, "", "small"), "INVALID_INPUT"},
		"neither machine nor offer":        {bs("i2", a.AccountId, vps, "", ""), "INVALID_INPUT"},
		"both machine and offer":           {bs("i3", a.AccountId, vps, "lq_x", "small"), "INVALID_INPUT"},
		"a malformed machine id":           {bs("i4", a.AccountId, vps, "no/slash", ""), "INVALID_INPUT"},
	} {
		_, err := w.owner.ProviderAccountsBootstrap(ctx, c.in)
		assert.Equal(t, c.code, code(t, err), name)
	}
	_, err = w.globex.ProviderAccountsBootstrap(ctx, &client.ProviderAccountsBootstrapInput{TenantId: "globex", AccountId: a.AccountId, PoolId: gpool.Data.PoolId,
		IdempotencyKey: "x", OfferId: client.NewOptString("small")})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's account")

	// Started: identifying (machineId) or claiming (offerId), with the event.
	first, err := w.owner.ProviderAccountsBootstrap(ctx, bs("ok-1", a.AccountId, vps, "lq_00000000000000000000000000", ""))
	require.NoError(t, err)
	assert.Equal(t, "identifying", first.Data.State)
	assert.True(t, first.Data.BootstrapId != "")
	second, err := w.owner.ProviderAccountsBootstrap(ctx, bs("ok-2", a.AccountId, metal, "", "small"))
	require.NoError(t, err)
	assert.Equal(t, "claiming", second.Data.State)
	assert.Equal(t, 2, w.events(t, "provider.bootstrap.started", a.AccountId))
	// A repeat returns it as it is; another request under the key is CONFLICT.
	again, err := w.owner.ProviderAccountsBootstrap(ctx, bs("ok-1", a.AccountId, vps, "lq_00000000000000000000000000", ""))
	require.NoError(t, err)
	assert.Equal(t, first.Data.BootstrapId, again.Data.BootstrapId)
	assert.Equal(t, 2, w.events(t, "provider.bootstrap.started", a.AccountId), "a repeat publishes nothing")
	_, err = w.owner.ProviderAccountsBootstrap(ctx, bs("ok-1", a.AccountId, metal, "lq_00000000000000000000000000", ""))
	assert.Equal(t, "CONFLICT", code(t, err))

	// The reconciler: the machine is not the account's, so identifying
	// fails with provider.bootstrap.failed; the repeat shows it.
	svc, err := provideraccounts.New(w.env.Config, w.env.Store, append(builtin.All().Providers, fakeFactory), images.FromConfig(w.env.Config.Images), pki.Loader(w.env.Config.PKIFile, w.env.Config.Secret), nil)
	require.NoError(t, err)
	job := svc.Job(w.env.Store, nil, slog.New(slog.DiscardHandler))
	// Only the identifying one: the claiming one is moved out of the way
	// (claiming boots a VM: bootstrap_real_e2e_test.go).
	_, err = w.env.Store.Pool().Exec(ctx, `update provider_bootstraps set next_attempt_at = now() + interval '1 hour' where bootstrap_id = $1`, second.Data.BootstrapId)
	require.NoError(t, err)
	require.NoError(t, job.Pass(ctx, noFence))
	now, err := w.owner.ProviderAccountsBootstrap(ctx, bs("ok-1", a.AccountId, vps, "lq_00000000000000000000000000", ""))
	require.NoError(t, err)
	assert.Equal(t, "failed", now.Data.State)
	assert.Contains(t, now.Data.Error.Value, "not a machine of account")
	assert.Equal(t, 1, w.events(t, "provider.bootstrap.failed", a.AccountId))

	// Claiming where the claim keeps failing (this env has no image
	// source): each failure is recorded and retried after a backoff, the
	// fifth fails the bootstrap.
	claimIn := bs("ok-2", a.AccountId, metal, "", "small")
	for attempt := 1; attempt <= provideraccounts.MaxAttempts; attempt++ {
		_, err = w.env.Store.Pool().Exec(ctx, `update provider_bootstraps set next_attempt_at = now() where bootstrap_id = $1`, second.Data.BootstrapId)
		require.NoError(t, err)
		require.NoError(t, job.Pass(ctx, noFence))
		cur, err := w.owner.ProviderAccountsBootstrap(ctx, claimIn)
		require.NoError(t, err)
		assert.Contains(t, cur.Data.Error.Value, "image source", "attempt %d", attempt)
		if attempt < provideraccounts.MaxAttempts {
			assert.Equal(t, "claiming", cur.Data.State, "attempt %d", attempt)
			var wait float64
			require.NoError(t, w.env.Store.Pool().QueryRow(ctx, `select extract(epoch from next_attempt_at - now()) from provider_bootstraps where bootstrap_id = $1`,
				second.Data.BootstrapId).Scan(&wait))
			assert.InDelta(t, float64(int(1)<<(attempt-1)), wait, 0.5, "backoff after attempt %d", attempt)
		} else {
			assert.Equal(t, "failed", cur.Data.State)
		}
	}
	assert.Equal(t, 2, w.events(t, "provider.bootstrap.failed", a.AccountId))
	assert.Zero(t, w.events(t, "provider.bootstrap.installed", a.AccountId))
}

func noFence(context.Context, pgx.Tx) error { return nil }

func (w *world) events(t *testing.T, typ, subject string) int {
	t.Helper()
	var n int
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select count(*) from outbox where type = $1 and subject = $2`, typ, subject).Scan(&n))
	return n
}

// The EC2 provider through the API, against EC2's recorded answers
// (internal/providers/ec2/testdata): offers reach the endpoint live with
// the key resolved from the tenant's secret; EC2 cannot bootstrap.
func TestEC2Account(t *testing.T) {
	t.Parallel()
	w := setup(t, "bootstrap: {agent: /bin/false}\n")
	ctx := t.Context()
	var calls []url.Values
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		require.NoError(t, r.ParseForm())
		mu.Lock()
		calls = append(calls, r.PostForm)
		mu.Unlock()
		file := "DescribeInstanceTypes-1.xml"
		if r.PostForm.Get("NextToken") == "page-2" {
			file = "DescribeInstanceTypes-2.xml"
		}
		b, err := os.ReadFile(filepath.Join("..", "providers", "ec2", "testdata", file))
		require.NoError(t, err)
		rw.Header().Set("Content-Type", "text/xml")
		_, _ = rw.Write(b)
	}))
	t.Cleanup(srv.Close)
	_, err := w.owner.SecretsPut(ctx, &client.SecretsPutInput{TenantId: "acme", Name: "aws", Value: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", IdempotencyKey: "aws"})
	require.NoError(t, err)
	cfg := map[string]any{"region": "eu-central-1", "accessKeyId": "AKIAIOSFODNN7EXAMPLE", "secretAccessKey": "secret://tenants/acme/aws", "endpoint": srv.URL}
	e := testenv.APIError(t, ignore(w.owner.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: "acme", Provider: "ec2", Name: "aws",
		Config: raw(map[string]any{"region": "eu-central-1", "accessKeyId": "AKIAIOSFODNN7EXAMPLE", "secretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"})})))
	assert.Equal(t, "INVALID_INPUT", e.Code, "a key in clear")
	assert.Equal(t, []string{"config.secretAccessKey"}, issuePaths(e.Details["issues"]))
	a := w.account(t, w.owner, "ec2", "aws", cfg)
	res, err := w.member.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: a.AccountId,
		Query: client.NewOptOfferQuery(client.OfferQuery{GpuModel: client.NewOptString("L4"), MinGpus: client.NewOptInt64(4)})})
	require.NoError(t, err)
	assert.Equal(t, []string{"g6.12xlarge"}, offerIDs(t, res))
	mu.Lock()
	assert.Len(t, calls, 2, "both pages asked")
	mu.Unlock()
	_, err = w.owner.ProviderAccountsBootstrap(ctx, &client.ProviderAccountsBootstrapInput{TenantId: "acme", AccountId: a.AccountId,
		PoolId: w.pool(t, "p", nil), IdempotencyKey: "b", OfferId: client.NewOptString("t3.micro")})
	assert.Equal(t, "UNSUPPORTED", code(t, err))
	// ec2 launches no instances: a provider pool of it takes none.
	cloud := w.pool(t, "ec2-pool", func(in *client.PoolsCreateInput) {
		in.Hosting = client.NewOptPoolsCreateInputHosting(client.PoolsCreateInputHostingProvider)
		in.AccountId = client.NewOptString(a.AccountId)
	})
	_, err = w.owner.FlavorsCreate(ctx, &client.FlavorsCreateInput{TenantId: "acme", PoolId: cloud, Name: "web", Vcpu: 1, MemoryMiB: 256})
	require.NoError(t, err)
	_, err = w.owner.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: "acme", PoolId: cloud, Flavor: "web",
		ImageId: "computeplane/minimal", Name: "web-1", IdempotencyKey: "i"})
	e = testenv.APIError(t, err)
	assert.Equal(t, "UNSUPPORTED", e.Code, e.Message)
	assert.Equal(t, "ec2", e.Details["provider"])
	_, err = w.owner.SecretsDelete(ctx, &client.SecretsDeleteInput{TenantId: "acme", Name: "aws"})
	require.NoError(t, err)
	_, err = w.owner.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: "acme", AccountId: a.AccountId})
	require.Error(t, err, "the key is resolved at each call: a deleted secret fails the next one")
}
