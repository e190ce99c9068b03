package provideraccounts_test

// A bootstrap of a deployment that serves downloads: the provider
// downloads the daemon of the control plane's version (a release built
// and signed by tools/release, what make release runs), verifies it with
// the release key and runs that file; a tampered artifact is refused and
// the machine does not join.

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/providers/localqemu"
	"computeplane/internal/release"
	"computeplane/internal/testenv"
)

func TestBootstrapFromDownloads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release, boots a VM and runs computed and compute-agent")
	}
	im, imagesDir, provDir := localProvider(t)
	releases := t.TempDir()
	// No bootstrap.agent: with downloads served, none is needed.
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\nproviderDir: %q\ndownloads: {dir: %q}\nbootstrap: {}\n", imagesDir, provDir, releases),
		fleettest.Version("v1.4.0"))
	platform := runtime.GOOS + "-" + runtime.GOARCH
	rel := exec.Command("go", "run", "./tools/release", "-version", "v1.4.0", "-out", releases, "-agents", "compute-agent", "-platforms", runtime.GOOS+"/"+runtime.GOARCH)
	rel.Dir = "../.."
	rel.Env = proctest.ChildEnv(map[string]string{"SERVICE_PKI": f.PKIFile, "SERVICE_SECRET": testenv.TestSecret})
	out, err := rel.CombinedOutput()
	require.NoError(t, err, "%s", out)
	artifact := filepath.Join(releases, "compute-agent", "v1.4.0", platform)
	genuine, err := os.ReadFile(artifact)
	require.NoError(t, err)
	genuineSum, err := os.ReadFile(artifact + release.ChecksumSuffix)
	require.NoError(t, err)

	// Tampered: other bytes, their checksum published beside them; the
	// signature (of the genuine statement) does not cover them.
	tampered := append(append([]byte{}, genuine...), []byte("\x00tampered")...)
	require.NoError(t, os.WriteFile(artifact, tampered, 0o755))
	require.NoError(t, os.WriteFile(artifact+release.ChecksumSuffix, release.ChecksumFile(platform, sha256.Sum256(tampered)), 0o644))

	ctx := t.Context()
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	acct, err := f.C.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: fleettest.Tenant, Provider: localqemu.Name, Name: "lab",
		Config: raw(map[string]any{"image": im.ID, "accel": "tcg", "machineTypes": []any{map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256}}})})
	require.NoError(t, err)
	in := &client.ProviderAccountsBootstrapInput{TenantId: fleettest.Tenant, AccountId: acct.Data.AccountId, PoolId: pool, IdempotencyKey: "dl",
		OfferId: client.NewOptString("small")}
	_, err = f.C.ProviderAccountsBootstrap(ctx, in)
	require.NoError(t, err)
	var b client.Bootstrap
	require.Eventually(t, func() bool {
		res, err := f.C.ProviderAccountsBootstrap(ctx, in)
		require.NoError(t, err)
		b = res.Data
		require.NotEqual(t, "joined", b.State, "a tampered daemon was installed")
		return b.Error.Value != ""
	}, 4*time.Minute, 100*time.Millisecond)
	assert.Equal(t, "installing", b.State)
	assert.Contains(t, b.Error.Value, "refused")
	assert.Contains(t, b.Error.Value, "signature")
	mdir := filepath.Join(provDir, localqemu.Name, b.MachineId.Value)
	assert.NoFileExists(t, filepath.Join(mdir, localqemu.AgentFile), "nothing unverified is left to run")
	assert.NoFileExists(t, filepath.Join(mdir, "agent.pid"), "no daemon ran")
	var nodes int
	require.NoError(t, f.DB.QueryRow(ctx, `select count(*) from nodes where pool_id = $1`, pool).Scan(&nodes))
	assert.Zero(t, nodes, "the machine did not join")

	// The genuine artifact back: the next attempt installs it.
	require.NoError(t, os.WriteFile(artifact+release.ChecksumSuffix, genuineSum, 0o644))
	require.NoError(t, os.WriteFile(artifact, genuine, 0o755))
	require.Eventually(t, func() bool {
		res, err := f.C.ProviderAccountsBootstrap(ctx, in)
		require.NoError(t, err)
		b = res.Data
		require.NotEqual(t, "failed", b.State, "bootstrap failed: %s\n%s", b.Error.Value, proctest.Tail(f.Computed.Stderr.String(), 40))
		return b.State == "joined"
	}, 4*time.Minute, 100*time.Millisecond)
	var state string
	require.NoError(t, f.DB.QueryRow(ctx, `select state from nodes where node_id = $1`, b.NodeId.Value).Scan(&state))
	assert.Equal(t, "ready", state)

	// The daemon that runs is the downloaded file in the machine's
	// directory, byte for byte the release's.
	installed := filepath.Join(mdir, localqemu.AgentFile)
	got, err := os.ReadFile(installed)
	require.NoError(t, err)
	assert.Equal(t, sha256.Sum256(genuine), sha256.Sum256(got))
	st, err := os.Stat(installed)
	require.NoError(t, err)
	assert.NotZero(t, st.Mode()&0o100, "executable")
	pidb, err := os.ReadFile(filepath.Join(mdir, "agent.pid"))
	require.NoError(t, err)
	exe, err := os.Readlink("/proc/" + string(pidb) + "/exe")
	require.NoError(t, err)
	assert.Equal(t, installed, exe, "the daemon runs the downloaded file")
}
