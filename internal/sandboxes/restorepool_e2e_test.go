package sandboxes_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu"
)

// qemuAlive tells whether pid is a running qemu (not gone, not a zombie).
func qemuAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return err == nil && strings.Contains(string(b), "qemu")
}

// pooledQemus are the pids of the agent's restore pool that run; ready
// only those that wait to be taken (their start done).
func (w *world) pooledQemus(ready bool) []int {
	var pids []int
	files, _ := filepath.Glob(filepath.Join(vmruntime.PoolDir(filepath.Join(w.agent.Dir, "runtime")), "*", "qemu.pid"))
	for _, f := range files {
		if fi, err := os.Lstat(filepath.Dir(f)); err != nil || !fi.IsDir() {
			continue // the link of a taken one, to its VM's directory
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(f), vmruntime.ReadyFile)); ready && err != nil {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && qemuAlive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// fromPool counts the VMs whose qemu was taken from the pool (started in
// another directory, moved to the VM's).
func (w *world) fromPool() (n int) {
	dirs, _ := filepath.Glob(filepath.Join(w.agent.Dir, "runtime", "vms", "*"))
	for _, d := range dirs {
		if c, err := qemu.LoadConfig(d); err == nil && c.ExecDir != "" {
			n++
		}
	}
	return n
}

// A restore takes a qemu that the node's daemon started ahead for the
// snapshot (its state loaded, its guest run to a ping and paused); the
// pool is refilled; the restored sandbox works, also after the daemon
// restarted; and every pooled qemu ends with the daemon.
func TestRestoreFromPrestartedQemu(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	w := setupWith(t, "--restore-pool", "1")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent:\n%s", proctest.Tail(w.agent.Proc.Stderr.String(), 60))
		}
	})
	tmpl := w.template("pooled", 0, nil)
	src := w.running("src", client.SandboxesCreateInput{TemplateId: client.NewOptString(tmpl.TemplateId)})
	w.write(src.SandboxId, "/root/notes/a.txt", "before the snapshot")
	res, err := w.C.SandboxSnapshotsCreate(t.Context(), &client.SandboxSnapshotsCreateInput{TenantId: tenant, SandboxId: src.SandboxId,
		Keep: client.NewOptBool(true), IdempotencyKey: "s", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	snap := res.Data
	require.Equal(t, "ready", string(snap.State), "error %v", snap.Error)
	w.write(src.SandboxId, "/root/notes/a.txt", "after the snapshot")

	// The snapshot has its pooled qemu once its guest answered.
	var first []int
	require.Eventually(t, func() bool { first = w.pooledQemus(true); return len(first) == 1 }, 60*time.Second, 100*time.Millisecond)

	var restored []client.Sandbox
	for i := range 2 {
		r := w.running("r"+strconv.Itoa(i), client.SandboxesCreateInput{FromSnapshot: client.NewOptString(snap.SnapshotId)})
		assert.Equal(t, "restore", string(r.Timings.How))
		assert.Equal(t, i+1, w.fromPool(), "restore %d took the pooled qemu", i+1)
		assert.Equal(t, "before the snapshot", w.read(r.SandboxId, "/root/notes/a.txt"))
		assert.Equal(t, r.Hostname, w.sh(r.SandboxId, "hostname"), "the restored sandbox has its own identity")
		t.Logf("restore %d from the pool: ready in %d ms (host %d ms)", i+1, r.Timings.ReadyMs.Value, r.Timings.HostReadyMs.Value)
		restored = append(restored, r)
		// Refilled: another qemu waits (not the one taken).
		var now []int
		require.Eventually(t, func() bool { now = w.pooledQemus(true); return len(now) == 1 && now[0] != first[0] }, 60*time.Second, 100*time.Millisecond)
		first = now
	}
	assert.NotEqual(t, restored[0].Hostname, restored[1].Hostname)
	// A sandbox restored from the pool is snapshotted as any other.
	res, err = w.C.SandboxSnapshotsCreate(t.Context(), &client.SandboxSnapshotsCreateInput{TenantId: tenant, SandboxId: restored[1].SandboxId,
		IdempotencyKey: "of-pooled", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	require.Equal(t, "ready", string(res.Data.State), "error %+v", res.Data.Error)
	w.write(restored[0].SandboxId, "/root/notes/a.txt", "written in restore 1")
	assert.Equal(t, "before the snapshot", w.read(restored[1].SandboxId, "/root/notes/a.txt"), "restores share nothing")

	// The daemon stops: every pooled qemu ends with it (the sandboxes'
	// VMs run on, as VMs do), and a daemon that starts again re-attaches
	// to a VM whose qemu came from the pool.
	pooled := w.pooledQemus(false)
	require.NotEmpty(t, pooled)
	w.agent.Stop()
	for _, pid := range pooled {
		assert.False(t, qemuAlive(pid), "pooled qemu %d ended with the daemon", pid)
	}
	entries, _ := os.ReadDir(vmruntime.PoolDir(filepath.Join(w.agent.Dir, "runtime")))
	for _, e := range entries {
		assert.NotZero(t, e.Type()&os.ModeSymlink, "%s: only the links of taken qemus stay", e.Name())
	}
	w.agent.Run()
	require.Eventually(t, func() bool { return w.NodeState(w.agent.Node) == "ready" }, 30*time.Second, 50*time.Millisecond)
	assert.Equal(t, "written in restore 1", w.read(restored[0].SandboxId, "/root/notes/a.txt"))
	assert.Equal(t, "running", string(w.get(restored[1].SandboxId).State))

	// After the restart the pool is empty until a restore asks for it:
	// that one starts qemu the ordinary way, and the pool fills again.
	third := w.running("r-after", client.SandboxesCreateInput{FromSnapshot: client.NewOptString(snap.SnapshotId)})
	assert.Equal(t, "before the snapshot", w.read(third.SandboxId, "/root/notes/a.txt"))
	assert.Equal(t, 2, w.fromPool(), "no pooled qemu after a restart")
	require.Eventually(t, func() bool { pooled = w.pooledQemus(true); return len(pooled) == 1 }, 60*time.Second, 100*time.Millisecond)

	// Deleting the snapshot ends its pooled qemus.
	for _, r := range append(restored, third) {
		_, err := w.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: r.SandboxId})
		require.NoError(t, err)
	}
	_, err = w.C.SandboxSnapshotsDelete(t.Context(), &client.SandboxSnapshotsDeleteInput{TenantId: tenant, SnapshotId: snap.SnapshotId})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !qemuAlive(pooled[0]) }, 30*time.Second, 100*time.Millisecond, "the deleted snapshot's pooled qemu ended")
	assert.Empty(t, w.pooledQemus(false))
}
