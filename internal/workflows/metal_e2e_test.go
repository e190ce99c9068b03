package workflows_test

// A real provisioning run: a qemu VM treated as a metal host
// (internal/drivers/qemudriver), enrolled into a metal-host pool and
// provisioned through the built-in metal-host workflow by computed
// processes: power on, boot the in-memory agent (compute-guest in the
// minimal image) from virtual media, write the system image to the disk,
// configure it, reboot into it, join. On the way: the image write made to
// fail (the medium corrupted), the workflow retried from that step once
// the medium is good again, and the worker running it SIGKILLed mid-step
// and another computed finishing it.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/drivers/qemudriver"
	"computeplane/internal/images"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
	"computeplane/internal/workflows"
)

// osImageBytes is the size of the system image: an ext4 filesystem
// holding the minimal image's kernel and initramfs under /boot.
const osImageBytes = 80 << 20

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.Create(to)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// imageDir writes an image directory with the in-memory agent (the
// minimal image) and the system image built from it; it returns the
// directory and the system image's path.
func imageDir(t *testing.T, agent *images.Image) (string, string) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "boot"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	copyFile(t, agent.Location, filepath.Join(root, "boot", "vmlinux"))
	copyFile(t, agent.Initrd, filepath.Join(root, "boot", "initrd"))
	require.NoError(t, os.WriteFile(filepath.Join(root, "boot", "cmdline"), []byte(agent.Cmdline+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("unconfigured\n"), 0o644))
	osImg := filepath.Join(dir, "metal-os.raw")
	out, err := exec.Command("mke2fs", "-q", "-t", "ext4", "-d", root, "-F", osImg, strconv.Itoa(osImageBytes>>10)+"k").CombinedOutput()
	require.NoError(t, err, "mke2fs: %s", out)
	require.NoError(t, os.RemoveAll(root))
	write := func(name string, im images.Image) {
		b, err := json.Marshal(im)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	write("agent.json", images.Image{ID: "computeplane/minimal", Format: "kernel+initrd", SizeBytes: agent.SizeBytes, SHA256: agent.SHA256,
		Location: agent.Location, Initrd: agent.Initrd, Cmdline: agent.Cmdline})
	write("metal-os.json", images.Image{ID: "computeplane/metal-os", Format: "raw", SizeBytes: osImageBytes, SHA256: fileSHA256(t, osImg),
		Location: osImg})
	return dir, osImg
}

// flipByte inverts one byte of the image in place (qemu keeps the file
// open as the host's virtual medium).
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	require.NoError(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
}

func TestMetalProvisioningWithQemu(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and runs computed processes")
	}
	agent := qemutest.Image(t)
	imgs, osImg := imageDir(t, agent)
	dbURL := dbtest.URL(t)
	bin := proctest.Build(t, "computeplane/cmd/computed")
	cfgFile := testenv.ConfigFile(t, fmt.Sprintf("images: {dir: %q}\nnotifier: {kind: postgres}\nlog: {level: info}\n", imgs))
	envOf := func(port int) []string {
		return proctest.ChildEnv(map[string]string{
			"SERVICE_DATABASE_URL": dbURL, "SERVICE_SECRET": testenv.TestSecret, "SERVICE_CONFIG": cfgFile,
			"SERVICE_BASE_URL": fmt.Sprintf("http://127.0.0.1:%d", port), "SERVICE_ROLES": "api,controllers",
			"HOST": "127.0.0.1", "PORT": strconv.Itoa(port),
		})
	}
	portA := testenv.FreePort(t)
	a := proctest.Start(t, "A", bin, envOf(portA), "serve")
	a.WaitHealthy(t, fmt.Sprintf("127.0.0.1:%d", portA))
	key := proctest.CreateKey(t, bin, envOf(portA), "acme", "ops", "owner")
	clientOf := func(port int) *computeclient.Client {
		c, err := computeclient.New(fmt.Sprintf("http://127.0.0.1:%d", port)+config.DefaultBasePath, computeclient.WithToken(key),
			computeclient.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
		require.NoError(t, err)
		return c
	}
	c := clientOf(portA)
	ctx := t.Context()
	site, err := c.SitesCreate(ctx, &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := c.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "metal",
		Class: client.PoolsCreateInputClassMetalHost, IdempotencyKey: "p"})
	require.NoError(t, err)

	// The host: a directory with its disk; its VM outlives every process
	// here, so the test ends it.
	hostDir, err := os.MkdirTemp("", "mh")
	require.NoError(t, err)
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(hostDir, "vm", "qemu.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(hostDir)
	})
	drvCfg, _ := json.Marshal(qemudriver.Config{Dir: hostDir, VCPU: 1, MemoryMiB: 256, DiskBytes: 128 << 20})

	// The medium is corrupted before the run: the image write fails
	// after its retries.
	flipByte(t, osImg, 40<<20)
	start := time.Now()
	// The operator's way in: computed metal enroll.
	var wf struct{ NodeID, WorkflowID string }
	enrolled := proctest.Run(t, bin, envOf(portA), "metal", "enroll", "--pool", pool.Data.PoolId, "--hostname", "metal-1",
		"--driver", qemudriver.Name, "--driver-config", string(drvCfg),
		"--input", "image=computeplane/metal-os", "--input", "agentImage=computeplane/minimal")
	require.NoError(t, json.Unmarshal([]byte(enrolled), &wf), enrolled)
	node, id := wf.NodeID, wf.WorkflowID
	get := func(c *computeclient.Client) client.Workflow {
		res, err := c.WorkflowsGet(ctx, &client.WorkflowsGetInput{TenantId: "acme", NodeId: node, WorkflowId: id})
		require.NoError(t, err)
		return res.Data
	}
	out := func(s client.WorkflowStep, key string) string {
		raw, ok := s.Output.Value[key]
		if !ok {
			return ""
		}
		var v any
		_ = json.Unmarshal(raw, &v)
		return fmt.Sprint(v)
	}
	step := func(w client.Workflow, name string) client.WorkflowStep {
		for _, s := range w.Steps {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no step %s", name)
		return client.WorkflowStep{}
	}
	console := func() string {
		b, _ := os.ReadFile(filepath.Join(hostDir, "vm", "console.log"))
		return proctest.Tail(string(b), 20)
	}
	require.Eventually(t, func() bool {
		a.RequireRunning(t)
		s := get(c).State
		return s == "failed" || s == "succeeded"
	}, 4*time.Minute, 200*time.Millisecond, "the workflow fails at write-image; console: %s", console())
	failed := get(c)
	require.Equal(t, "failed", string(failed.State), "%+v\n%s", failed, console())
	require.Equal(t, "write-image", failed.CurrentStep.Value, "%+v", failed.Error)
	write := step(failed, "write-image")
	assert.EqualValues(t, 3, write.Attempts, "the step ran with its two retries")
	assert.Contains(t, write.LastError.Value, "sha256")
	agentBoot := step(failed, "wait-agent")
	require.Equal(t, "succeeded", string(agentBoot.State))
	bootID := out(agentBoot, "bootId")
	t.Logf("failed at write-image after %s: %s", time.Since(start).Round(time.Millisecond), failed.Error.Value)

	// The medium is good again: the workflow is retried from the failed
	// step, the steps before it keep their results.
	flipByte(t, osImg, 40<<20)
	res, err := c.WorkflowsRetry(ctx, &client.WorkflowsRetryInput{TenantId: "acme", NodeId: node, WorkflowId: id})
	require.NoError(t, err)
	require.Equal(t, "running", string(res.Data.State))

	// A dies in the middle of the retried step, copying the image; B,
	// started then, takes the job's lease once A's has expired, starts
	// the step again (it writes the whole image: idempotent) and
	// finishes.
	require.Eventually(t, func() bool {
		a.RequireRunning(t)
		s := step(get(c), "write-image")
		return s.State == "running" && s.Attempts == 4
	}, 3*time.Minute, 50*time.Millisecond, "console: %s", console())
	time.Sleep(time.Second) // well into the copy
	a.Kill(t)
	killedAt := time.Now()
	portB := testenv.FreePort(t)
	b := proctest.Start(t, "B", bin, envOf(portB), "serve")
	b.WaitHealthy(t, fmt.Sprintf("127.0.0.1:%d", portB))
	cb := clientOf(portB)
	require.Eventually(t, func() bool {
		b.RequireRunning(t)
		s := get(cb).State
		return s == "succeeded" || s == "failed"
	}, 3*time.Minute, 200*time.Millisecond, "console: %s", console())
	done := get(cb)
	require.Equal(t, "succeeded", string(done.State), "%+v", done.Error)
	t.Logf("finished %s after the kill", time.Since(killedAt).Round(time.Millisecond))

	for _, s := range done.Steps {
		assert.Equal(t, "succeeded", string(s.State), s.Name)
		switch s.Name {
		case "write-image":
			assert.EqualValues(t, 5, s.Attempts, "three failed attempts, the retried one cut by the kill, the next worker's")
		default:
			assert.EqualValues(t, 1, s.Attempts, "%s ran once: a retry starts from the failed step", s.Name)
		}
	}
	assert.Equal(t, bootID, out(step(done, "wait-agent"), "bootId"))
	sys := step(done, "wait-system")
	assert.Contains(t, out(sys, "cmdline"), "compute.boot=disk", "the host booted the written image from its disk")
	assert.Equal(t, "metal-1", out(sys, "hostname"), "the installed system carries its configuration")
	assert.NotEqual(t, bootID, out(sys, "bootId"))
	n, err := cb.NodesGet(ctx, &client.NodesGetInput{TenantId: "acme", NodeId: node})
	require.NoError(t, err)
	assert.Equal(t, "ready", string(n.Data.State))
	assert.EqualValues(t, 1, n.Data.Capacity.Vcpu)
	assert.EqualValues(t, 256, n.Data.Capacity.MemoryMiB)

	// Timings per phase (the last attempt of each step), for
	// docs/benchmarks.md.
	phases := map[string]int64{}
	for _, s := range done.Steps {
		if !s.DurationMs.Null {
			d := s.DurationMs.Value
			phases[string(s.Phase)] += d
			t.Logf("step %-15s %-9s attempts %d  %6d ms", s.Name, s.Phase, s.Attempts, d)
		}
	}
	for _, p := range workflows.Phases {
		t.Logf("phase %-9s %6d ms", p, phases[p])
	}
	w := step(done, "write-image")
	t.Logf("write-image: dd %s ms, sha256 check %s ms of %d MiB", out(w, "writeMs"), out(w, "verifyMs"), osImageBytes>>20)
	t.Logf("whole run: %s (with the failed attempts, the retry and the takeover)", time.Since(start).Round(time.Millisecond))
}
