package instances_test

// Instances end to end: computed (every role, the gateway included) and a
// compute-agent with the qemu runtime, as real processes; every instance
// is a real VM (TCG on these machines) whose guest agent answers.

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

type world struct {
	*fleettest.Fleet
	t      *testing.T
	c      *computeclient.Client
	agent  *fleettest.Agent
	poolID string
	node   string
}

func setup(t *testing.T) *world {
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	w := &world{Fleet: f, t: t, c: f.C}
	w.poolID = f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	w.agent = f.Join(w.poolID, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "4", "--memory-mib", "4096", "--disk-gib", "20")
	w.node = w.agent.Node
	return w
}

func (w *world) get(id string) client.Instance {
	w.t.Helper()
	res, err := w.c.InstancesGet(w.t.Context(), &client.InstancesGetInput{TenantId: "acme", InstanceId: id})
	require.NoError(w.t, err)
	return res.Data
}

func (w *world) vmFile(id, name string) string {
	return filepath.Join(w.agent.Dir, "runtime", "vms", id, name)
}

func (w *world) vmPid(id string) int {
	b, err := os.ReadFile(w.vmFile(id, "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil && !zombie(pid) }

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	rp := strings.LastIndexByte(s, ')')
	return rp > 0 && len(s) > rp+2 && s[rp+2] == 'Z'
}

func TestInstanceLifecycleOnRealVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	w := setup(t)
	marker := make([]byte, 8)
	_, _ = rand.Read(marker)
	mark := "user-data-ran-" + hex.EncodeToString(marker)

	// The user data names a secret: the host resolves it at boot, over its
	// session; the guest sees the value (its SHA-256 reaches the console),
	// and neither the database nor the host's disk ever holds it.
	secretValue := "pw-" + hex.EncodeToString(marker)
	_, err := w.c.SecretsPut(t.Context(), &client.SecretsPutInput{TenantId: "acme", Name: "db-pass", Value: secretValue, IdempotencyKey: "sec"})
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(secretValue))
	userData := "#!/bin/sh\necho " + mark + " > /dev/console\nprintf %s 'secret://tenants/acme/db-pass' | sha256sum > /dev/console\n"
	_, err = w.c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: "acme", PoolId: w.poolID, Flavor: "small", Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone),
		ImageId: "computeplane/minimal", Name: "bad", IdempotencyKey: "bad", UserData: client.NewOptString("echo secret://tenants/acme/nope")})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "a reference to a secret that does not exist")

	// create with wait: a running instance whose guest agent answered.
	start := time.Now()
	res, err := w.c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: "acme", PoolId: w.poolID, Flavor: "small", Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone),
		ImageId: "computeplane/minimal", Name: "web-1", IdempotencyKey: "i1",
		UserData: client.NewOptString(userData),
		Wait:     client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	inst := res.Data
	require.Equal(t, "running", string(inst.State), "%+v", inst)
	t.Logf("instances.create to running (wait) in %s", time.Since(start).Round(time.Millisecond))
	assert.False(t, inst.ReadyAt.Null, "readyAt is set")
	assert.True(t, inst.HasUserData)
	assert.Equal(t, w.node, inst.NodeId.Value)
	id := inst.InstanceId
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(w.vmFile(id, "console.log"))
		return strings.Contains(string(b), mark)
	}, 10*time.Second, 50*time.Millisecond, "the user data ran inside the guest")
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(w.vmFile(id, "console.log"))
		return strings.Contains(string(b), hex.EncodeToString(sum[:]))
	}, 10*time.Second, 50*time.Millisecond, "the guest saw the secret's value")
	var specs int
	require.NoError(t, w.DB.QueryRow(t.Context(), `select count(*) from node_specs where body::text like '%' || $1 || '%'`, secretValue).Scan(&specs))
	assert.Zero(t, specs, "no spec holds the value")
	var rows int
	require.NoError(t, w.DB.QueryRow(t.Context(), `select count(*) from instances where user_data like '%' || $1 || '%'`, secretValue).Scan(&rows))
	assert.Zero(t, rows)
	require.NoError(t, filepath.WalkDir(w.agent.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&fs.ModeSocket != 0 || strings.HasSuffix(p, ".raw") {
			return nil
		}
		b, _ := os.ReadFile(p)
		assert.NotContains(t, string(b), secretValue, "the host's disk holds the value in %s", p)
		return nil
	}))
	var booked int
	require.NoError(t, w.DB.QueryRow(t.Context(), `select booked_vcpu from nodes where node_id = $1`, w.node).Scan(&booked))
	assert.Equal(t, 1, booked)

	// stop, start, reboot.
	stopped, err := w.c.InstancesStop(t.Context(), &client.InstancesStopInput{TenantId: "acme", InstanceId: id, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	assert.Equal(t, "stopped", string(stopped.Data.State))
	assert.False(t, alive(w.vmPid(id)), "the VM ended")
	started, err := w.c.InstancesStart(t.Context(), &client.InstancesStartInput{TenantId: "acme", InstanceId: id, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	require.Equal(t, "running", string(started.Data.State), "error: %v; agent:\n%s", started.Data.Error, proctest.Tail(w.agent.Proc.Stderr.String(), 20))
	boots := func() int {
		b, _ := os.ReadFile(w.vmFile(id, "console.log"))
		return strings.Count(string(b), "compute-guest: READY")
	}
	before := boots()
	require.Positive(t, before)
	rb, err := w.c.InstancesReboot(t.Context(), &client.InstancesRebootInput{TenantId: "acme", InstanceId: id})
	require.NoError(t, err)
	assert.EqualValues(t, 1, rb.Data.Reboots)
	require.Eventually(t, func() bool { return boots() > before && w.get(id).State == "running" }, 30*time.Second, 100*time.Millisecond,
		"the guest booted again and answered")

	// The daemon killed and restarted: the VM runs on and is still tracked.
	pid := w.vmPid(id)
	require.True(t, alive(pid))
	var epoch int64
	require.NoError(t, w.DB.QueryRow(t.Context(), `select session_epoch from nodes where node_id = $1`, w.node).Scan(&epoch))
	w.agent.Proc.Kill(t)
	assert.True(t, alive(pid), "the VM outlives its daemon")
	w.agent.Run()
	require.Eventually(t, func() bool {
		var now int64
		_ = w.DB.QueryRow(t.Context(), `select session_epoch from nodes where node_id = $1 and session_gateway is not null`, w.node).Scan(&now)
		return now > epoch
	}, 30*time.Second, 50*time.Millisecond, "a new session; agent:\n%s", proctest.Tail(w.agent.Proc.Stderr.String(), 30))
	assert.Equal(t, pid, w.vmPid(id))
	assert.Equal(t, "running", string(w.get(id).State))

	// A VM killed from outside is noticed and reported.
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return w.get(id).State == "failed" }, 60*time.Second, 100*time.Millisecond,
		"agent:\n%s", proctest.Tail(w.agent.Proc.Stderr.String(), 30))
	assert.Contains(t, w.get(id).Error.Value, "without being asked")
	assert.Equal(t, 1, w.Events("instance.failed", id))

	// delete: the VM's files go, capacity and quota come back.
	del, err := w.c.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: "acme", InstanceId: id})
	require.NoError(t, err)
	assert.Equal(t, "deleted", string(del.Data.DesiredState))
	require.Eventually(t, func() bool { return w.get(id).State == "deleted" }, 20*time.Second, 100*time.Millisecond)
	assert.NoDirExists(t, filepath.Dir(w.vmFile(id, "x")))
	require.NoError(t, w.DB.QueryRow(t.Context(), `select booked_vcpu from nodes where node_id = $1`, w.node).Scan(&booked))
	assert.Zero(t, booked)
	for _, typ := range []string{"instance.created", "instance.running", "instance.stopped", "instance.deleted"} {
		assert.GreaterOrEqual(t, w.Events(typ, id), 1, typ)
	}
}

// Disk images (raw and qcow2, booted by firmware): two instances of one raw
// image run side by side, each on an overlay of its own, and a qcow2 one
// beside them; the image files are never written.
func TestDiskImagesOnRealVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	w := setup(t)
	raw, qcow2 := qemutest.DiskImage(t, "raw"), qemutest.DiskImage(t, "qcow2")
	sum := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	type result struct {
		inst client.Instance
		err  error
	}
	images := []string{raw.ID, raw.ID, qcow2.ID}
	results := make([]result, len(images))
	var wg sync.WaitGroup
	for i, image := range images {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := w.c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: "acme", PoolId: w.poolID, Flavor: "small", Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone),
				ImageId: image, Name: fmt.Sprintf("disk-%d", i), IdempotencyKey: fmt.Sprintf("disk-%d", i),
				Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
			if err == nil {
				results[i].inst = res.Data
			}
			results[i].err = err
		}()
	}
	wg.Wait()
	for i, r := range results {
		require.NoError(t, r.err)
		inst := r.inst
		if inst.State != "running" { // firmware boots are slower under TCG: one more wait
			// Not fatal here: a VM still starting fails the check below,
			// which shows its console and the agent's log.
			assert.Eventually(t, func() bool { inst = w.get(inst.InstanceId); return inst.State != "pending" && inst.State != "starting" },
				60*time.Second, 100*time.Millisecond)
		}
		require.Equal(t, "running", string(inst.State), "%s: %v; console: %s; agent:\n%s", images[i], inst.Error,
			func() string {
				b, _ := os.ReadFile(w.vmFile(inst.InstanceId, "console.log"))
				return proctest.Tail(string(b), 5)
			}(),
			proctest.Tail(w.agent.Proc.Stderr.String(), 20))
		info, err := exec.Command(qemu.ImgBinary, "info", "-U", w.vmFile(inst.InstanceId, "root.qcow2")).CombinedOutput()
		require.NoError(t, err, "its own overlay: %s", info)
		base := raw.Location
		if images[i] == qcow2.ID {
			base = qcow2.Location
		}
		assert.Contains(t, string(info), "backing file: "+base, "booted from an overlay of the image")
	}
	assert.Equal(t, raw.SHA256, sum(raw.Location), "the raw image is never written")
	assert.Equal(t, qcow2.SHA256, sum(qcow2.Location), "the qcow2 image is never written")
	for _, r := range results {
		_, err := w.c.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: "acme", InstanceId: r.inst.InstanceId})
		require.NoError(t, err)
	}
}
