package sandboxes_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

// TestRefusedWarmClaimLeavesTheWarmVMUnclaimed: the gate's decision on a
// create travels at the head of the create's transaction, whose first
// pipeline also claims a warm VM. A caller the decision refuses (a viewer)
// gets ACCESS_DENIED as before, and the claim, which ran, is rolled back:
// the warm VM is still the template's, unchanged, and no sandbox, draft
// or audit row is left. The same caller's key in another tenant is refused
// before any transaction.
func TestRefusedWarmClaimLeavesTheWarmVMUnclaimed(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "16", "--memory-mib", "8192", "--disk-gib", "100")
	res, err := f.C.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: "warm", PoolId: pool,
		Flavor: "small", ImageId: "computeplane/minimal",
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
		Warm:    client.NewOptWarm(client.Warm{Min: 1})})
	require.NoError(t, err)
	tmpl := res.Data.TemplateId

	// The warm VM as the claim finds it: its row, which a claim rewrites.
	warm := func() (row string) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(string_agg(format('%s %s %s %s %s', instance_id, kind,
				desired_state, identity_generation, version), ','), '') from instances
			where template_id = $1 and state = 'paused' and reported_identity = identity_generation`, tmpl).Scan(&row))
		return row
	}
	require.Eventually(t, func() bool { return warm() != "" }, 90*time.Second, 50*time.Millisecond, "the warm pool is full")
	census := func() (n [3]int) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select (select count(*) from sandboxes),
			(select count(*) from iam.resources where draft), (select count(*) from audit_log)`).Scan(&n[0], &n[1], &n[2]))
		return n
	}
	before, vm := census(), warm()

	as := func(key string) *computeclient.Client {
		c, err := computeclient.New(f.PublicURL+config.DefaultBasePath, computeclient.WithToken(key),
			computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
		require.NoError(t, err)
		return c
	}
	claim := func(c *computeclient.Client, key string) error {
		_, err := c.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: tenant, IdempotencyKey: key,
			TemplateId: client.NewOptString(tmpl)})
		return err
	}
	viewer := as(f.CreateKey(tenant, "viewer@"+tenant, "viewer"))
	for i := range 3 { // a retry with the same key is decided afresh
		e := testenv.APIError(t, claim(viewer, "refused"), "try %d", i)
		assert.Equal(t, "ACCESS_DENIED", e.Code)
		assert.Equal(t, "compute:sandboxes:manage on compute-tenant/"+tenant+" refused", e.Message)
	}
	e := testenv.APIError(t, claim(f.Client("other"), "elsewhere"))
	assert.Equal(t, "ACCESS_DENIED", e.Code)
	t.Logf("refused in another tenant: %s", e.Message)

	assert.Equal(t, before, census(), "no sandbox, draft or audit row")
	assert.Equal(t, vm, warm(), "the warm VM is unclaimed and unchanged")

	// The census is not blind: the owner's claim takes the warm VM.
	require.NoError(t, claim(f.C, "admitted"))
	after := census()
	assert.Equal(t, before[0]+1, after[0])
	assert.NotEqual(t, vm, warm())
}
