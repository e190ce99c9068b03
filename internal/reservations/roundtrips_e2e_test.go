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

// TestCreateRoundTrips: reservations.create, counted on the wire by
// computed (compute_rpc_db_round_trips), makes at most maxRoundTrips round
// trips when it places one unit and when it places several (a daemon with
// the recording runtime holds the capacity).
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
	n := f.FewestRoundTrips("reservations.create", agent.Node, 3, func(i int) {
		made, err = create(t, f, pool, fmt.Sprintf("r%d", i), 1, client.ReservationsCreateInputPriorityOnDemand, 0)
		require.NoError(t, err)
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
}
