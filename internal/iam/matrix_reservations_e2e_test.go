package iam_test

// Matrix rows of the reservations group.

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
	"computeplane/internal/reservations"
)

// reservable returns a pool of tenant with a flavor and a node with room
// for it (the prepared pool and flavor, once there are some: refused calls
// never reach placement).
func (fx *fixture) reservable(t *testing.T, tenant string) (pool, flavor string) {
	t.Helper()
	if _, ok := fx.prepared["flavor/"+tenant]; ok {
		return fx.pooledFlavor(t, tenant)
	}
	pool, flavor = fx.pooledFlavor(t, tenant)
	_, err := nodes.Register(t.Context(), fx.env.Store, fx.env.Host.Identity().Projection(), fx.env.Config.TypePrefix,
		nodes.Registration{PoolID: pool, Hostname: fx.unique(), VCPU: 64, MemoryMiB: 262144, DiskGiB: 10000})
	require.NoError(t, err)
	return pool, flavor
}

// reservation writes a placed reservation of tenant with its projection
// entry (owned by no one).
func (fx *fixture) reservation(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["reservation/"+tenant]; ok {
		return id
	}
	pool, flavor := fx.pooledFlavor(t, tenant)
	id := ids.New("rsv")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into reservations (reservation_id, tenant_id, pool_id, flavor, count, priority, whole, start_at, state, created_by, idem_request)
			values ($1, $2, $3, $4, 1, 'on-demand', false, now(), 'placed', 'fixture', '{}')`, id, tenant, pool, flavor); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + reservations.ResourceType, ID: id, TenantID: tenant,
			Parent: &iam.Ref{Type: fx.env.Config.TypePrefix + "pool", ID: pool}, Attributes: map[string]string{"poolId": pool},
		})
	}), "fixture: a reservation in %s", tenant)
	return id
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["reservation/"+tenant] = fx.reservation(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodReservationsCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			pool, flavor := fx.reservable(t, tenant)
			return c.ReservationsCreate(t.Context(), &client.ReservationsCreateInput{TenantId: tenant, PoolId: pool, Flavor: flavor,
				IdempotencyKey: fx.unique()})
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			r := res.(*client.ReservationsCreateResult).Data
			assert.Equal(t, tenant, r.TenantId)
			assert.Equal(t, "active", string(r.State))
		},
	}}
	matrix[api.MethodReservationsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ReservationsGet(t.Context(), &client.ReservationsGetInput{TenantId: tenant,
				ReservationId: fx.keep("reservation", tenant, func() string { return fx.reservation(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.ReservationsGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodReservationsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.ReservationsList(t.Context(), &client.ReservationsListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, r := range res.(*client.ReservationsListResult).Data.Items {
				assert.Equal(t, tenant, r.TenantId)
			}
		},
	}}
	matrix[api.MethodReservationsCancel] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ReservationsCancel(t.Context(), &client.ReservationsCancelInput{TenantId: tenant, ReservationId: fx.reservation(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "cancelled", string(res.(*client.ReservationsCancelResult).Data.State))
		},
	}}
}
