package instances_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
)

// maxRoundTrips is what instances.create makes today (fleettest.RoundTripGoal is
// the most it may): the test fails above it.
const maxRoundTrips = 3

// maxDeleteRoundTrips is what instances.delete makes today: the booking's
// release travels with the desired state and the node's spec reads, the
// refunds and the usage's end with the statements after them.
const maxDeleteRoundTrips = 5

// TestCreateRoundTrips: instances.create, counted on the wire by computed
// (compute_rpc_db_round_trips), makes at most maxRoundTrips round trips,
// placed on a node (a daemon with the recording runtime) or in a
// reservation's unit; a replay of the same key makes fewer. instances.delete
// of either makes at most maxDeleteRoundTrips, and gives the quota back.
func TestCreateRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.Metrics())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	node := f.Join(pool, "--runtime", "recording", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "100").Node
	create := func(key string, reservation string) client.Instance {
		in := &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: pool, Flavor: "small", ImageId: "computeplane/minimal",
			Name: key, IdempotencyKey: key, Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone)}
		if reservation != "" {
			in.ReservationId = client.NewOptString(reservation)
		}
		res, err := f.C.InstancesCreate(t.Context(), in)
		require.NoError(t, err)
		return res.Data
	}
	create("warm-up", "") // the caller's decision is cached from here on

	var made client.Instance
	var placed []string
	n := f.FewestRoundTrips("instances.create", node, 3, func(i int) {
		made = create(fmt.Sprintf("i%d", i), "")
		placed = append(placed, made.InstanceId)
	})
	fleettest.AtMostRoundTrips(t, "instances.create (placed, network none)", n, maxRoundTrips)
	assert.Equal(t, "pending", string(made.State))
	assert.Equal(t, 1, f.Events("instance.created", made.InstanceId))

	replay := f.CallRoundTrips("instances.create", func() { assert.Equal(t, made.InstanceId, create("i2", "").InstanceId) })
	fleettest.RecordRoundTrips(t, "instances.create, replayed (same key)", replay)
	assert.LessOrEqual(t, replay, n)

	res, err := f.C.ReservationsCreate(t.Context(), &client.ReservationsCreateInput{TenantId: fleettest.Tenant, PoolId: pool, Flavor: "small",
		Count: client.NewOptInt64(3), IdempotencyKey: "r1"})
	require.NoError(t, err)
	var inUnits []string
	n = f.FewestRoundTrips("instances.create", node, 3, func(i int) {
		made = create(fmt.Sprintf("in-reservation-%d", i), res.Data.ReservationId)
		inUnits = append(inUnits, made.InstanceId)
	})
	fleettest.AtMostRoundTrips(t, "instances.create (in a reservation's unit)", n, maxRoundTrips)
	assert.Equal(t, res.Data.ReservationId, made.ReservationId.Value)

	used := func(resource string) (n int64) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(used), 0) from quotas where tenant_id = $1 and pool_id = $2 and resource = $3`,
			fleettest.Tenant, pool, resource).Scan(&n))
		return n
	}
	instancesBefore := used("instances")
	del := func(ids []string) func(i int) {
		return func(i int) {
			_, err := f.C.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: fleettest.Tenant, InstanceId: ids[i]})
			require.NoError(t, err)
		}
	}
	n = f.FewestRoundTrips("instances.delete", node, 3, del(placed))
	fleettest.AtMostRoundTrips(t, "instances.delete (placed)", n, maxDeleteRoundTrips)
	n = f.FewestRoundTrips("instances.delete", node, 3, del(inUnits))
	fleettest.AtMostRoundTrips(t, "instances.delete (in a reservation's unit)", n, maxDeleteRoundTrips)
	assert.Equal(t, instancesBefore-6, used("instances"), "each delete gave its instance back")
	assert.Equal(t, 1, f.Events("instance.deleted", placed[0]))
}
