package reservations_test

// Reservations end to end, as real processes (computed with every role,
// compute-agents with the recording runtime: reservations book capacity,
// they boot nothing themselves).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

const tenant = fleettest.Tenant

func create(t *testing.T, f *fleettest.Fleet, pool, key string, count int64, priority client.ReservationsCreateInputPriority, wait int64) (client.Reservation, error) {
	t.Helper()
	in := &client.ReservationsCreateInput{TenantId: tenant, PoolId: pool, Flavor: "slice", Count: client.NewOptInt64(count),
		Priority: client.NewOptReservationsCreateInputPriority(priority), IdempotencyKey: key}
	if wait > 0 {
		in.Wait = client.NewOptWait(client.Wait{TimeoutMs: wait})
	}
	res, err := f.C.ReservationsCreate(t.Context(), in)
	if err != nil {
		return client.Reservation{}, err
	}
	return res.Data, nil
}

func get(t *testing.T, f *fleettest.Fleet, id string) client.Reservation {
	t.Helper()
	res, err := f.C.ReservationsGet(t.Context(), &client.ReservationsGetInput{TenantId: tenant, ReservationId: id})
	require.NoError(t, err)
	return res.Data
}

func booked(t *testing.T, f *fleettest.Fleet, node string) (vcpu int) {
	t.Helper()
	require.NoError(t, f.DB.QueryRow(t.Context(), `select booked_vcpu from nodes where node_id = $1`, node).Scan(&vcpu))
	return vcpu
}

func quotaUsed(t *testing.T, f *fleettest.Fleet, pool string) (used int64) {
	t.Helper()
	require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(used), 0) from quotas where pool_id = $1 and resource = 'vcpu'`, pool).Scan(&used))
	return used
}

// Inline placement, spot preemption with notice, cancel.
func TestSpotPreemptedWithNoticeAndCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	f := fleettest.Start(t, "capacity: {spotNoticeMs: 2000}\n")
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "slice", 2, 1024)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "4", "--memory-mib", "4096")

	// Two spot slices fill the node.
	spot, err := create(t, f, pool, "spot", 2, client.ReservationsCreateInputPrioritySpot, 0)
	require.NoError(t, err)
	assert.Equal(t, "active", string(spot.State))
	assert.Equal(t, []string{agent.Node}, spot.NodeIds)
	assert.Equal(t, 4, booked(t, f, agent.Node))

	// A spot one more: no room, nothing to preempt for a spot: refused,
	// nothing left behind.
	_, err = create(t, f, pool, "spot-2", 1, client.ReservationsCreateInputPrioritySpot, 0)
	assert.Equal(t, "CAPACITY_UNAVAILABLE", testenv.APIError(t, err).Code)

	// An on-demand one: the spot reservation is preempted with notice; the
	// on-demand one waits queued (Queued, operation running), and wait
	// times out without an error.
	start := time.Now()
	od, err := create(t, f, pool, "od", 1, client.ReservationsCreateInputPriorityOnDemand, 300)
	require.NoError(t, err)
	assert.Equal(t, "queued", string(od.State))
	assert.Equal(t, "running", string(od.Operation.State))
	require.Len(t, od.Operation.Conditions, 1)
	assert.Equal(t, "Queued", od.Operation.Conditions[0].Type)
	s := get(t, f, spot.ReservationId)
	assert.Equal(t, "preempting", string(s.State))
	require.False(t, s.PreemptAt.Null)
	assert.Equal(t, 1, f.Events("reservation.preempting", spot.ReservationId))

	// The notice reaches the daemon (acknowledged, kept on the host) before
	// the capacity moves.
	var noticeDone time.Time
	require.Eventually(t, func() bool {
		var state string
		var finished *time.Time
		_ = f.DB.QueryRow(t.Context(), `select state, finished_at from node_commands where node_id = $1 and kind = 'notice'`, agent.Node).Scan(&state, &finished)
		if state == "succeeded" && finished != nil {
			noticeDone = *finished
			return true
		}
		return false
	}, 5*time.Second, 20*time.Millisecond)
	notices, _ := filepath.Glob(filepath.Join(agent.Dir, "notices", "*.json"))
	require.Len(t, notices, 1)
	b, err := os.ReadFile(notices[0])
	require.NoError(t, err)
	var notice map[string]any
	require.NoError(t, json.Unmarshal(b, &notice))
	assert.Equal(t, spot.ReservationId, notice["reservationId"])

	// After the notice, the capacity moves: spot preempted, on-demand placed.
	require.Eventually(t, func() bool { return get(t, f, od.ReservationId).State == "active" }, 15*time.Second, 50*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "not before spotNoticeMs")
	assert.Equal(t, "preempted", string(get(t, f, spot.ReservationId).State))
	var preemptedAt time.Time
	require.NoError(t, f.DB.QueryRow(t.Context(), `select updated_at from reservations where reservation_id = $1`, spot.ReservationId).Scan(&preemptedAt))
	assert.True(t, noticeDone.Before(preemptedAt), "the notice was acknowledged before the capacity moved")
	assert.Equal(t, 2, booked(t, f, agent.Node))
	assert.Equal(t, 1, f.Events("reservation.preempted", spot.ReservationId))

	// cancel returns the capacity and the quota at once.
	used := quotaUsed(t, f, pool)
	assert.EqualValues(t, 2, used)
	res, err := f.C.ReservationsCancel(t.Context(), &client.ReservationsCancelInput{TenantId: tenant, ReservationId: od.ReservationId})
	require.NoError(t, err)
	assert.Equal(t, "cancelled", string(res.Data.State))
	assert.Equal(t, 0, booked(t, f, agent.Node))
	assert.Zero(t, quotaUsed(t, f, pool))
	again, err := f.C.ReservationsCancel(t.Context(), &client.ReservationsCancelInput{TenantId: tenant, ReservationId: od.ReservationId})
	require.NoError(t, err)
	assert.Equal(t, "cancelled", string(again.Data.State), "cancelling twice returns it unchanged")
}

// The pool-lease placer: queued, then placed by the pool's worker; a
// window that starts later is placed, then active at its start, then
// ended.
func TestPoolLeaseQueuedThenPlaced(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	f := fleettest.Start(t, "capacity: {placer: pool-lease}\n")
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "slice", 1, 512)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "4", "--memory-mib", "4096")

	r, err := create(t, f, pool, "q", 2, client.ReservationsCreateInputPriorityOnDemand, 0)
	require.NoError(t, err)
	assert.Equal(t, "queued", string(r.State))
	assert.Equal(t, "running", string(r.Operation.State))
	require.Eventually(t, func() bool { return get(t, f, r.ReservationId).State == "active" }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, []string{agent.Node}, get(t, f, r.ReservationId).NodeIds)
	assert.Equal(t, 2, booked(t, f, agent.Node))

	// With wait: the answer comes placed.
	w, err := create(t, f, pool, "w", 1, client.ReservationsCreateInputPriorityOnDemand, 20000)
	require.NoError(t, err)
	assert.Contains(t, []string{"placed", "active"}, string(w.State))

	// A window in the future: placed now, active at its start, ended at
	// its end, its capacity back.
	startAt, endAt := time.Now().Add(2*time.Second), time.Now().Add(4*time.Second)
	later, err := f.C.ReservationsCreate(t.Context(), &client.ReservationsCreateInput{TenantId: tenant, PoolId: pool, Flavor: "slice",
		StartAt: client.NewOptDateTime(startAt), EndAt: client.NewOptDateTime(endAt), IdempotencyKey: "later"})
	require.NoError(t, err)
	id := later.Data.ReservationId
	require.Eventually(t, func() bool { return get(t, f, id).State == "placed" }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return get(t, f, id).State == "active" }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return get(t, f, id).State == "ended" }, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, 3, booked(t, f, agent.Node))
	for _, typ := range []string{"reservation.created", "reservation.placed", "reservation.active", "reservation.ended"} {
		assert.Equal(t, 1, f.Events(typ, id), typ)
	}
}

// Instances run inside a reservation's capacity: each takes one unit, on
// the unit's node, charged only the instances quota; a full reservation
// refuses the next; ending the reservation deletes its instances.
func TestInstancesRunInAReservation(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "slice", 2, 1024)
	_, err := f.C.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: tenant, PoolId: pool, Name: "big", Vcpu: 4, MemoryMiB: 1024})
	require.NoError(t, err)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "8", "--memory-mib", "8192")
	rsv, err := create(t, f, pool, "r", 1, client.ReservationsCreateInputPriorityOnDemand, 0)
	require.NoError(t, err)
	require.Equal(t, "active", string(rsv.State))
	used := func(resource string) (n int64) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select used from quotas where pool_id = $1 and resource = $2 and tenant_id = $3`, pool, resource, tenant).Scan(&n))
		return n
	}
	instance := func(key, flavor, reservation string) (client.Instance, error) {
		res, err := f.C.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: tenant, PoolId: pool, Flavor: flavor, Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone),
			ImageId: "computeplane/minimal", Name: key, ReservationId: client.NewOptString(reservation), IdempotencyKey: key})
		if err != nil {
			return client.Instance{}, err
		}
		return res.Data, nil
	}

	_, err = instance("too-big", "big", rsv.ReservationId)
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "a flavor larger than the unit")
	_, err = instance("nowhere", "slice", "rsv_"+strings.Repeat("a", 26))
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)

	in, err := instance("in", "slice", rsv.ReservationId)
	require.NoError(t, err)
	assert.Equal(t, rsv.ReservationId, in.ReservationId.Value)
	assert.Equal(t, agent.Node, in.NodeId.Value)
	assert.Equal(t, 2, booked(t, f, agent.Node), "no booking besides the reservation's")
	assert.EqualValues(t, 2, used("vcpu"), "the reservation's vCPUs, charged once")
	assert.EqualValues(t, 1, used("instances"))
	require.Eventually(t, func() bool {
		res, err := f.C.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: tenant, InstanceId: in.InstanceId})
		return err == nil && res.Data.State == "running"
	}, 10*time.Second, 50*time.Millisecond, "the daemon runs it")

	_, err = instance("second", "slice", rsv.ReservationId)
	e := testenv.APIError(t, err)
	assert.Equal(t, "CAPACITY_UNAVAILABLE", e.Code)
	assert.Equal(t, "reservation-full", e.Details["reason"])
	assert.EqualValues(t, 1, used("instances"), "the refusal left nothing behind")

	// Cancelling the reservation deletes its instance and returns its quota.
	_, err = f.C.ReservationsCancel(t.Context(), &client.ReservationsCancelInput{TenantId: tenant, ReservationId: rsv.ReservationId})
	require.NoError(t, err)
	res, err := f.C.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: tenant, InstanceId: in.InstanceId})
	require.NoError(t, err)
	assert.Equal(t, "deleted", string(res.Data.DesiredState))
	assert.Zero(t, used("instances"))
	assert.Zero(t, used("vcpu"))
	assert.Equal(t, 0, booked(t, f, agent.Node))
	assert.Equal(t, 1, f.Events("instance.deleted", in.InstanceId))
	_, err = instance("after", "slice", rsv.ReservationId)
	assert.Equal(t, "INVALID_STATE", testenv.APIError(t, err).Code, "a cancelled reservation takes no instance")
}
