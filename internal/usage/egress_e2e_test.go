package usage_test

// vps.egress.bytes end to end: a fleet (computed and a compute-agent with
// the recording runtime, whose egress counters the test writes), an
// instance created through the API, counters moving over statuses and a
// reset, usage.list and usage.export in bytes, and the hand-over to
// billing.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/fleettest"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/store"
	"computeplane/internal/usage"
)

func TestEgressBytesMeteredThroughTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "4", "--memory-mib", "4096", "--disk-gib", "20")
	res, err := f.C.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: pool, Flavor: "small",
		ImageId: "computeplane/minimal", Name: "web", IdempotencyKey: "web"})
	require.NoError(t, err)
	id := res.Data.InstanceId
	require.Eventually(t, func() bool {
		g, err := f.C.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: id})
		return err == nil && string(g.Data.State) == "running"
	}, 30*time.Second, 50*time.Millisecond)

	// The node's counters, as the recording runtime reports them with its
	// next status (a heartbeat).
	counters := func(tx, rx uint64) {
		b, _ := json.Marshal(map[string]map[string]uint64{id: {"tx": tx, "rx": rx}})
		tmp := filepath.Join(agent.Dir, "runtime", "egress.tmp")
		require.NoError(t, os.WriteFile(tmp, b, 0o600))
		require.NoError(t, os.Rename(tmp, filepath.Join(agent.Dir, "runtime", vmruntime.RecordingCounters)))
	}
	metered := func() (n int64) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(quantity), 0) from counted_usage
			where instance_id = $1 and meter = $2`, id, api.MeterVpsEgressBytes).Scan(&n))
		return n
	}
	waitMetered := func(want int64, msg string) {
		t.Helper()
		require.Eventually(t, func() bool { return metered() == want }, 20*time.Second, 50*time.Millisecond,
			"%s: want %d bytes, metered %d", msg, want, metered())
	}
	counters(1000, 500)
	waitMetered(1500, "the first counters")
	counters(3000, 700)
	waitMetered(3700, "growth of 2000 + 200")
	counters(100, 0)
	waitMetered(3800, "a reset counts the new value")

	// The rollup once the hours closed, then usage.list shows the bytes.
	st, err := store.Open(t.Context(), f.DB.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(st.Close)
	later := time.Now().Add(2 * time.Hour)
	require.NoError(t, st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := usage.Rollup(ctx, tx, fleettest.Tenant, later)
		return err
	}))
	list := func() []client.UsageWindow {
		l, err := f.C.UsageList(t.Context(), &client.UsageListInput{TenantId: fleettest.Tenant, Meter: client.NewOptString(api.MeterVpsEgressBytes)})
		require.NoError(t, err)
		return l.Data.Items
	}
	items := list()
	require.NotEmpty(t, items, "one window per hour the statuses came in (two if the test crossed an hour)")
	total := 0.0
	for _, w := range items {
		total += w.Quantity
		assert.True(t, strings.HasPrefix(w.IdempotencyKey, "cmp:cnt_"), w.IdempotencyKey)
		assert.Equal(t, id, w.Tags[usage.TagInstance])
		assert.Equal(t, time.Hour, w.WindowEnd.Sub(w.WindowStart))
		assert.True(t, w.Outcome.Null, "not handed over yet")
	}
	assert.Equal(t, 3800.0, total, "bytes")
	from, to := items[0].WindowStart.Add(-time.Hour).UnixMilli(), later.UnixMilli()
	exp, err := f.C.UsageExport(t.Context(), &client.UsageExportInput{TenantId: fleettest.Tenant, From: from, To: to})
	require.NoError(t, err)
	assert.Equal(t, 3800.0, exp.Data.Meters[api.MeterVpsEgressBytes].Quantity)
	assert.Contains(t, exp.Data.Content, items[0].IdempotencyKey+","+api.MeterVpsEgressBytes+",")

	// The hand-over gives billing each window under its key, in bytes.
	billing := embedded.New(st, "root", "compute-", time.Now).Billing()
	require.NoError(t, st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := usage.Handover(ctx, tx, billing, later, 500)
		return err
	}))
	for _, w := range list() {
		assert.Equal(t, "recorded", string(w.Outcome.Value), w.IdempotencyKey)
		var q float64
		var meter string
		require.NoError(t, f.DB.QueryRow(t.Context(), `select quantity, meter from iam.usage_records where key = $1`, w.IdempotencyKey).Scan(&q, &meter))
		assert.Equal(t, w.Quantity, q)
		assert.Equal(t, api.MeterVpsEgressBytes, meter)
	}
}
