package nodework_test

// The Registry against a real PostgreSQL: statuses meter the VMs' egress
// counters (hour by hour, resets, warm instances, other nodes), and
// command results go to the handler of their kind once.

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/dbtest"
	"computeplane/internal/nodework"
	"computeplane/internal/store"
	"computeplane/internal/usage"
)

// fixture writes a site, a pool, nodes n1 and n2, and on n1 the instances
// vps-a (tenant acme), vps-b (tenant zeta) and warm-w (a warm instance of
// acme's), on n2 vps-c (acme).
func fixture(t *testing.T) *store.Store {
	t.Helper()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	for _, sql := range []string{
		`insert into sites (site_id, tenant_id, kind, region, created_by, idem_request) values ('site_t', 'root', 'shared', 'eu', 'test', '{}')`,
		`insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		 values ('pool_t', 'root', 'site_t', 'p', 'vps-host', 'hosted', 'qemu', 'node-daemon', 'test', '{}')`,
		`insert into nodes (node_id, pool_id, site_id, hostname, state, cap_vcpu, cap_memory_mib, cap_disk_gib)
		 values ('n1', 'pool_t', 'site_t', 'h1', 'ready', 8, 8192, 100), ('n2', 'pool_t', 'site_t', 'h2', 'ready', 8, 8192, 100)`,
		`insert into instances (instance_id, tenant_id, pool_id, node_id, flavor, image_id, boot, name, vcpu, memory_mib, disk_gib,
		   desired_state, state, created_by, idem_request, kind)
		 values ('vps-a', 'acme', 'pool_t', 'n1', 'f', 'i', '{}', 'a', 1, 256, 1, 'running', 'running', 'test', '{}', 'vps'),
		        ('vps-b', 'zeta', 'pool_t', 'n1', 'f', 'i', '{}', 'b', 1, 256, 1, 'running', 'running', 'test', '{}', 'vps'),
		        ('warm-w', 'acme', 'pool_t', 'n1', 'f', 'i', '{}', 'w', 1, 256, 1, 'running', 'running', 'test', '{}', 'warm'),
		        ('vps-c', 'acme', 'pool_t', 'n2', 'f', 'i', '{}', 'c', 1, 256, 1, 'running', 'running', 'test', '{}', 'vps')`,
	} {
		_, err := st.Pool().Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	return st
}

func inTx(t *testing.T, st *store.Store, fn func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, st.WithTx(t.Context(), false, fn))
}

// counted is the vps.egress.bytes quantity per instance and hour.
func counted(t *testing.T, st *store.Store) map[string]map[time.Time]int64 {
	t.Helper()
	rows, err := st.Pool().Query(t.Context(), `select tenant_id || '/' || instance_id, hour_start, quantity from counted_usage where meter = $1`, api.MeterVpsEgressBytes)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]map[time.Time]int64{}
	for rows.Next() {
		var k string
		var h time.Time
		var q int64
		require.NoError(t, rows.Scan(&k, &h, &q))
		if out[k] == nil {
			out[k] = map[time.Time]int64{}
		}
		out[k][h.UTC()] = q
	}
	return out
}

func running(id string, tx, rx uint64) agentproto.InstanceStatus {
	return agentproto.InstanceStatus{ID: id, State: agentproto.StateRunning, EgressTxBytes: tx, EgressRxBytes: rx}
}

// TestStatusesMeterEgress: the growth of each VM's counters goes to its
// tenant's row of the hour the status came in; a counter that went down
// is a new count; a warm instance and another node's instance are not
// metered; the rollup windows closed hours with a key per row and window,
// and bytes a late status adds to a windowed hour become an adjustment.
func TestStatusesMeterEgress(t *testing.T) {
	t.Parallel()
	st := fixture(t)
	h0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	now := h0.Add(50 * time.Minute)
	reg := &nodework.Registry{Now: func() time.Time { return now }}
	status := func(instances ...agentproto.InstanceStatus) {
		inTx(t, st, func(ctx context.Context, tx pgx.Tx) error {
			_, err := reg.ApplyStatus(ctx, tx, "n1", &agentproto.Status{Instances: instances}, nil, nil)
			return err
		})
	}
	h1 := h0.Add(time.Hour)

	// First status: all of the counters are growth.
	status(running("vps-a", 1000, 200), running("vps-b", 0, 0), running("warm-w", 5000, 5000), running("vps-c", 777, 0))
	assert.Equal(t, map[string]map[time.Time]int64{"acme/vps-a": {h0: 1200}}, counted(t, st),
		"a warm instance, nothing counted and another node's instance: no usage")
	// Same counters again (a status repeated): nothing.
	status(running("vps-a", 1000, 200), running("vps-b", 0, 0), running("warm-w", 5000, 5000))
	assert.Equal(t, int64(1200), counted(t, st)["acme/vps-a"][h0])

	// Across the hour: growth goes to the hour of the status.
	now = h0.Add(59 * time.Minute)
	status(running("vps-a", 1500, 300), running("vps-b", 10, 20), running("warm-w", 6000, 5000))
	now = h1.Add(5 * time.Minute)
	status(running("vps-a", 4000, 300), running("vps-b", 10, 20), running("warm-w", 6000, 5000))
	// A reset (the daemon's manager restarted): the new value is growth.
	now = h1.Add(20 * time.Minute)
	status(running("vps-a", 100, 50), running("vps-b", 10, 20), running("warm-w", 6000, 5000))
	assert.Equal(t, map[string]map[time.Time]int64{
		"acme/vps-a": {h0: 1200 + 600, h1: 2500 + 150},
		"zeta/vps-b": {h0: 30},
	}, counted(t, st))

	// The rollup windows hour h0 only (h1 is open), as bytes.
	inTx(t, st, func(ctx context.Context, tx pgx.Tx) error {
		n, err := usage.Rollup(ctx, tx, "acme", now)
		require.Equal(t, 1, n)
		return err
	})
	windows := func(tenant string) []db.UsageWindow {
		rows, err := db.New(st.Pool()).ListWindows(t.Context(), db.ListWindowsParams{TenantID: tenant, RangeFrom: h0.Add(-time.Hour),
			RangeTo: h0.Add(5 * time.Hour), AfterStart: time.Unix(0, 0), Lim: 100})
		require.NoError(t, err)
		return rows
	}
	w := windows("acme")
	require.Len(t, w, 1)
	var counted0 string
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select counted_id from counted_usage where instance_id = 'vps-a' and hour_start = $1`, h0).Scan(&counted0))
	assert.Equal(t, usage.Key(counted0, h0, 0), w[0].Key)
	assert.Equal(t, api.MeterVpsEgressBytes, w[0].Meter)
	assert.Equal(t, int64(1800), w[0].QuantityUnits.Int64)
	assert.Equal(t, h0, w[0].WindowStart.UTC())
	assert.JSONEq(t, `{"instance": "vps-a"}`, string(w[0].Tags))

	// A status of hour h0 committed after the rollup (its clock still in
	// h0) adds an adjustment window; the rollup again writes nothing more.
	now = h0.Add(59*time.Minute + 59*time.Second)
	status(running("vps-a", 140, 50), running("vps-b", 10, 20), running("warm-w", 6000, 5000))
	rolled := 0
	for range 2 {
		inTx(t, st, func(ctx context.Context, tx pgx.Tx) error {
			n, err := usage.Rollup(ctx, tx, "acme", h1.Add(time.Hour))
			rolled += n
			return err
		})
	}
	assert.Equal(t, 2, rolled, "the adjustment of h0 and hour h1")
	w = windows("acme")
	require.Len(t, w, 3)
	byKey := map[string]int64{}
	for _, x := range w {
		byKey[x.Key] = x.QuantityUnits.Int64
	}
	assert.Equal(t, int64(40), byKey[usage.Key(counted0, h0, 1)], "the late 40 bytes")
	assert.Equal(t, int64(1800), byKey[usage.Key(counted0, h0, 0)], "a window is never changed")

	// An instance gone (deleted) leaves no counters behind.
	_, err := st.Pool().Exec(t.Context(), `update instances set desired_state = 'deleted' where instance_id = 'vps-b'`)
	require.NoError(t, err)
	status(running("vps-a", 140, 50), running("warm-w", 6000, 5000))
	var left int
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select count(*) from egress_counters where instance_id = 'vps-b'`).Scan(&left))
	assert.Zero(t, left)
}

// TestResultsByKind: a result goes to the handler of its command's kind
// in the transaction that finishes the command; a result sent again (the
// command finished) or for another node's command is skipped; a kind
// without a handler is only written.
func TestResultsByKind(t *testing.T) {
	t.Parallel()
	st := fixture(t)
	var reg nodework.Registry
	seen := map[string][]string{}
	for _, kind := range []string{agentproto.CommandSnapshot, agentproto.CommandExec} {
		reg.RegisterResult(kind, func(ctx context.Context, tx pgx.Tx, node string, r *agentproto.Result) (bool, error) {
			seen[kind] = append(seen[kind], node+"/"+r.ID)
			// In the result's transaction: the command is finished there.
			var state string
			require.NoError(t, tx.QueryRow(ctx, `select state from node_commands where command_id = $1`, r.ID).Scan(&state))
			assert.Equal(t, "succeeded", state)
			return kind == agentproto.CommandSnapshot, nil
		})
	}
	assert.Panics(t, func() { reg.RegisterResult(agentproto.CommandExec, nil) }, "a kind has one owner")
	enqueue := func(node, kind string) string {
		var id string
		inTx(t, st, func(ctx context.Context, tx pgx.Tx) error {
			c, _, err := nodework.EnqueueCommand(ctx, tx, node, kind, nil, "test", 0, time.Now())
			id = c.CommandID
			return err
		})
		return id
	}
	apply := func(node string, r *agentproto.Result) (applied, events bool) {
		inTx(t, st, func(ctx context.Context, tx pgx.Tx) (err error) {
			applied, events, err = reg.ApplyResult(ctx, tx, node, r)
			return err
		})
		return applied, events
	}
	snap, exec, echo := enqueue("n1", agentproto.CommandSnapshot), enqueue("n1", agentproto.CommandExec), enqueue("n1", agentproto.CommandEcho)
	out := json.RawMessage(`{"sizeBytes": 1}`)

	applied, events := apply("n1", &agentproto.Result{ID: snap, OK: true, Output: out})
	assert.True(t, applied)
	assert.True(t, events, "the handler's answer")
	applied, events = apply("n1", &agentproto.Result{ID: exec, OK: true})
	assert.True(t, applied)
	assert.False(t, events)
	applied, _ = apply("n1", &agentproto.Result{ID: echo, OK: true})
	assert.True(t, applied, "written without a handler")
	// Sent again after a reconnect: skipped, the first result kept.
	applied, _ = apply("n1", &agentproto.Result{ID: snap, Error: "another answer"})
	assert.False(t, applied)
	// Another node's command.
	other := enqueue("n2", agentproto.CommandSnapshot)
	applied, _ = apply("n1", &agentproto.Result{ID: other, OK: true})
	assert.False(t, applied)
	assert.Equal(t, map[string][]string{agentproto.CommandSnapshot: {"n1/" + snap}, agentproto.CommandExec: {"n1/" + exec}}, seen)

	var state string
	var result []byte
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select state, result from node_commands where command_id = $1`, snap).Scan(&state, &result))
	assert.Equal(t, "succeeded", state)
	var kept agentproto.Result
	require.NoError(t, json.Unmarshal(result, &kept))
	assert.True(t, kept.OK, "the first result is kept")
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select state from node_commands where command_id = $1`, other).Scan(&state))
	assert.Equal(t, "pending", state)
}

// A volumes handler's statement travels in the status's first round trip,
// with BEGIN and the instances' rows; what it returns runs once that
// answered, and not at all for a status without a volume list.
func TestVolumesHandlerJoinsTheFirstRoundTrip(t *testing.T) {
	st := fixture(t)
	var reg nodework.Registry
	ran := 0
	reg.RegisterVolumes(func(ctx context.Context, p *store.Pipeline, node string, reported []agentproto.VolumeStatus) func(context.Context, pgx.Tx) (bool, error) {
		if reported == nil {
			return nil
		}
		var n int64
		var err error
		p.Queue(func(q *db.Queries) { n, err = q.CountLiveBookings(ctx, node) })
		return func(context.Context, pgx.Tx) (bool, error) {
			ran++
			assert.Zero(t, n)
			return false, err
		}
	})
	for _, volumes := range [][]agentproto.VolumeStatus{{}, nil} {
		var trips atomic.Int64
		ctx := store.CountRoundTrips(t.Context(), &trips)
		require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
			_, err := reg.ApplyStatus(ctx, tx, "n1", &agentproto.Status{Volumes: volumes,
				Instances: []agentproto.InstanceStatus{running("vps-a", 0, 0), running("vps-b", 0, 0), running("warm-w", 0, 0)}}, nil, nil)
			assert.Equal(t, int64(1), trips.Load(), "one round trip before the commit")
			return err
		}))
	}
	assert.Equal(t, 1, ran)
}
