package sandboxes_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
)

// maxRoundTrips is what sandboxes.create makes today (fleettest.RoundTripGoal is
// the most it may): the test fails above it.
const maxRoundTrips = 5

// maxDeleteRoundTrips is what sandboxes.delete makes today: the sandbox's
// row, its VM's and its unkept snapshots are read in one pipeline, the
// VM's end (instances.End) is another, the attachments' release and the
// usage's end are held for the sandbox's own write (9 before).
const maxDeleteRoundTrips = 6

// maxWarmClaimRoundTrips is what a warm claim answered at once makes
// today; waiting until it runs makes one more.
const maxWarmClaimRoundTrips = 3

// TestCreateRoundTrips: sandboxes.create, counted on the wire by computed
// (compute_rpc_db_round_trips), makes at most maxRoundTrips round trips
// when it places a cold VM (a daemon with the recording runtime runs it);
// sandboxes.delete of one makes at most maxDeleteRoundTrips and gives the
// quota back.
func TestCreateRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.Metrics())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	node := f.Join(pool, "--runtime", "recording", "--vcpu", "16", "--memory-mib", "8192", "--disk-gib", "100").Node
	template := func(name string, warm int64) string {
		res, err := f.C.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: name, PoolId: pool,
			Flavor: "small", ImageId: "computeplane/minimal",
			Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
			Env:     client.NewOptSandboxTemplatesCreateInputEnv(client.SandboxTemplatesCreateInputEnv{"GREETING": "hello"}),
			Warm:    client.NewOptWarm(client.Warm{Min: warm})})
		require.NoError(t, err)
		return res.Data.TemplateId
	}
	create := func(key, tmpl string) client.Sandbox {
		res, err := f.C.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: tenant, IdempotencyKey: key,
			TemplateId: client.NewOptString(tmpl)})
		require.NoError(t, err)
		return res.Data
	}
	cold := template("cold", 0)
	create("warm-up", cold) // the caller's decision is cached from here on

	var made client.Sandbox
	var ids []string
	n := f.FewestRoundTrips("sandboxes.create", node, 3, func(i int) {
		made = create(fmt.Sprintf("s%d", i), cold)
		ids = append(ids, made.SandboxId)
	})
	fleettest.AtMostRoundTrips(t, "sandboxes.create (cold, network none)", n, maxRoundTrips)
	assert.Equal(t, "cold", string(made.Timings.How))
	assert.Equal(t, 1, f.Events("sandbox.created", made.SandboxId))

	replay := f.CallRoundTrips("sandboxes.create", func() { assert.Equal(t, made.SandboxId, create("s2", cold).SandboxId) })
	fleettest.RecordRoundTrips(t, "sandboxes.create, replayed (same key)", replay)
	assert.LessOrEqual(t, replay, n)

	used := func() (n int64) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(used), 0) from quotas where tenant_id = $1 and pool_id = $2 and resource = 'sandboxes'`,
			tenant, pool).Scan(&n))
		return n
	}
	before := used()
	n = f.FewestRoundTrips("sandboxes.delete", node, 3, func(i int) {
		_, err := f.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: ids[i]})
		require.NoError(t, err)
	})
	fleettest.AtMostRoundTrips(t, "sandboxes.delete (cold, network none)", n, maxDeleteRoundTrips)
	assert.Equal(t, before-3, used(), "each delete gave its sandbox back")
	assert.Equal(t, 1, f.Events("sandbox.deleted", ids[0]))
}

// TestWarmClaimWaitRoundTrips: a warm claim that waits for its sandbox to
// run makes one round trip more than the same claim answered at once: the
// wait's read after the commit. The claimed VM's starting wakes no re-read
// and the status that runs it (written by the gateway in computed, this
// process) hands the sandbox over to the wait, which answers from it.
func TestWarmClaimWaitRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.Metrics())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	node := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "16", "--memory-mib", "8192", "--disk-gib", "100").Node
	res, err := f.C.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: "warm", PoolId: pool,
		Flavor: "small", ImageId: "computeplane/minimal",
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
		Warm:    client.NewOptWarm(client.Warm{Min: 1})})
	require.NoError(t, err)
	tmpl := res.Data.TemplateId
	claim := func(key string, wait int64) client.Sandbox {
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, f.DB.QueryRow(t.Context(), `select count(*) from instances where kind = 'warm' and template_id = $1
				and state = 'paused' and reported_identity = identity_generation and desired_state = 'paused'`, tmpl).Scan(&n))
			return n == 1
		}, 90*time.Second, 50*time.Millisecond, "the warm pool is full")
		f.SpecApplied(node)
		res, err := f.C.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: tenant, IdempotencyKey: key,
			TemplateId: client.NewOptString(tmpl), Wait: client.NewOptWait(client.Wait{TimeoutMs: wait})})
		require.NoError(t, err)
		assert.Equal(t, "warm", string(res.Data.Timings.How))
		require.Eventually(t, func() bool { // UNAVAILABLE while a status holds the node's row: retry
			_, err := f.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: res.Data.SandboxId})
			return err == nil
		}, 10*time.Second, 50*time.Millisecond)
		return res.Data
	}
	claim("warm-up", 0) // the caller's decision is cached from here on
	var at client.Sandbox
	atOnce := f.CallRoundTrips("sandboxes.create", func() { at = claim("at-once", 0) })
	assert.Equal(t, "creating", string(at.State))
	var waited client.Sandbox
	trips := f.CallRoundTrips("sandboxes.create", func() { waited = claim("waited", 30000) })
	fleettest.RecordRoundTrips(t, "sandboxes.create, a warm claim waiting until it runs", trips)
	assert.Equal(t, "running", string(waited.State))
	assert.False(t, waited.ReadyAt.Null)
	assert.Equal(t, atOnce+1, trips, "the read after the commit only")
	fleettest.AtMostRoundTrips(t, "sandboxes.create, a warm claim answered at once", atOnce, maxWarmClaimRoundTrips)
}
