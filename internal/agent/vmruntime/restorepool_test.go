package vmruntime

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
	"computeplane/internal/qemu"
)

// A pooled qemu serves restores of its snapshot's shape: the name,
// directory, niceness and kernel command line (a restored guest never
// reads it) of the restore do not matter; what qemu holds from its start
// (memory, disks, card) does.
func TestRestorePoolShapes(t *testing.T) {
	r := &QEMU{Dir: "/run/agent", VolumeDir: "/run/agent/volumes", accel: qemu.AccelTCG}
	spec := func(id string) agentproto.InstanceSpec {
		return agentproto.InstanceSpec{ID: id, VCPU: 1, MemoryMiB: 256, DiskGiB: 1, Hostname: "h-" + id, Restore: "snap_1", MemoryFile: true,
			Boot: agentproto.Boot{Format: "kernel+initrd", Location: "/img/vmlinux", Initrd: "/img/initrd", Cmdline: "console=ttyS0"}}
	}
	a, _, diskA, _ := r.vmConfig("a", spec("a"))
	b, _, diskB, _ := r.vmConfig("b", spec("b"))
	b.Nice = WarmNice
	assert.Equal(t, poolKey(a), poolKey(b), "another name, directory, hostname and niceness: the same shape")
	assert.Equal(t, diskA, diskB)

	bigger := spec("c")
	bigger.MemoryMiB = 512
	c, _, _, _ := r.vmConfig("c", bigger)
	assert.NotEqual(t, poolKey(a), poolKey(c), "more memory: another shape")

	// A disk of its own copied from the snapshot, or none; no volume,
	// no card.
	assert.True(t, poolable(a, "/run/agent/snapshots/snap_1/disk0.raw"))
	assert.False(t, poolable(a, ""), "a disk that is not the snapshot's copy")
	noDisk := spec("d")
	noDisk.DiskGiB = 0
	d, _, _, _ := r.vmConfig("d", noDisk)
	assert.True(t, poolable(d, ""))
	withVolume := spec("e")
	withVolume.Volumes = []agentproto.SpecVolume{{Serial: "vol1", MountPath: "/data"}}
	e, _, _, _ := r.vmConfig("e", withVolume)
	assert.False(t, poolable(e, "/run/agent/snapshots/snap_1/disk0.raw"))
	d.Net = &qemu.NetDevice{Tap: "tap1", MAC: "02:00:00:00:00:01"}
	assert.False(t, poolable(d, ""))

	require.Error(t, RestorePool{Size: 9, Snapshots: 4}.Check())
	require.Error(t, RestorePool{Size: 1, Snapshots: 0}.Check())
	require.NoError(t, RestorePool{Size: 0, Snapshots: 4}.Check())
}
