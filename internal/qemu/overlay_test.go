package qemu_test

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/qemu"
)

// Two VMs of one disk image run at once, each on an overlay of its own:
// the image is opened read-only through the overlays (no write lock is
// taken on it) and is never written.
func TestOverlaysShareAnImage(t *testing.T) {
	dir, err := os.MkdirTemp("", "ov") // short: unix socket paths
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	base := filepath.Join(dir, "image.raw")
	require.NoError(t, os.WriteFile(base, []byte("a disk image"), 0o600))
	require.NoError(t, os.Truncate(base, 8<<20))
	sum := func() [32]byte { b, _ := os.ReadFile(base); return sha256.Sum256(b) }
	before := sum()

	var vms []*qemu.VM
	for _, name := range []string{"a", "b"} {
		overlay := filepath.Join(dir, name+".qcow2")
		require.NoError(t, qemu.Overlay(t.Context(), base, "raw", overlay))
		info, err := exec.Command(qemu.ImgBinary, "info", overlay).CombinedOutput()
		require.NoError(t, err, string(info))
		assert.Contains(t, string(info), "backing file: "+base)
		v, err := qemu.Start(t.Context(), &qemu.Config{ID: name, Dir: filepath.Join(dir, name), VCPU: 1, MemoryMiB: 128, Accel: qemu.AccelTCG,
			Machine: qemu.MachineQ35, Disks: []qemu.Disk{{Path: overlay, Serial: "root", Format: "qcow2"}}})
		require.NoError(t, err, "VM %s on its overlay", name)
		t.Cleanup(func() { _ = v.Kill() })
		vms = append(vms, v)
	}
	time.Sleep(500 * time.Millisecond)
	for _, v := range vms {
		assert.True(t, v.Alive(), "VM %s runs beside the other", v.Config.ID)
	}

	// An overlay already there is kept (a stopped VM started again keeps
	// its disk); the image is untouched.
	overlay := filepath.Join(dir, "a.qcow2")
	st, err := os.Stat(overlay)
	require.NoError(t, err)
	require.NoError(t, qemu.Overlay(t.Context(), base, "raw", overlay))
	again, err := os.Stat(overlay)
	require.NoError(t, err)
	assert.Equal(t, st.ModTime(), again.ModTime())
	assert.Equal(t, before, sum(), "the image is never written")
	assert.Error(t, qemu.Overlay(t.Context(), base, "kernel+initrd", filepath.Join(dir, "c.qcow2")))
}
