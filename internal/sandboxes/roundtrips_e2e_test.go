package sandboxes_test

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

// maxRoundTrips is what sandboxes.create makes today (fleettest.RoundTripGoal is
// the most it may): the test fails above it.
const maxRoundTrips = 6

// TestCreateRoundTrips: sandboxes.create, counted on the wire by computed
// (compute_rpc_db_round_trips), makes at most maxRoundTrips round trips
// when it places a cold VM (a daemon with the recording runtime runs it).
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
	n := f.FewestRoundTrips("sandboxes.create", node, 3, func(i int) { made = create(fmt.Sprintf("s%d", i), cold) })
	fleettest.AtMostRoundTrips(t, n, maxRoundTrips)
	assert.Equal(t, "cold", string(made.Timings.How))
	assert.Equal(t, 1, f.Events("sandbox.created", made.SandboxId))

	replay := f.CallRoundTrips("sandboxes.create", func() { assert.Equal(t, made.SandboxId, create("s2", cold).SandboxId) })
	t.Logf("sandboxes.create replayed: %d round trips", replay)
	assert.LessOrEqual(t, replay, n)

}
