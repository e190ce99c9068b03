package iam_test

// Matrix rows of the instances group. The matrix env has no image source,
// so an admitted instances.create answers INVALID_CONFIG; the other rows
// act on instances the fixture writes directly.

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
	"computeplane/internal/instances"
)

// instance writes a running instance of tenant on a node of one of its
// pools, with its projection entry (owned by no one: members read it,
// only owners and admins change it).
func (fx *fixture) instance(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["instance/"+tenant]; ok {
		return id
	}
	node := fx.node(t, tenant)
	id := ids.New("inst")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		var pool string
		if err := tx.QueryRow(ctx, `select pool_id from nodes where node_id = $1`, node).Scan(&pool); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `insert into instances (instance_id, tenant_id, pool_id, node_id, flavor, image_id, boot, name,
			vcpu, memory_mib, disk_gib, desired_state, state, created_by, idem_request)
			values ($1, $2, $3, $4, 'small', 'img', '{}', 'fixture', 1, 512, 0, 'running', 'running', 'fixture', '{}')`, id, tenant, pool, node); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + instances.ResourceType, ID: id, TenantID: tenant,
			Parent: &iam.Ref{Type: fx.env.Config.TypePrefix + "pool", ID: pool}, Attributes: map[string]string{"poolId": pool},
		})
	}), "fixture: an instance in %s", tenant)
	return id
}

// egress gives a fixture's VM row network egress with an address of its
// own (fixture rows are written without a network), so that
// setEgressPolicy applies to it.
func (fx *fixture) egress(t *testing.T, instanceID string) {
	t.Helper()
	_, err := fx.env.Store.Pool().Exec(t.Context(), `update instances set network = 'egress',
		net_address = '10.200.' || (select count(*) from instances where net_address is not null) / 250 || '.'
			|| (select count(*) from instances where net_address is not null) % 250 + 2 || '/24'
		where instance_id = $1 and network = 'none'`, instanceID)
	require.NoError(t, err)
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["instance/"+tenant] = fx.instance(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodInstancesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			pool, flavor := fx.pooledFlavor(t, tenant)
			return admittedAs(c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: tenant, PoolId: pool, Flavor: flavor,
				ImageId: "computeplane/minimal", Name: fx.unique(), IdempotencyKey: fx.unique()}))
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok:          func(*testing.T, any, string) {}, // the matrix env has no image source
	}}
	matrix[api.MethodInstancesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: tenant,
				InstanceId: fx.keep("instance", tenant, func() string { return fx.instance(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.InstancesGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodInstancesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.InstancesList(t.Context(), &client.InstancesListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, i := range res.(*client.InstancesListResult).Data.Items {
				assert.Equal(t, tenant, i.TenantId)
			}
		},
	}}
	matrix[api.MethodInstancesStart] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.InstancesStart(t.Context(), &client.InstancesStartInput{TenantId: tenant, InstanceId: fx.instance(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "running", string(res.(*client.InstancesStartResult).Data.DesiredState))
		},
	}}
	matrix[api.MethodInstancesStop] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.InstancesStop(t.Context(), &client.InstancesStopInput{TenantId: tenant, InstanceId: fx.instance(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "stopped", string(res.(*client.InstancesStopResult).Data.DesiredState))
		},
	}}
	matrix[api.MethodInstancesReboot] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.InstancesReboot(t.Context(), &client.InstancesRebootInput{TenantId: tenant, InstanceId: fx.instance(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.EqualValues(t, 1, res.(*client.InstancesRebootResult).Data.Reboots)
		},
	}}
	matrix[api.MethodInstancesSetEgressPolicy] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			id := fx.instance(t, tenant)
			fx.egress(t, id)
			return c.InstancesSetEgressPolicy(t.Context(), &client.InstancesSetEgressPolicyInput{TenantId: tenant, InstanceId: id,
				Egress: client.EgressPolicy{Allow: []string{"203.0.113.0/24"}}})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, []string{"203.0.113.0/24"}, res.(*client.InstancesSetEgressPolicyResult).Data.Egress.Allow)
		},
	}}
	matrix[api.MethodInstancesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: tenant, InstanceId: fx.instance(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "deleted", string(res.(*client.InstancesDeleteResult).Data.DesiredState))
		},
	}}
}
