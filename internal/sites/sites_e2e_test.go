package sites_test

// The rules of the specification's sites section, its state table and the
// Limits rows that apply, through the generated client over HTTP against
// the real host and PostgreSQL.

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

type fixture struct {
	env                     *testenv.Env
	root, acmeOwner         *computeclient.Client
	acmeMember, acmeMember2 *computeclient.Client
	acmeViewer, globex      *computeclient.Client
}

func setup(t *testing.T) *fixture {
	t.Helper()
	env := testenv.Start(t)
	c := func(tenant, identity, role string) *computeclient.Client {
		return env.Client(t, computeclient.WithToken(env.Key(t, tenant, identity, role)))
	}
	return &fixture{
		env:         env,
		root:        c("root", "ops", "admin"),
		acmeOwner:   c("acme", "olivia", "owner"),
		acmeMember:  c("acme", "mia", "member"),
		acmeMember2: c("acme", "max", "member"),
		acmeViewer:  c("acme", "vic", "viewer"),
		globex:      c("globex", "gus", "owner"),
	}
}

func create(t *testing.T, c *computeclient.Client, tenant, kind, region, key string) (*client.Site, error) {
	t.Helper()
	res, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: tenant, Kind: client.SitesCreateInputKind(kind), Region: region, IdempotencyKey: key,
	})
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

func mustCreate(t *testing.T, c *computeclient.Client, tenant, kind, region, key string) *client.Site {
	t.Helper()
	s, err := create(t, c, tenant, kind, region, key)
	require.NoError(t, err)
	return s
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(), query, args...).Scan(&n))
	return n
}

func (f *fixture) events(t *testing.T, typ, subject string) int {
	return f.count(t, "SELECT count(*) FROM outbox WHERE type = $1 AND subject = $2", typ, subject)
}

func TestCreateCustomSite(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	assert.Regexp(t, `^site_[0-9a-hjkmnp-tv-z]{26}$`, s.SiteId)
	assert.Equal(t, "acme", s.TenantId)
	assert.Equal(t, client.SiteKindCustom, s.Kind)
	assert.Equal(t, "eu-west", s.IamRegion, "iamRegion defaults to region")
	assert.Equal(t, int64(1), s.Version)
	assert.False(t, s.Tombstoned)

	// Published in the same transaction, carrying the site.
	assert.Equal(t, 1, f.events(t, "site.created", s.SiteId))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM audit_log WHERE method = 'sites.create' AND resource_id = $1", s.SiteId))
	// Region and kind are attributes in the projection; the creator owns it.
	var attrs, owner string
	var draft bool
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(),
		"SELECT attributes::text, owner_id, draft FROM iam.resources WHERE type = 'compute-site' AND id = $1", s.SiteId).
		Scan(&attrs, &owner, &draft))
	assert.JSONEq(t, `{"kind":"custom","region":"eu-west"}`, attrs)
	assert.Equal(t, "mia", owner)
	assert.False(t, draft)

	got, err := f.acmeViewer.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: s.SiteId})
	require.NoError(t, err)
	assert.Equal(t, *s, got.Data)

	withIAM := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k-iam")
	assert.Equal(t, "eu-west", withIAM.IamRegion)
	res, err := f.acmeMember.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k-iam2",
		IamRegion: client.NewOptString("eu-central"),
	})
	require.NoError(t, err)
	assert.Equal(t, "eu-central", res.Data.IamRegion)
}

func TestIdDerivesFromTenantIdentityAndKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "same-key")
	b := mustCreate(t, f.acmeMember2, "acme", "custom", "eu-west", "same-key")
	c := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "other-key")
	assert.NotEqual(t, a.SiteId, b.SiteId, "another identity with the same key makes another site")
	assert.NotEqual(t, a.SiteId, c.SiteId)
}

func TestRetryReturnsTheSiteWithoutASecondDecision(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	// The member loses the right to create; a retry is not decided again.
	_, err := f.env.Store.Pool().Exec(t.Context(),
		"UPDATE iam.role_bindings SET role = 'viewer' WHERE tenant_id = 'acme' AND identity_id = 'mia'")
	require.NoError(t, err)
	again := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	assert.Equal(t, *first, *again)
	assert.Equal(t, 1, f.events(t, "site.created", first.SiteId), "no second event")
	_, err = create(t, f.acmeMember, "acme", "custom", "eu-west", "k2")
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code, "a new create is decided")
}

func TestSameKeyDifferentRequestIsConflict(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	_, err := create(t, f.acmeMember, "acme", "custom", "us-east", "k1")
	e := testenv.APIError(t, err)
	assert.Equal(t, "CONFLICT", e.Code)
	assert.Equal(t, "region", e.Details["field"])

	_, err = f.acmeMember.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k1",
		IamRegion: client.NewOptString("eu-west"),
	})
	assert.Equal(t, "iamRegion", testenv.APIError(t, err).Details["field"], "an IAM region given versus absent differs")

	root := mustCreate(t, f.root, "root", "shared", "eu-west", "rk")
	_, err = create(t, f.root, "root", "dedicated", "eu-west", "rk")
	assert.Equal(t, "kind", testenv.APIError(t, err).Details["field"])
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM sites WHERE site_id = $1", root.SiteId))
	assert.Equal(t, 2, f.count(t, "SELECT count(*) FROM outbox WHERE type = 'site.created'"), "conflicts publish nothing")
}

func TestPlatformSitesAreDecidedOnTheFleetInTheRootTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// The generated client insists on a credential: drop it on the wire.
	anonymous := f.env.Client(t, computeclient.WithToken("dropped"),
		computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Del("Authorization") }))
	for _, kind := range []string{"shared", "dedicated"} {
		_, err := create(t, f.acmeOwner, "root", kind, "eu-west", "k-"+kind)
		assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code, "decided on compute-fleet/global: %s", kind)
		_, err = create(t, f.root, "acme", kind, "eu-west", "k-"+kind)
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, "its tenantId must be the root tenant")
		assert.Contains(t, e.Message, "root tenant")
		// Validation runs before authentication: callers who would also
		// be refused, or who have no credential, hear INVALID_INPUT.
		for name, c := range map[string]*computeclient.Client{"tenant owner": f.acmeOwner, "viewer": f.acmeViewer, "other tenant": f.globex, "no credential": anonymous} {
			_, err = create(t, c, "acme", kind, "eu-west", "k-"+kind)
			e = testenv.APIError(t, err)
			assert.Equal(t, "INVALID_INPUT", e.Code, "%s: %s", kind, name)
			assert.Equal(t, "kind: "+kind+" is only for the root tenant root, not tenant acme", e.Message, name)
		}
	}
	assert.Zero(t, f.count(t, "SELECT count(*) FROM iam.resources WHERE draft"), "no draft left behind")
	shared := mustCreate(t, f.root, "root", "shared", "eu-west", "s1")
	dedicated := mustCreate(t, f.root, "root", "dedicated", "eu-west", "d1")

	// Every tenant sees shared platform sites; dedicated ones stay the root's.
	_, err := f.acmeViewer.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: shared.SiteId})
	require.NoError(t, err)
	_, err = f.acmeViewer.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: dedicated.SiteId})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	list, err := f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 1)
	assert.Equal(t, shared.SiteId, list.Data.Items[0].SiteId)
	// Nobody but the fleet changes them.
	_, err = f.acmeOwner.SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "acme", SiteId: shared.SiteId, Region: client.NewOptString("us-east")})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
}

func TestOtherTenantsSitesAreNotFound(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	_, err := f.globex.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "globex", SiteId: s.SiteId})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	_, err = f.globex.SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "globex", SiteId: s.SiteId, Region: client.NewOptString("us-east")})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	_, err = f.globex.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: "globex", SiteId: s.SiteId})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	// Naming the other tenant is refused before any data is read.
	_, err = f.globex.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: s.SiteId})
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	// A site that never existed.
	_, err = f.acmeViewer.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: "site_0000000000000000000000000z"})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	// The fleet operators act in every tenant, naming it.
	got, err := f.root.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: s.SiteId})
	require.NoError(t, err)
	assert.Equal(t, s.SiteId, got.Data.SiteId)
}

func update(t *testing.T, c *computeclient.Client, in client.SitesUpdateInput) (*client.Site, error) {
	t.Helper()
	res, err := c.SitesUpdate(t.Context(), &in)
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

func TestUpdateRules(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	base := client.SitesUpdateInput{TenantId: "acme", SiteId: s.SiteId}

	_, err := update(t, f.acmeMember, base)
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code, "no change named")

	both := base
	both.IamRegion, both.ClearIamRegion = client.NewOptString("eu-central"), client.NewOptBool(true)
	_, err = update(t, f.acmeMember, both)
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "iamRegion and clearIamRegion")

	stale := base
	stale.Region, stale.Version = client.NewOptString("us-east"), client.NewOptInt64(7)
	_, err = update(t, f.acmeMember, stale)
	e = testenv.APIError(t, err)
	assert.Equal(t, "CONFLICT", e.Code, "stale version")

	noop := base
	noop.Region = client.NewOptString("eu-west")
	same, err := update(t, f.acmeMember, noop)
	require.NoError(t, err)
	assert.Equal(t, int64(1), same.Version, "a no-op returns the site unchanged")
	assert.Zero(t, f.events(t, "site.updated", s.SiteId))

	change := base
	change.IamRegion, change.Version = client.NewOptString("eu-central"), client.NewOptInt64(1)
	changed, err := update(t, f.acmeMember, change)
	require.NoError(t, err)
	assert.Equal(t, int64(2), changed.Version)
	assert.Equal(t, "eu-central", changed.IamRegion)
	assert.Equal(t, "eu-west", changed.Region)
	assert.Equal(t, 1, f.events(t, "site.updated", s.SiteId))

	clearIAM := base
	clearIAM.ClearIamRegion = client.NewOptBool(true)
	cleared, err := update(t, f.acmeMember, clearIAM)
	require.NoError(t, err)
	assert.Equal(t, "eu-west", cleared.IamRegion, "cleared: back to region")
	assert.Equal(t, int64(3), cleared.Version)

	moved := base
	moved.Region = client.NewOptString("us-east")
	m, err := update(t, f.acmeMember, moved)
	require.NoError(t, err)
	assert.Equal(t, "us-east", m.Region)
	var attrs string
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(),
		"SELECT attributes->>'region' FROM iam.resources WHERE type = 'compute-site' AND id = $1", s.SiteId).Scan(&attrs))
	assert.Equal(t, "us-east", attrs, "the projection follows")

	// Members change only what they own; admins and owners change anything.
	_, err = update(t, f.acmeMember2, moved)
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	_, err = update(t, f.acmeViewer, moved)
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	byOwner := base
	byOwner.Region = client.NewOptString("ap-south")
	_, err = update(t, f.acmeOwner, byOwner)
	require.NoError(t, err)
}

func TestDeleteStateTable(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	_, err := f.acmeMember.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: "acme", SiteId: s.SiteId, Version: client.NewOptInt64(5)})
	assert.Equal(t, "CONFLICT", testenv.APIError(t, err).Code, "stale version")

	res, err := f.acmeMember.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: "acme", SiteId: s.SiteId, Version: client.NewOptInt64(1)})
	require.NoError(t, err)
	assert.True(t, res.Data.Deleted)
	assert.False(t, res.Data.Tombstoned, "nothing references it: removed")
	assert.Equal(t, 1, f.events(t, "site.deleted", s.SiteId))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM sites WHERE site_id = $1", s.SiteId))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM iam.resources WHERE id = $1", s.SiteId), "leaves the projection")

	// Deleted is NOT_FOUND for reads and updates; a retried delete answers deleted false.
	_, err = f.acmeMember.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: s.SiteId})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	_, err = update(t, f.acmeOwner, client.SitesUpdateInput{TenantId: "acme", SiteId: s.SiteId, Region: client.NewOptString("us-east")})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	again, err := f.acmeOwner.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: "acme", SiteId: s.SiteId})
	require.NoError(t, err)
	assert.False(t, again.Data.Deleted)
	assert.Equal(t, 1, f.events(t, "site.deleted", s.SiteId), "no second event")
}

func TestListPagesCursorsAndFilters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var made []string
	for i := range 5 {
		region := "eu-west"
		if i%2 == 1 {
			region = "us-east"
		}
		made = append(made, mustCreate(t, f.acmeMember, "acme", "custom", region, "k"+string(rune('a'+i))).SiteId)
	}
	mustCreate(t, f.globex, "globex", "custom", "eu-west", "g1")

	var seen []string
	var cursor client.OptString
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		res, err := f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme", Limit: client.NewOptInt64(2), Cursor: cursor})
		require.NoError(t, err)
		assert.LessOrEqual(t, len(res.Data.Items), 2)
		for _, s := range res.Data.Items {
			seen = append(seen, s.SiteId)
		}
		next, ok := res.Data.Cursor.Get()
		if !ok {
			break
		}
		cursor = client.NewOptString(next)
	}
	sorted := append([]string{}, made...)
	slices.Sort(sorted)
	assert.Equal(t, sorted, seen, "every visible site once, in id order; no other tenant's")

	eu, err := f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme", Region: client.NewOptString("us-east")})
	require.NoError(t, err)
	assert.Len(t, eu.Data.Items, 2)
	shared, err := f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme", Kind: client.NewOptSitesListInputKind(client.SitesListInputKindShared)})
	require.NoError(t, err)
	assert.Empty(t, shared.Data.Items)

	// A cursor the method did not return, or returned for another tenant, is INVALID_INPUT.
	first, err := f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme", Limit: client.NewOptInt64(1)})
	require.NoError(t, err)
	acmeCursor := first.Data.Cursor.Value
	for _, bad := range []string{"garbage", acmeCursor[:len(acmeCursor)-2] + "xx"} {
		_, err = f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme", Cursor: client.NewOptString(bad)})
		assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, bad)
	}
	_, err = f.globex.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex", Cursor: client.NewOptString(acmeCursor)})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "bound to the tenant")

	// Pages hold at most 50; limit is 1 to 50.
	for _, limit := range []int64{0, 51} {
		_, err = f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme", Limit: client.NewOptInt64(limit)})
		assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, limit)
	}
}

func TestListLeavesOutUnreadableSites(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	b := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k2")
	// The identity service no longer lets acme read site b (its projection
	// says it is another tenant's): the list leaves it out.
	_, err := f.env.Store.Pool().Exec(t.Context(), "UPDATE iam.resources SET tenant_id = 'elsewhere' WHERE id = $1", b.SiteId)
	require.NoError(t, err)
	res, err := f.acmeViewer.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, res.Data.Items, 1)
	assert.Equal(t, a.SiteId, res.Data.Items[0].SiteId)
}

func TestLimits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := create(t, f.acmeMember, strings.Repeat("a", 129), "custom", "eu-west", "k1")
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "tenantId at most 128")
	_, err = create(t, f.acmeMember, "acme", "custom", "EU", "k1")
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "region shape")
	_, err = create(t, f.acmeMember, "acme", "custom", "eu-west", strings.Repeat("k", 129))
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "idempotency key at most 128")
	_, err = create(t, f.acmeMember, "acme", "custom", "eu-west", "a key")
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "IdemKeyB alphabet")
	_, err = create(t, f.acmeMember, "acme", "custom", "eu-west", "k~/+=:.-_1")
	require.NoError(t, err, "the whole IdemKeyB alphabet")
}

func TestRefusedCreateLeavesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tables := []string{"sites", "outbox", "audit_log", "iam.resources"}
	before := map[string]int{}
	for _, tb := range tables {
		before[tb] = f.count(t, "SELECT count(*) FROM "+tb)
	}
	_, err := create(t, f.acmeViewer, "acme", "custom", "eu-west", "k1")
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	_, err = create(t, f.globex, "acme", "custom", "eu-west", "k1")
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	_, err = create(t, f.acmeOwner, "root", "shared", "eu-west", "k1")
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code)
	_, err = create(t, f.acmeOwner, "acme", "shared", "eu-west", "k1")
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "refused before authentication")
	_, err = create(t, f.root, "acme", "shared", "eu-west", "k1")
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "refused before admission")
	for _, tb := range tables {
		assert.Equal(t, before[tb], f.count(t, "SELECT count(*) FROM "+tb), tb)
	}
}

func TestParallelCreatesWithOneKeyMakeOneSite(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const n = 16
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := create(t, f.acmeMember, "acme", "custom", "eu-west", "race")
			errs[i] = err
			if err == nil {
				ids[i] = s.SiteId
			}
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, ids[0], ids[i])
	}
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM sites"))
	assert.Equal(t, 1, f.events(t, "site.created", ids[0]))
	assert.Equal(t, 0, f.count(t, "SELECT count(*) FROM iam.resources WHERE draft"))
}

func TestParallelUpdatesWithOneVersionLetOneWin(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	const n = 12
	codes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := update(t, f.acmeMember, client.SitesUpdateInput{
				TenantId: "acme", SiteId: s.SiteId, Version: client.NewOptInt64(1),
				Region: client.NewOptString("r" + string(rune('a'+i))),
			})
			if err == nil {
				codes[i] = "OK"
			} else if e, ok := computeclient.AsError(err); ok {
				codes[i] = e.Code
			} else {
				codes[i] = err.Error()
			}
		}()
	}
	wg.Wait()
	won := 0
	for _, c := range codes {
		if c == "OK" {
			won++
		} else {
			assert.Equal(t, "CONFLICT", c)
		}
	}
	assert.Equal(t, 1, won)
	assert.Equal(t, 1, f.events(t, "site.updated", s.SiteId))
}

func TestEventsAreWrittenOnlyWhenTheChangeCommits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// A create that fails inside its transaction (the outbox write is made
	// to fail by a trigger) leaves neither the site nor its event.
	_, err := f.env.Store.Pool().Exec(t.Context(), `
		CREATE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'outbox refused'; END $$;
		CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION fail_outbox();`)
	require.NoError(t, err)
	_, err = create(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	assert.Equal(t, "INTERNAL_ERROR", testenv.APIError(t, err).Code)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM sites"))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM audit_log"))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM iam.resources WHERE type = 'compute-site'"), "the draft is dropped")
	_, err = f.env.Store.Pool().Exec(t.Context(), "DROP TRIGGER fail_outbox ON outbox")
	require.NoError(t, err)
	s := mustCreate(t, f.acmeMember, "acme", "custom", "eu-west", "k1")
	assert.Equal(t, 1, f.events(t, "site.created", s.SiteId))

	// The event is a CloudEvents envelope once rendered; its data is the site.
	var data string
	require.NoError(t, f.env.Store.Pool().QueryRow(t.Context(),
		"SELECT data::text FROM outbox WHERE subject = $1", s.SiteId).Scan(&data))
	assert.JSONEq(t, `{"siteId":"`+s.SiteId+`","kind":"custom","region":"eu-west","iamRegion":"eu-west","version":1}`, data)
}
