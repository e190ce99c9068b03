package main

// compute-agent upgrade end to end, as an operator runs it: a release
// built and signed by tools/release (what make release runs) with the
// deployment's PKI bundle, served by computed's downloads.dir, installed
// by `compute-agent upgrade` over the binary a running daemon executes;
// the daemon executes the new binary in place while its VM (a real qemu
// VM, TCG) runs on, and the new daemon controls that VM.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/release"
	"computeplane/internal/testenv"
)

func TestMain(m *testing.M) { qemutest.Main(m) }

func TestUpgradeReplacesTheDaemonAndKeepsItsVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds releases and boots a real VM")
	}
	im := qemutest.Image(t)
	releases := t.TempDir()
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\ndownloads: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location)), releases),
		fleettest.Version("v1.0.0"))

	// One version everywhere: the server document, computed and
	// compute-agent.
	ver, err := f.C.SystemVersion(t.Context(), &client.SystemVersionInput{})
	require.NoError(t, err)
	assert.Equal(t, "v1.0.0", ver.Data.Version)
	assert.Equal(t, "v1.0.0\n", proctest.Run(t, f.ComputedBin, proctest.ChildEnv(nil), "version"))
	assert.Equal(t, "v1.0.0", firstLine(proctest.Run(t, f.AgentBin, proctest.ChildEnv(nil), "version")))

	// make release, for compute-agent on this platform, signed with the
	// deployment's release key.
	rel := exec.Command("go", "run", "./tools/release", "-version", "v2.0.0", "-out", releases, "-agents", "compute-agent", "-platforms", "linux/amd64")
	rel.Dir = "../.."
	rel.Env = proctest.ChildEnv(map[string]string{"SERVICE_PKI": f.PKIFile, "SERVICE_SECRET": testenv.TestSecret})
	out, err := rel.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.FileExists(t, filepath.Join(releases, release.KeyFile))
	// A genuine v2.0.0 put up as v2.0.1: refused, its signature names v2.0.0.
	replay := filepath.Join(releases, "compute-agent", "v2.0.1")
	require.NoError(t, os.MkdirAll(replay, 0o755))
	for _, sfx := range []string{"", release.ChecksumSuffix, release.SignatureSuffix} {
		b, err := os.ReadFile(filepath.Join(releases, "compute-agent", "v2.0.0", "linux-amd64"+sfx))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(replay, "linux-amd64"+sfx), b, 0o755))
	}

	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	a := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "4", "--memory-mib", "4096", "--disk-gib", "20")
	assert.Equal(t, "v1.0.0", agentVersion(t, f, a.Node))
	res, err := f.C.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: pool, Flavor: "small",
		Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone),
		ImageId: "computeplane/minimal", Name: "web-1", IdempotencyKey: "i1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	inst := res.Data.InstanceId
	require.Equal(t, "running", string(res.Data.State))
	vmPid := readPid(t, filepath.Join(a.Dir, "runtime", "vms", inst, "qemu.pid"))
	daemonPid := a.Proc.Cmd.Process.Pid

	before, err := os.ReadFile(f.AgentBin)
	require.NoError(t, err)
	cmd := exec.Command(f.AgentBin, "upgrade", "--dir", a.Dir, "--version", "v2.0.1")
	cmd.Env = proctest.ChildEnv(nil)
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "v2.0.1 refused")
	assert.Contains(t, string(out), "signature")
	after, err := os.ReadFile(f.AgentBin)
	require.NoError(t, err)
	assert.Equal(t, before, after, "a refused release leaves the binary as it was")

	// The upgrade: latest is v2.0.1 (refused); v2.0.0 by name.
	start := time.Now()
	got := proctest.Run(t, f.AgentBin, proctest.ChildEnv(nil), "upgrade", "--dir", a.Dir, "--version", "v2.0.0")
	t.Logf("upgrade, download to the daemon back as v2.0.0: %s", time.Since(start).Round(time.Millisecond))
	assert.Contains(t, got, "installed compute-agent v2.0.0 over v1.0.0")
	assert.Contains(t, got, "the daemon runs v2.0.0")
	assert.Equal(t, "v2.0.0", firstLine(proctest.Run(t, f.AgentBin, proctest.ChildEnv(nil), "version")))

	// The same process (executed in place), a new session reporting the
	// new version, the VM never stopped.
	assert.False(t, a.Proc.Exited())
	assert.Equal(t, daemonPid, a.Proc.Cmd.Process.Pid)
	require.Eventually(t, func() bool { return agentVersion(t, f, a.Node) == "v2.0.0" && f.NodeState(a.Node) == "ready" },
		30*time.Second, 100*time.Millisecond)
	assert.True(t, running(vmPid), "the VM's qemu runs on")
	assert.Equal(t, vmPid, readPid(t, filepath.Join(a.Dir, "runtime", "vms", inst, "qemu.pid")))
	ig, err := f.C.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: inst})
	require.NoError(t, err)
	assert.Equal(t, "running", string(ig.Data.State))
	assert.Contains(t, a.Proc.Stderr.String(), "re-attached to a running VM")

	// The new daemon controls the VM its predecessor started: a stop ends
	// that qemu, and the process (still its parent) reaps it.
	_, err = f.C.InstancesStop(t.Context(), &client.InstancesStopInput{TenantId: fleettest.Tenant, InstanceId: inst})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		g, err := f.C.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: inst})
		return err == nil && g.Data.State == "stopped"
	}, 60*time.Second, 200*time.Millisecond)
	require.Eventually(t, func() bool { return syscall.Kill(vmPid, 0) == syscall.ESRCH }, 20*time.Second, 50*time.Millisecond,
		"the old qemu is gone, not a zombie")
	_, err = f.C.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: fleettest.Tenant, InstanceId: inst})
	require.NoError(t, err)

	// Upgrading again to what runs installs nothing.
	got = proctest.Run(t, f.AgentBin, proctest.ChildEnv(nil), "upgrade", "--dir", a.Dir, "--version", "v2.0.0")
	assert.Contains(t, got, "nothing to install")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return pid
}

// running: the process is there and not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	rp := strings.LastIndexByte(s, ')')
	return rp > 0 && len(s) > rp+2 && s[rp+2] != 'Z'
}

func agentVersion(t *testing.T, f *fleettest.Fleet, node string) string {
	var v *string
	require.NoError(t, f.DB.QueryRow(t.Context(), `select agent_version from nodes where node_id = $1`, node).Scan(&v))
	if v == nil {
		return ""
	}
	return *v
}
