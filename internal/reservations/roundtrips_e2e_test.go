package reservations_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
)

// maxRoundTrips is what reservations.create makes today (fleettest.RoundTripGoal is
// the most it may): the test fails above it.
const maxRoundTrips = 4

// maxCancelRoundTrips is what reservations.cancel (the reservations'
// delete) makes today, whatever the count: the reservation's instances and
// bookings are read in one pipeline, the releases and the final state
// written in another (9 for one unit before, one more per unit).
const maxCancelRoundTrips = 6

// TestCreateRoundTrips: reservations.create, counted on the wire by
// computed (compute_rpc_db_round_trips), makes at most maxRoundTrips round
// trips when it places one unit and when it places several (a daemon with
// the recording runtime holds the capacity); reservations.cancel of one
// unit or of two makes at most maxCancelRoundTrips and gives the quota
// back.
func TestCreateRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	f := fleettest.Start(t, "", fleettest.Metrics())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "slice", 1, 512)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "8", "--memory-mib", "8192")
	_, err := create(t, f, pool, "warm-up", 1, client.ReservationsCreateInputPriorityOnDemand, 0) // the caller's decision is cached from here on
	require.NoError(t, err)

	var made client.Reservation
	var ones []string
	n := f.FewestRoundTrips("reservations.create", agent.Node, 3, func(i int) {
		made, err = create(t, f, pool, fmt.Sprintf("r%d", i), 1, client.ReservationsCreateInputPriorityOnDemand, 0)
		require.NoError(t, err)
		ones = append(ones, made.ReservationId)
	})
	fleettest.AtMostRoundTrips(t, "reservations.create (1 unit)", n, maxRoundTrips)
	for _, count := range []int64{1, 2} {
		key := fmt.Sprintf("many-%d", count)
		made, err = create(t, f, pool, key, count, client.ReservationsCreateInputPriorityOnDemand, 0)
		require.NoError(t, err)
		assert.Equal(t, "active", string(made.State))
		assert.Equal(t, []string{agent.Node}, made.NodeIds)
		assert.Equal(t, 1, f.Events("reservation.created", made.ReservationId))
		assert.Equal(t, 1, f.Events("reservation.placed", made.ReservationId))
	}

	two := made.ReservationId // many-2, of two units

	vcpu := func() (n int64) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(used), 0) from quotas where tenant_id = $1 and pool_id = $2 and resource = 'vcpu'`,
			tenant, pool).Scan(&n))
		return n
	}
	before := vcpu()
	cancel := func(id string) {
		res, err := f.C.ReservationsCancel(t.Context(), &client.ReservationsCancelInput{TenantId: tenant, ReservationId: id})
		require.NoError(t, err)
		assert.Equal(t, "cancelled", string(res.Data.State))
	}
	n = f.FewestRoundTrips("reservations.cancel", agent.Node, 3, func(i int) { cancel(ones[i]) })
	fleettest.AtMostRoundTrips(t, "reservations.cancel (1 unit)", n, maxCancelRoundTrips)
	f.SpecApplied(agent.Node)
	fleettest.AtMostRoundTrips(t, "reservations.cancel (2 units)", f.CallRoundTrips("reservations.cancel", func() { cancel(two) }), maxCancelRoundTrips)
	assert.Equal(t, before-5, vcpu(), "each cancel gave its units' vcpus back")
	assert.Equal(t, 1, f.Events("reservation.cancelled", ones[0]))
}
