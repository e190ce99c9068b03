package sandboxvolumes_test

// sandboxVolumes.list, get and the diskGiB quota through the client, on a
// host whose volume store reported room (no daemon needed for these).

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/nodes"
	"computeplane/internal/testenv"
)

func TestListScopesAndQuota(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ann := env.Client(t, computeclient.WithToken(env.Key(t, tenant, "ann", "owner")))
	mo := env.Client(t, computeclient.WithToken(env.Key(t, tenant, "mo", "member")))
	globex := env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner")))
	ctx := t.Context()
	site, err := ann.SitesCreate(ctx, &client.SitesCreateInput{TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	pools := make([]string, 2)
	for i, limit := range []int64{1000, 3} {
		p, err := ann.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: tenant, SiteId: site.Data.SiteId, Name: []string{"big", "small"}[i],
			Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: []string{"big", "small"}[i],
			OwnerLimits: client.NewOptLimits(client.Limits{DiskGiB: client.NewOptInt64(limit)})})
		require.NoError(t, err)
		pools[i] = p.Data.PoolId
		n, err := nodes.Register(ctx, env.Store, env.Host.Identity().Projection(), env.Config.TypePrefix,
			nodes.Registration{PoolID: pools[i], Hostname: "h" + p.Data.Name, VCPU: 4, MemoryMiB: 4096, DiskGiB: 1000})
		require.NoError(t, err)
		_, err = env.Store.Pool().Exec(ctx, `update nodes set volume_available_bytes = 1099511627776, volume_reserved_bytes = 0,
			volume_outstanding_bytes = 0, volume_reported_at = now() where node_id = $1`, n.NodeID)
		require.NoError(t, err)
	}
	create := func(c *computeclient.Client, pool, name string, size int64) (client.SandboxVolume, error) {
		res, err := c.SandboxVolumesCreate(ctx, &client.SandboxVolumesCreateInput{TenantId: tenant, PoolId: pool, Name: name, SizeGiB: size, IdempotencyKey: name})
		if err != nil {
			return client.SandboxVolume{}, err
		}
		return res.Data, nil
	}
	a1, err := create(ann, pools[0], "a1", 1)
	require.NoError(t, err)
	_, err = create(mo, pools[0], "m1", 1)
	require.NoError(t, err)
	a2, err := create(ann, pools[1], "a2", 2)
	require.NoError(t, err)

	// Past the pool's diskGiB quota: QUOTA_EXCEEDED, nothing left behind.
	_, err = create(ann, pools[1], "a3", 2)
	assert.Equal(t, "QUOTA_EXCEEDED", testenv.APIError(t, err).Code)
	// A growth past it too (the charge comes before the host's booking):
	// QUOTA_EXCEEDED, the volume and the quota as they were.
	_, err = ann.SandboxVolumesResize(ctx, &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: a2.VolumeId, SizeGiB: 4})
	assert.Equal(t, "QUOTA_EXCEEDED", testenv.APIError(t, err).Code)
	got, err := ann.SandboxVolumesGet(ctx, &client.SandboxVolumesGetInput{TenantId: tenant, VolumeId: a2.VolumeId})
	require.NoError(t, err)
	assert.EqualValues(t, 2, got.Data.SizeGiB)
	q, err := ann.QuotasGet(ctx, &client.QuotasGetInput{TenantId: tenant, PoolId: pools[1], Resource: client.QuotasGetInputResourceDiskGiB})
	require.NoError(t, err)
	assert.EqualValues(t, 2, q.Data.Used)

	names := func(c *computeclient.Client, in client.SandboxVolumesListInput) []string {
		t.Helper()
		in.TenantId = tenant
		res, err := c.SandboxVolumesList(ctx, &in)
		require.NoError(t, err)
		var out []string
		for _, v := range res.Data.Items {
			out = append(out, v.Name)
		}
		return out
	}
	all := client.NewOptSandboxVolumesListInputScope(client.SandboxVolumesListInputScopeAll)
	assert.Equal(t, []string{"a1", "a2"}, names(ann, client.SandboxVolumesListInput{}), "mine, oldest first")
	assert.Equal(t, []string{"m1"}, names(mo, client.SandboxVolumesListInput{}))
	assert.Equal(t, []string{"a1", "m1", "a2"}, names(ann, client.SandboxVolumesListInput{Scope: all}))
	assert.Equal(t, []string{"a2"}, names(ann, client.SandboxVolumesListInput{Scope: all, PoolId: client.NewOptString(pools[1])}))

	// Deleted ones only when asked.
	_, err = env.Store.Pool().Exec(ctx, `update sandbox_volumes set state = 'deleted' where volume_id = $1`, a1.VolumeId)
	require.NoError(t, err)
	assert.Equal(t, []string{"a2"}, names(ann, client.SandboxVolumesListInput{}))
	assert.Equal(t, []string{"a1", "a2"}, names(ann, client.SandboxVolumesListInput{IncludeDeleted: client.NewOptBool(true)}))

	// Another tenant's volume is NOT_FOUND.
	_, err = globex.SandboxVolumesGet(ctx, &client.SandboxVolumesGetInput{TenantId: "globex", VolumeId: a2.VolumeId})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
}
