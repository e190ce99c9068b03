package pools_test

// The vCPU allocation ratio through the HTTP API: pools.create and
// pools.update set it, nodes show what it allocates, and placement books
// up to it (memory never past capacity).

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/nodes"
	"computeplane/internal/placement"
	"computeplane/internal/testenv"
)

func TestVcpuAllocationRatio(t *testing.T) {
	t.Parallel()
	w := setup(t)

	// Out of bounds or finer than hundredths: INVALID_INPUT naming the
	// field, and no pool.
	for _, bad := range []float64{0.5, 16.5, 2.345} {
		_, err := w.create(t, client.PoolsCreateInput{Name: "bad", IdempotencyKey: "bad", VcpuAllocationRatio: client.NewOptFloat64(bad)})
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, bad)
		assert.Contains(t, e.Message, "vcpuAllocationRatio", bad)
	}
	assert.Zero(t, w.count(t, "pools"))
	plain, err := w.create(t, client.PoolsCreateInput{Name: "plain", IdempotencyKey: "plain"})
	require.NoError(t, err)
	assert.Equal(t, 1.0, plain.VcpuAllocationRatio, "default")

	p, err := w.create(t, client.PoolsCreateInput{Name: "sandboxes", IdempotencyKey: "sb", VcpuAllocationRatio: client.NewOptFloat64(2)})
	require.NoError(t, err)
	assert.Equal(t, 2.0, p.VcpuAllocationRatio)
	register := func(host string) string {
		n, err := nodes.Register(t.Context(), w.env.Store, w.env.Host.Identity().Projection(), w.env.Config.TypePrefix, nodes.Registration{
			PoolID: p.PoolId, Hostname: host, VCPU: 2, MemoryMiB: 2048, DiskGiB: 100,
		})
		require.NoError(t, err)
		return n.NodeID
	}
	node := func(id string) client.Node {
		res, err := w.acme.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: id})
		require.NoError(t, err)
		return res.Data
	}
	n1 := register("h1")
	got := node(n1)
	assert.EqualValues(t, 2, got.Capacity.Vcpu, "capacity stays the host's")
	assert.EqualValues(t, 4, got.AllocatableVcpu)
	assert.Equal(t, 2.0, got.VcpuAllocationRatio)

	e := placement.New(placement.Options{})
	admit := func(shape placement.Shape, whole bool) (*placement.Booking, error) {
		var b *placement.Booking
		err := w.env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
			b, err = e.Admit(ctx, tx, placement.Request{TenantID: "acme", PoolID: p.PoolId, Owner: placement.Owner{Type: "test", ID: "x"},
				Shape: shape, Whole: whole})
			return err
		})
		return b, err
	}
	refusal := func(err error) api.Code {
		var e *api.Error
		require.ErrorAs(t, err, &e)
		return e.Code
	}
	// Three 1-vCPU guests on a 2-core host; memory is not overcommitted.
	for range 3 {
		_, err := admit(placement.Shape{VCPU: 1, MemoryMiB: 512}, false)
		require.NoError(t, err)
	}
	_, err = admit(placement.Shape{VCPU: 1, MemoryMiB: 1024}, false)
	assert.Equal(t, api.CodeCapacityUnavailable, refusal(err), "512 MiB left")
	_, err = admit(placement.Shape{VCPU: 1, MemoryMiB: 512}, false)
	require.NoError(t, err, "the fourth vCPU of 2 cores x 2.0")
	_, err = admit(placement.Shape{VCPU: 1}, false)
	assert.Equal(t, api.CodeCapacityUnavailable, refusal(err), "4 of 4 vCPU booked")
	assert.EqualValues(t, 4, node(n1).Booked.Vcpu)

	// A lower ratio that would leave the node over-committed: INVALID_STATE
	// naming the node; nothing changes.
	_, err = w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: p.PoolId, VcpuAllocationRatio: client.NewOptFloat64(1.5)})
	ae := testenv.APIError(t, err)
	require.Equal(t, "INVALID_STATE", ae.Code, ae.Message)
	assert.Equal(t, n1, ae.Details["nodeId"])
	pg, err := w.acme.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: "acme", PoolId: p.PoolId})
	require.NoError(t, err)
	assert.Equal(t, 2.0, pg.Data.VcpuAllocationRatio)
	assert.EqualValues(t, 4, node(n1).AllocatableVcpu)

	// A higher one applies to the pool's nodes at once, and to the nodes
	// that join later.
	up, err := w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: p.PoolId, VcpuAllocationRatio: client.NewOptFloat64(4)})
	require.NoError(t, err)
	assert.Equal(t, 4.0, up.Data.VcpuAllocationRatio)
	assert.Equal(t, "sandboxes", up.Data.Name, "the name unchanged")
	assert.Equal(t, pg.Data.Version+1, up.Data.Version)
	assert.EqualValues(t, 8, node(n1).AllocatableVcpu)
	_, err = admit(placement.Shape{VCPU: 1}, false)
	require.NoError(t, err)
	n2 := register("h2")
	assert.EqualValues(t, 8, node(n2).AllocatableVcpu)
	assert.Equal(t, 4.0, node(n2).VcpuAllocationRatio)
	// A whole-node booking holds what the node allocates.
	b, err := admit(placement.Shape{}, true)
	require.NoError(t, err)
	assert.Equal(t, n2, b.NodeID)
	assert.EqualValues(t, 8, b.Shape.VCPU)

	// The same ratio again changes nothing; neither field, or a ratio out of
	// bounds, is INVALID_INPUT.
	same, err := w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: p.PoolId, VcpuAllocationRatio: client.NewOptFloat64(4)})
	require.NoError(t, err)
	assert.Equal(t, up.Data.Version, same.Data.Version)
	_, err = w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: p.PoolId})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = w.acme.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: "acme", PoolId: p.PoolId, VcpuAllocationRatio: client.NewOptFloat64(17)})
	ae = testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", ae.Code)
	assert.Contains(t, ae.Message, "vcpuAllocationRatio")

	// The database refuses a booking past the allocatable figure itself.
	_, err = w.env.Store.Pool().Exec(t.Context(), `update nodes set booked_vcpu = alloc_vcpu + 1 where node_id = $1`, n1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nodes_booked_within_capacity")
}
