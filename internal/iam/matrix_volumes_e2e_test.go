package iam_test

// Matrix rows of the sandboxVolumes group.

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/nodes"
	"computeplane/internal/sandboxvolumes"
)

// volumePool returns a pool of tenant with a host whose volume store
// reported room (the prepared pool, once there is one: refused calls never
// reach placement).
func (fx *fixture) volumePool(t *testing.T, tenant string) string {
	t.Helper()
	if _, ok := fx.prepared["pool/"+tenant]; ok {
		return fx.pool(t, tenant)
	}
	pool := fx.pool(t, tenant)
	n, err := nodes.Register(t.Context(), fx.env.Store, fx.env.Host.Identity().Projection(), fx.env.Config.TypePrefix,
		nodes.Registration{PoolID: pool, Hostname: fx.unique(), VCPU: 4, MemoryMiB: 4096, DiskGiB: 1000})
	require.NoError(t, err)
	_, err = fx.env.Store.Pool().Exec(t.Context(), `update nodes set volume_available_bytes = 1099511627776, volume_reserved_bytes = 0,
		volume_outstanding_bytes = 0, volume_reported_at = now() where node_id = $1`, n.NodeID)
	require.NoError(t, err)
	return pool
}

// volume writes a ready volume of tenant with its projection entry
// (owned by no one).
func (fx *fixture) volume(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["volume/"+tenant]; ok {
		return id
	}
	node := fx.node(t, tenant)
	id := ids.New("vol")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		var pool string
		if err := tx.QueryRow(ctx, `select pool_id from nodes where node_id = $1`, node).Scan(&pool); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `insert into sandbox_volumes (volume_id, tenant_id, pool_id, node_id, name, size_gib, serial, state, created_by, idem_request)
			values ($1, $2, $3, $4, $5, 1, $6, 'ready', 'fixture', '{}')`, id, tenant, pool, node, fx.unique(), "v"+id[4:23]); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + sandboxvolumes.ResourceType, ID: id, TenantID: tenant,
			Parent: &iam.Ref{Type: fx.env.Config.TypePrefix + "pool", ID: pool}, Attributes: map[string]string{"sizeGiB": "1"},
		})
	}), "fixture: a volume in %s", tenant)
	return id
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["volume/"+tenant] = fx.volume(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodSandboxVolumesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxVolumesCreate(t.Context(), &client.SandboxVolumesCreateInput{TenantId: tenant, PoolId: fx.volumePool(t, tenant),
				Name: fx.unique(), SizeGiB: 1, IdempotencyKey: fx.unique()})
		},
		tenantRoles: []string{owner, admin, member}, // members create under the pool (row 6: creating in T)
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			v := res.(*client.SandboxVolumesCreateResult).Data
			assert.Equal(t, tenant, v.TenantId)
			assert.Equal(t, "ready", string(v.State))
		},
	}}
	matrix[api.MethodSandboxVolumesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxVolumesGet(t.Context(), &client.SandboxVolumesGetInput{TenantId: tenant,
				VolumeId: fx.keep("volume", tenant, func() string { return fx.volume(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.SandboxVolumesGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodSandboxVolumesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.SandboxVolumesList(t.Context(), &client.SandboxVolumesListInput{TenantId: tenant,
				Scope: client.NewOptSandboxVolumesListInputScope(client.SandboxVolumesListInputScopeAll)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, v := range res.(*client.SandboxVolumesListResult).Data.Items {
				assert.Equal(t, tenant, v.TenantId)
			}
		},
	}}
	matrix[api.MethodSandboxVolumesResize] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: fx.volume(t, tenant), SizeGiB: 1})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.EqualValues(t, 1, res.(*client.SandboxVolumesResizeResult).Data.SizeGiB, "the same size: unchanged")
		},
	}}
	matrix[api.MethodSandboxVolumesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxVolumesDelete(t.Context(), &client.SandboxVolumesDeleteInput{TenantId: tenant, VolumeId: fx.volume(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "deleting", string(res.(*client.SandboxVolumesDeleteResult).Data.State))
		},
	}}
}
