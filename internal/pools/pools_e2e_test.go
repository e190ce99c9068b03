package pools_test

// pools through the generated client over HTTP against the real host and a
// real PostgreSQL: every method, state change and refusal, and that a
// refusal leaves no row behind.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

type world struct {
	env          *testenv.Env
	acme, globex *computeclient.Client
	root         *computeclient.Client
	site         string // a custom site of acme
}

func setup(t *testing.T) *world {
	t.Helper()
	env := testenv.Start(t)
	w := &world{
		env:    env,
		acme:   env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner"))),
		globex: env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner"))),
		root:   env.Client(t, computeclient.WithToken(env.Key(t, env.Config.RootTenantID, "ops", "owner"))),
	}
	s, err := w.acme.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "site-1",
	})
	require.NoError(t, err)
	w.site = s.Data.SiteId
	return w
}

func (w *world) create(t *testing.T, in client.PoolsCreateInput) (*client.Pool, error) {
	t.Helper()
	if in.TenantId == "" {
		in.TenantId = "acme"
	}
	if in.SiteId == "" {
		in.SiteId = w.site
	}
	if in.Class == "" {
		in.Class = client.PoolsCreateInputClassVpsHost
	}
	res, err := w.acme.PoolsCreate(t.Context(), &in)
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

func (w *world) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, w.env.Store.Pool().QueryRow(context.Background(), "select count(*) from "+table).Scan(&n))
	return n
}

func code(t *testing.T, err error) string {
	t.Helper()
	return testenv.APIError(t, err).Code
}

func TestCreateDefaultsAndRetry(t *testing.T) {
	t.Parallel()
	w := setup(t)
	p, err := w.create(t, client.PoolsCreateInput{Name: "small", IdempotencyKey: "p1",
		OwnerLimits: client.NewOptLimits(client.Limits{Vcpu: client.NewOptInt64(64)})})
	require.NoError(t, err)
	assert.Regexp(t, `^pool_[0-9a-hjkmnp-tv-z]{26}$`, p.PoolId)
	assert.Equal(t, "acme", p.TenantId)
	assert.Equal(t, "hosted", string(p.Hosting))
	assert.Equal(t, "qemu", p.Runtime.Value)
	assert.Equal(t, "node-daemon", p.Agent.Value)
	assert.False(t, p.Archived)
	assert.False(t, p.Offered)
	assert.Equal(t, int64(1), p.Version)

	// The owner's quota rows: the given limit, the rest unlimited.
	var vcpu, mem int64
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
		`select (select max from quotas where pool_id = $1 and tenant_id = 'acme' and resource = 'vcpu'),
		        (select max from quotas where pool_id = $1 and tenant_id = 'acme' and resource = 'memoryMiB')`, p.PoolId).Scan(&vcpu, &mem))
	assert.Equal(t, int64(64), vcpu)
	assert.Equal(t, int64(1<<53-1), mem)

	again, err := w.create(t, client.PoolsCreateInput{Name: "small", IdempotencyKey: "p1",
		OwnerLimits: client.NewOptLimits(client.Limits{Vcpu: client.NewOptInt64(64)})})
	require.NoError(t, err)
	assert.Equal(t, p.PoolId, again.PoolId, "a retry returns the pool")
	_, err = w.create(t, client.PoolsCreateInput{Name: "other", IdempotencyKey: "p1"})
	assert.Equal(t, "CONFLICT", code(t, err), "the same key with another request")
	_, err = w.create(t, client.PoolsCreateInput{Name: "small", IdempotencyKey: "p2"})
	assert.Equal(t, "CONFLICT", code(t, err), "a live pool has the name")
	assert.Equal(t, 1, w.count(t, "pools"))

	// pool.created is published.
	require.Eventually(t, func() bool {
		res, err := w.acme.EventsList(t.Context(), &client.EventsListInput{TenantId: "acme", Types: []string{"pool.*"}})
		return err == nil && len(res.Data.Items) == 1 && res.Data.Items[0].Subject == p.PoolId
	}, 10*time.Second, 50*time.Millisecond)
}

func TestCreateRefusalsLeaveNothing(t *testing.T) {
	t.Parallel()
	w := setup(t)
	globexSite, err := w.globex.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "globex", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "g",
	})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		in   client.PoolsCreateInput
		code string
	}{
		"another tenant's site": {client.PoolsCreateInput{Name: "a", SiteId: globexSite.Data.SiteId, IdempotencyKey: "a"}, "NOT_FOUND"},
		"missing site":          {client.PoolsCreateInput{Name: "b", SiteId: "site_0000000000000000000000000z", IdempotencyKey: "b"}, "NOT_FOUND"},
		"provider without account": {client.PoolsCreateInput{Name: "c", Hosting: client.NewOptPoolsCreateInputHosting(client.PoolsCreateInputHostingProvider),
			IdempotencyKey: "c"}, "INVALID_INPUT"},
		"provider pool": {client.PoolsCreateInput{Name: "d", Hosting: client.NewOptPoolsCreateInputHosting(client.PoolsCreateInputHostingProvider),
			AccountId: client.NewOptString("pacct_0000000000000000000000000z"), IdempotencyKey: "d"}, "NOT_FOUND"},
		"account on a hosted pool": {client.PoolsCreateInput{Name: "e", AccountId: client.NewOptString("pacct_0000000000000000000000000z"),
			IdempotencyKey: "e"}, "INVALID_INPUT"},
		"runtime on metal": {client.PoolsCreateInput{Name: "f", Class: client.PoolsCreateInputClassMetalHost, Runtime: client.NewOptString("qemu"),
			IdempotencyKey: "f"}, "INVALID_INPUT"},
		"unknown runtime": {client.PoolsCreateInput{Name: "g", Runtime: client.NewOptString("firecracker"), IdempotencyKey: "g"}, "INVALID_INPUT"},
		"bad name":        {client.PoolsCreateInput{Name: "Not_A_Name", IdempotencyKey: "h"}, "INVALID_INPUT"},
	} {
		_, err := w.create(t, tc.in)
		assert.Equal(t, tc.code, code(t, err), name)
	}
	_, err = w.globex.PoolsCreate(t.Context(), &client.PoolsCreateInput{
		TenantId: "acme", SiteId: w.site, Name: "x", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "x",
	})
	assert.Equal(t, "ACCESS_DENIED", code(t, err), "another tenant's caller")
	assert.Zero(t, w.count(t, "pools"))
	assert.Zero(t, w.count(t, "quotas"))
	var drafts int
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select count(*) from iam.resources where type = 'compute-pool'`).Scan(&drafts))
	assert.Zero(t, drafts, "no draft is left in the projection")
}

func TestPlatformPoolInASharedSite(t *testing.T) {
	t.Parallel()
	w := setup(t)
	root := w.env.Config.RootTenantID
	shared, err := w.root.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: root, Kind: client.SitesCreateInputKindShared, Region: "eu-west", IdempotencyKey: "shared",
	})
	require.NoError(t, err)
	// A tenant may place its own pool in a shared platform site.
	p, err := w.create(t, client.PoolsCreateInput{Name: "in-shared", SiteId: shared.Data.SiteId, IdempotencyKey: "s"})
	require.NoError(t, err)
	assert.Equal(t, shared.Data.SiteId, p.SiteId)

	// The site cannot be deleted while the pool is live; archived, the
	// site is deleted but kept as a tombstone.
	_, err = w.root.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: root, SiteId: shared.Data.SiteId})
	assert.Equal(t, "INVALID_STATE", code(t, err))
	_, err = w.acme.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: "acme", PoolId: p.PoolId})
	require.NoError(t, err)
	del, err := w.root.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: root, SiteId: shared.Data.SiteId})
	require.NoError(t, err)
	assert.True(t, del.Data.Deleted)
	assert.True(t, del.Data.Tombstoned)
}

func TestGetListUpdateArchive(t *testing.T) {
	t.Parallel()
	w := setup(t)
	a, err := w.create(t, client.PoolsCreateInput{Name: "b-pool", IdempotencyKey: "1"})
	require.NoError(t, err)
	b, err := w.create(t, client.PoolsCreateInput{Name: "a-pool", Class: client.PoolsCreateInputClassMetalHost, IdempotencyKey: "2"})
	require.NoError(t, err)

	got, err := w.acme.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: "acme", PoolId: a.PoolId})
	require.NoError(t, err)
	assert.Equal(t, *a, got.Data)
	_, err = w.globex.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: "globex", PoolId: a.PoolId})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's pool")

	list, err := w.acme.PoolsList(t.Context(), &client.PoolsListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 2)
	assert.Equal(t, []string{"a-pool", "b-pool"}, []string{list.Data.Items[0].Name, list.Data.Items[1].Name}, "name order")

	up, err := w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: a.PoolId, Name: client.NewOptString("renamed"), Version: client.NewOptInt64(1)})
	require.NoError(t, err)
	assert.Equal(t, "renamed", up.Data.Name)
	assert.Equal(t, int64(2), up.Data.Version)
	_, err = w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: a.PoolId, Name: client.NewOptString("again"), Version: client.NewOptInt64(1)})
	assert.Equal(t, "CONFLICT", code(t, err), "stale version")
	_, err = w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: a.PoolId, Name: client.NewOptString("a-pool")})
	assert.Equal(t, "CONFLICT", code(t, err), "the name of another live pool")
	same, err := w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: a.PoolId, Name: client.NewOptString("renamed")})
	require.NoError(t, err)
	assert.Equal(t, int64(2), same.Data.Version, "the same name changes nothing")
	_, err = w.globex.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "globex", PoolId: a.PoolId, Name: client.NewOptString("mine")})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's pool")

	arch, err := w.acme.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: "acme", PoolId: b.PoolId})
	require.NoError(t, err)
	assert.True(t, arch.Data.Archived)
	again, err := w.acme.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: "acme", PoolId: b.PoolId})
	require.NoError(t, err)
	assert.Equal(t, arch.Data.Version, again.Data.Version, "archiving twice changes nothing")
	_, err = w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: b.PoolId, Name: client.NewOptString("zzz")})
	assert.Equal(t, "INVALID_STATE", code(t, err), "an archived pool is not renamed")
	list, err = w.acme.PoolsList(t.Context(), &client.PoolsListInput{TenantId: "acme"})
	require.NoError(t, err)
	assert.Len(t, list.Data.Items, 1, "archived pools are left out")
	list, err = w.acme.PoolsList(t.Context(), &client.PoolsListInput{TenantId: "acme", IncludeArchived: client.NewOptBool(true)})
	require.NoError(t, err)
	assert.Len(t, list.Data.Items, 2)
	// Its name is free again.
	_, err = w.create(t, client.PoolsCreateInput{Name: "a-pool", IdempotencyKey: "3"})
	require.NoError(t, err)
}

func TestOfferAndUnoffer(t *testing.T) {
	t.Parallel()
	w := setup(t)
	p, err := w.create(t, client.PoolsCreateInput{Name: "shared-pool", IdempotencyKey: "1"})
	require.NoError(t, err)
	_, err = w.globex.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: "globex", PoolId: p.PoolId})
	assert.Equal(t, "NOT_FOUND", code(t, err), "not offered yet")

	off, err := w.acme.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "globex",
		Limits: client.Limits{Vcpu: client.NewOptInt64(8), Instances: client.NewOptInt64(2)}})
	require.NoError(t, err)
	assert.True(t, off.Data.Offered)
	seen, err := w.globex.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: "globex", PoolId: p.PoolId})
	require.NoError(t, err)
	assert.True(t, seen.Data.Offered)
	assert.Equal(t, "acme", seen.Data.TenantId)
	list, err := w.globex.PoolsList(t.Context(), &client.PoolsListInput{TenantId: "globex"})
	require.NoError(t, err)
	assert.Len(t, list.Data.Items, 1)
	var rows int
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
		`select count(*) from quotas where pool_id = $1 and tenant_id = 'globex' and offered`, p.PoolId).Scan(&rows))
	assert.Equal(t, 7, rows, "one quota row per resource, 0 for those left out")

	// A max below what the tenant uses is refused.
	_, err = w.env.Store.Pool().Exec(t.Context(), `update quotas set used = 6 where pool_id = $1 and tenant_id = 'globex' and resource = 'vcpu'`, p.PoolId)
	require.NoError(t, err)
	_, err = w.acme.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "globex",
		Limits: client.Limits{Vcpu: client.NewOptInt64(4)}})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_STATE", e.Code)
	assert.Contains(t, e.Message, "limits.vcpu")
	_, err = w.acme.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "acme", Limits: client.Limits{}})
	assert.Equal(t, "INVALID_INPUT", code(t, err), "not to the owner")
	_, err = w.globex.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: "globex", PoolId: p.PoolId, ToTenantId: "initech", Limits: client.Limits{}})
	assert.Equal(t, "NOT_FOUND", code(t, err), "only the owner offers")

	un, err := w.acme.PoolsUnoffer(t.Context(), &client.PoolsUnofferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "globex"})
	require.NoError(t, err)
	assert.False(t, un.Data.Offered)
	_, err = w.globex.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: "globex", PoolId: p.PoolId})
	assert.Equal(t, "NOT_FOUND", code(t, err), "unoffered")
	var used int64
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
		`select used from quotas where pool_id = $1 and tenant_id = 'globex' and resource = 'vcpu'`, p.PoolId).Scan(&used))
	assert.Equal(t, int64(6), used, "existing work keeps its charge")

	require.Eventually(t, func() bool {
		res, err := w.acme.EventsList(t.Context(), &client.EventsListInput{TenantId: "acme", Types: []string{"pool.offered", "pool.unoffered"}})
		return err == nil && len(res.Data.Items) == 2
	}, 10*time.Second, 50*time.Millisecond, "pool.offered and pool.unoffered, once each")
}

// Racing creates: the same key from many callers makes one pool that every
// one of them gets; the same name under different keys makes one pool and
// CONFLICT for the others, never an internal error.
func TestConcurrentCreates(t *testing.T) {
	t.Parallel()
	w := setup(t)
	const n = 8
	type answer struct {
		id   string
		code string
	}
	race := func(in func(i int) client.PoolsCreateInput) []answer {
		out := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := w.create(t, in(i))
				if err != nil {
					if e, ok := computeclient.AsError(err); ok {
						out[i].code = e.Code
						return
					}
					out[i].code = err.Error()
					return
				}
				out[i].id = p.PoolId
			}()
		}
		wg.Wait()
		return out
	}
	same := race(func(int) client.PoolsCreateInput {
		return client.PoolsCreateInput{Name: "same-key", IdempotencyKey: "k"}
	})
	for _, a := range same {
		require.Empty(t, a.code)
		assert.Equal(t, same[0].id, a.id, "one pool for one key")
	}
	names := race(func(i int) client.PoolsCreateInput {
		return client.PoolsCreateInput{Name: "one-name", IdempotencyKey: fmt.Sprintf("k%d", i)}
	})
	made := 0
	for _, a := range names {
		if a.id != "" {
			made++
		} else {
			assert.Equal(t, "CONFLICT", a.code)
		}
	}
	assert.Equal(t, 1, made)
	assert.Equal(t, 2, w.count(t, "pools"))
}
