package secrets_test

// secrets.list, the root-tenant rule answered before authentication, the
// CONFLICT of a reused key with another value, and what ACCESS_DENIED says,
// through the generated client over HTTP.

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

func list(t *testing.T, c *computeclient.Client, in client.SecretsListInput) (*client.SecretList, error) {
	t.Helper()
	res, err := c.SecretsList(t.Context(), &in)
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

// anonymous is a client whose requests carry no credential (the generated
// client insists on one: it is dropped on the wire).
func (f *fixture) anonymous(t *testing.T) *computeclient.Client {
	return f.env.Client(t, computeclient.WithToken("dropped"),
		computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Del("Authorization") }))
}

func TestListNamesVersionsAndStoresNeverValues(t *testing.T) {
	t.Parallel()
	f := setup(t)
	start := time.Now().Add(-time.Minute)
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "b-token", value: "value-b-1", key: "k1"})
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "b-token", value: "value-b-2", key: "k2"})
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "a-password", value: "value-a", key: "k1"})
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "c-gone", value: "value-c", key: "k1"})
	_, err := del(t, f.acmeMember, "acme", "c-gone", false)
	require.NoError(t, err)
	mustPut(t, f.globex, putIn{tenant: "globex", name: "globex-only", value: "value-g", key: "k1"})
	mustPut(t, f.root, putIn{tenant: "root", name: "fleet-token", value: "value-f", key: "k1", fleet: true})

	got, err := list(t, f.acmeMember, client.SecretsListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, got.Items, 2, "live secrets of the tenant only: no tombstone, no other tenant's, no fleet secret")
	a, b := got.Items[0], got.Items[1]
	assert.Equal(t, "a-password", a.Name)
	assert.Equal(t, "secret://tenants/acme/a-password", a.Reference)
	assert.Equal(t, int64(1), a.Version)
	assert.Equal(t, "database", a.Store)
	assert.Equal(t, "b-token", b.Name)
	assert.Equal(t, int64(2), b.Version, "the current version")
	assert.True(t, b.UpdatedAt.After(start), b.UpdatedAt)
	assert.False(t, got.Next.Set, "one page")
	for _, body := range f.rec.all() {
		assert.NotContains(t, string(body), "value-", "no value in any answer")
	}

	// Pages by name.
	page, err := list(t, f.acmeMember, client.SecretsListInput{TenantId: "acme", Limit: client.NewOptInt64(1)})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	assert.Equal(t, "a-password", page.Items[0].Name)
	require.True(t, page.Next.Set)
	page, err = list(t, f.acmeMember, client.SecretsListInput{TenantId: "acme", Limit: client.NewOptInt64(1), After: page.Next})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	assert.Equal(t, "b-token", page.Items[0].Name)
	assert.False(t, page.Next.Set)

	// Fleet secrets: root tenant only, decided on the fleet.
	fleet, err := list(t, f.root, client.SecretsListInput{TenantId: "root", Scope: client.NewOptSecretsListInputScope(client.SecretsListInputScopeFleet)})
	require.NoError(t, err)
	require.Len(t, fleet.Items, 1)
	assert.Equal(t, "secret://fleet/fleet-token", fleet.Items[0].Reference)
	_, err = list(t, f.rootViewer, client.SecretsListInput{TenantId: "root", Scope: client.NewOptSecretsListInputScope(client.SecretsListInputScopeFleet)})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = list(t, f.acmeOwner, client.SecretsListInput{TenantId: "acme", Scope: client.NewOptSecretsListInputScope(client.SecretsListInputScopeFleet)})
	assert.Equal(t, "INVALID_INPUT", code(t, err))

	// Decided as compute:secrets:manage on the tenant, like put and delete.
	_, err = list(t, f.acmeViewer, client.SecretsListInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = list(t, f.globex, client.SecretsListInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	_, err = list(t, f.acmeMember, client.SecretsListInput{TenantId: "acme", Limit: client.NewOptInt64(501)})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
}

// Validation runs before authentication: scope fleet outside the root
// tenant is INVALID_INPUT naming the field for every caller, even one that
// would be refused or has no credential.
func TestFleetScopeOutsideTheRootTenantIsInvalidBeforeAuthentication(t *testing.T) {
	t.Parallel()
	f := setup(t)
	fleet := client.NewOptSecretsListInputScope(client.SecretsListInputScopeFleet)
	callers := map[string]*computeclient.Client{
		"non-root owner": f.acmeOwner, "viewer": f.acmeViewer, "other tenant": f.globex,
		"root admin": f.root, "no credential": f.anonymous(t),
	}
	for name, c := range callers {
		_, err := put(t, c, putIn{tenant: "acme", name: "n", value: "v", key: "k", fleet: true})
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, "put: %s", name)
		assert.Equal(t, "scope: fleet is only for the root tenant root, not tenant acme", e.Message, name)
		_, err = del(t, c, "acme", "n", true)
		assert.Equal(t, "INVALID_INPUT", code(t, err), "delete: %s", name)
		_, err = list(t, c, client.SecretsListInput{TenantId: "acme", Scope: fleet})
		assert.Equal(t, "INVALID_INPUT", code(t, err), "list: %s", name)
	}
	// Scope tenant is no input problem: then authentication and the
	// decision answer.
	_, err := put(t, f.anonymous(t), putIn{tenant: "acme", name: "n", value: "v", key: "k"})
	assert.Equal(t, "UNAUTHENTICATED", code(t, err))
	_, err = put(t, f.acmeViewer, putIn{tenant: "acme", name: "n", value: "v", key: "k"})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM secrets"))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM audit_log"))
}

// ACCESS_DENIED names the action and the resource refused; another
// tenant's objects stay NOT_FOUND.
func TestAccessDeniedSaysWhatWasRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := put(t, f.acmeViewer, putIn{tenant: "acme", name: "n", value: "v", key: "k"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "ACCESS_DENIED", e.Code)
	assert.Equal(t, "compute:secrets:manage on compute-tenant/acme refused", e.Message)
	_, err = put(t, f.rootViewer, putIn{tenant: "root", name: "n", value: "v", key: "k", fleet: true})
	e = testenv.APIError(t, err)
	assert.Equal(t, "compute:secrets:manage on compute-fleet/global refused", e.Message)
	// The tenant pre-check says the same, and names only the caller's own
	// tenant and the one it named.
	_, err = put(t, f.globex, putIn{tenant: "acme", name: "n", value: "v", key: "k"})
	e = testenv.APIError(t, err)
	assert.Equal(t, "ACCESS_DENIED", e.Code)
	assert.Equal(t, "compute:secrets:manage on compute-tenant/acme refused: tenant globex may not act in tenant acme", e.Message)

	// Another tenant's object: NOT_FOUND, and nothing said about it.
	site, err := f.acmeMember.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k1"})
	require.NoError(t, err)
	_, err = f.globex.SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "globex", SiteId: site.Data.SiteId, Region: client.NewOptString("us-east")})
	e = testenv.APIError(t, err)
	assert.Equal(t, "NOT_FOUND", e.Code)
	assert.False(t, strings.Contains(e.Message, "refused") || strings.Contains(e.Message, "acme"), e.Message)
}

// A put reusing the current version's key with another value is CONFLICT,
// also for a version written before digests were kept (compared by opening
// it); the same value is still the retry.
func TestReusedKeyWithAnotherValueIsConflict(t *testing.T) {
	t.Parallel()
	f := setup(t)
	in := putIn{tenant: "acme", name: "api-token", value: "v-one", key: "k1"}
	v1 := mustPut(t, f.acmeMember, in)
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM secret_versions WHERE reference = $1 AND length(value_digest) = 32", v1.Reference),
		"a digest is kept with the version")
	assert.Equal(t, *v1, *mustPut(t, f.acmeMember, in), "same key, same value: the retry")
	_, err := put(t, f.acmeMember, putIn{tenant: "acme", name: "api-token", value: "v-two", key: "k1"})
	assert.Equal(t, "CONFLICT", code(t, err))

	// A legacy version without a digest.
	_, err = f.env.Store.Pool().Exec(t.Context(), "UPDATE secret_versions SET value_digest = NULL WHERE reference = $1", v1.Reference)
	require.NoError(t, err)
	assert.Equal(t, *v1, *mustPut(t, f.acmeMember, in), "legacy: same value is the retry")
	_, err = put(t, f.acmeMember, putIn{tenant: "acme", name: "api-token", value: "v-two", key: "k1"})
	assert.Equal(t, "CONFLICT", code(t, err), "legacy: another value")
	assert.Equal(t, 1, f.versions(t, v1.Reference))
	assert.Equal(t, 1, f.events(t, "security.secret.put", v1.Reference))

	// Digests are keyed and bound to the reference: the same value in two
	// secrets gives two digests.
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "other", value: "v-one", key: "k1"})
	mustPut(t, f.acmeMember, putIn{tenant: "acme", name: "third", value: "v-one", key: "k1"})
	assert.Equal(t, 2, f.count(t, "SELECT count(DISTINCT value_digest) FROM secret_versions WHERE value_digest IS NOT NULL"))
}
