package pools_test

// flavors and quotas through the HTTP API: they live on pools, so their
// end-to-end tests share this package's world.

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/placement"
)

func TestFlavors(t *testing.T) {
	t.Parallel()
	w := setup(t)
	p, err := w.create(t, client.PoolsCreateInput{Name: "p", IdempotencyKey: "1"})
	require.NoError(t, err)
	small, err := w.acme.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "acme", PoolId: p.PoolId, Name: "small", Vcpu: 2, MemoryMiB: 2048})
	require.NoError(t, err)
	assert.Equal(t, int64(0), small.Data.DiskGiB)
	assert.True(t, small.Data.Gpus.Null, "no GPUs: null")
	gpu, err := w.acme.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "acme", PoolId: p.PoolId, Name: "gpu", Vcpu: 8,
		MemoryMiB: 65536, DiskGiB: client.NewOptInt64(100), Gpus: client.NewOptGPUs(client.GPUs{Model: "L4", Count: 1})})
	require.NoError(t, err)
	assert.Equal(t, "L4", gpu.Data.Gpus.Value.Model)

	_, err = w.acme.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "acme", PoolId: p.PoolId, Name: "small", Vcpu: 1, MemoryMiB: 1})
	assert.Equal(t, "CONFLICT", code(t, err))
	_, err = w.globex.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "globex", PoolId: p.PoolId, Name: "mine", Vcpu: 1, MemoryMiB: 1})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's pool")
	_, err = w.acme.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "acme", PoolId: p.PoolId, Name: "huge", Vcpu: 2000, MemoryMiB: 1})
	assert.Equal(t, "INVALID_INPUT", code(t, err))

	got, err := w.acme.FlavorsGet(t.Context(), &client.FlavorsGetInput{TenantId: "acme", PoolId: p.PoolId, Name: "gpu"})
	require.NoError(t, err)
	assert.Equal(t, gpu.Data, got.Data)
	_, err = w.acme.FlavorsGet(t.Context(), &client.FlavorsGetInput{TenantId: "acme", PoolId: p.PoolId, Name: "none"})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.globex.FlavorsGet(t.Context(), &client.FlavorsGetInput{TenantId: "globex", PoolId: p.PoolId, Name: "gpu"})
	assert.Equal(t, "NOT_FOUND", code(t, err), "a pool not offered to the tenant")

	arch, err := w.acme.FlavorsArchive(t.Context(), &client.FlavorsArchiveInput{TenantId: "acme", PoolId: p.PoolId, Name: "small"})
	require.NoError(t, err)
	assert.True(t, arch.Data.Archived)
	list, err := w.acme.FlavorsList(t.Context(), &client.FlavorsListInput{TenantId: "acme", PoolId: p.PoolId})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 1)
	assert.Equal(t, "gpu", list.Data.Items[0].Name)

	// An offered tenant reads the pool's flavors.
	_, err = w.acme.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "globex", Limits: client.Limits{}})
	require.NoError(t, err)
	list, err = w.globex.FlavorsList(t.Context(), &client.FlavorsListInput{TenantId: "globex", PoolId: p.PoolId, IncludeArchived: client.NewOptBool(true)})
	require.NoError(t, err)
	assert.Len(t, list.Data.Items, 2)

	_, err = w.acme.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: "acme", PoolId: p.PoolId})
	require.NoError(t, err)
	_, err = w.acme.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "acme", PoolId: p.PoolId, Name: "late", Vcpu: 1, MemoryMiB: 1})
	assert.Equal(t, "INVALID_STATE", code(t, err), "an archived pool takes no new flavor")
}

func TestQuotasChargedByAdmissions(t *testing.T) {
	t.Parallel()
	w := setup(t)
	p, err := w.create(t, client.PoolsCreateInput{Name: "p", IdempotencyKey: "1"})
	require.NoError(t, err)
	_, err = w.env.Store.Pool().Exec(t.Context(), `insert into nodes (node_id, pool_id, site_id, hostname, state, cap_vcpu, cap_memory_mib, cap_disk_gib)
		values ('node_00000000000000000000000001', $1, $2, 'h1', 'ready', 16, 65536, 100)`, p.PoolId, w.site)
	require.NoError(t, err)
	_, err = w.acme.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "globex",
		Limits: client.Limits{Vcpu: client.NewOptInt64(4), MemoryMiB: client.NewOptInt64(8192)}})
	require.NoError(t, err)

	get := func(tenant, resource string) client.Quota {
		t.Helper()
		c := map[string]*computeclient.Client{"acme": w.acme, "globex": w.globex}[tenant]
		res, err := c.QuotasGet(t.Context(), &client.QuotasGetInput{TenantId: tenant, PoolId: p.PoolId, Resource: client.QuotasGetInputResource(resource)})
		require.NoError(t, err)
		return res.Data
	}
	assert.Equal(t, int64(4), get("globex", "vcpu").Max)
	assert.Equal(t, int64(0), get("globex", "gpus").Max, "left out of the offer: max 0")
	other, err := w.acme.QuotasGet(t.Context(), &client.QuotasGetInput{TenantId: "acme", PoolId: p.PoolId, Resource: client.QuotasGetInputResourceGpus})
	require.NoError(t, err)
	assert.Equal(t, int64(1<<53-1), other.Data.Max, "the owner's rows are unlimited unless given")

	// An admission charges used; the HTTP reads show it; a release refunds.
	e := placement.New(placement.Options{})
	admit := func(vcpu int32) (*placement.Booking, error) {
		var b *placement.Booking
		err := w.env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
			b, err = e.Admit(ctx, tx, placement.Request{TenantID: "globex", PoolID: p.PoolId, Owner: placement.Owner{Type: "test", ID: "x"},
				Shape: placement.Shape{VCPU: vcpu, MemoryMiB: 1024}})
			return err
		})
		return b, err
	}
	b, err := admit(3)
	require.NoError(t, err)
	assert.Equal(t, int64(3), get("globex", "vcpu").Used)
	_, err = admit(2)
	require.Error(t, err, "4 vCPU of quota: 3 used, 2 more asked")

	// quotas.set cannot go below used; the owner sees every tenant's rows.
	_, err = w.acme.QuotasSet(t.Context(), &client.QuotasSetInput{TenantId: "acme", PoolId: p.PoolId, ForTenantId: client.NewOptString("globex"),
		Resource: client.QuotasSetInputResourceVcpu, Max: 2})
	assert.Equal(t, "INVALID_STATE", code(t, err))
	set, err := w.acme.QuotasSet(t.Context(), &client.QuotasSetInput{TenantId: "acme", PoolId: p.PoolId, ForTenantId: client.NewOptString("globex"),
		Resource: client.QuotasSetInputResourceVcpu, Max: 6})
	require.NoError(t, err)
	assert.Equal(t, int64(6), set.Data.Max)
	assert.Equal(t, int64(3), set.Data.Used)
	_, err = admit(2)
	require.NoError(t, err, "the raised max admits it")
	_, err = w.globex.QuotasSet(t.Context(), &client.QuotasSetInput{TenantId: "globex", PoolId: p.PoolId, Resource: client.QuotasSetInputResourceVcpu, Max: 100})
	assert.Equal(t, "NOT_FOUND", code(t, err), "only the pool's owner sets quotas")

	owner, err := w.acme.QuotasList(t.Context(), &client.QuotasListInput{TenantId: "acme", PoolId: client.NewOptString(p.PoolId)})
	require.NoError(t, err)
	tenants := map[string]bool{}
	for _, q := range owner.Data.Items {
		tenants[q.TenantId] = true
	}
	assert.Equal(t, map[string]bool{"acme": true, "globex": true}, tenants)
	mine, err := w.globex.QuotasList(t.Context(), &client.QuotasListInput{TenantId: "globex"})
	require.NoError(t, err)
	for _, q := range mine.Data.Items {
		assert.Equal(t, "globex", q.TenantId, "a tenant sees its own rows only")
	}

	// Unoffered: no new admission, the existing charge stays until released.
	_, err = w.acme.PoolsUnoffer(t.Context(), &client.PoolsUnofferInput{TenantId: "acme", PoolId: p.PoolId, ToTenantId: "globex"})
	require.NoError(t, err)
	_, err = admit(1)
	require.Error(t, err)
	assert.Zero(t, get("acme", "vcpu").Used, "the owner holds nothing")
	require.NoError(t, w.env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) error {
		return e.Release(ctx, tx, b.ID, nil)
	}))
	var used int64
	require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(),
		`select used from quotas where pool_id = $1 and tenant_id = 'globex' and resource = 'vcpu'`, p.PoolId).Scan(&used))
	assert.Equal(t, int64(2), used, "a release refunds")
}
