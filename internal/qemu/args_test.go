package qemu

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A VM's network card: a virtio-net on the host's tap, on the machine's
// bus (virtio-mmio on microvm, PCI on q35); none without Net.
func TestNetDeviceArgs(t *testing.T) {
	c := &Config{ID: "a", Dir: t.TempDir(), VCPU: 1, MemoryMiB: 128, Accel: AccelTCG, Machine: MachineMicroVM, Kernel: "/k"}
	require.NoError(t, c.Check())
	assert.NotContains(t, strings.Join(c.Args(), " "), "-netdev")

	c.Net = &NetDevice{Tap: "cpabcdt01234567", MAC: "52:54:00:12:34:56"}
	require.NoError(t, c.Check())
	args := strings.Join(c.Args(), " ")
	assert.Contains(t, args, "-netdev tap,id=n0,ifname=cpabcdt01234567,script=no,downscript=no -device virtio-net-device,netdev=n0,mac=52:54:00:12:34:56")

	c.Machine = MachineQ35
	assert.Contains(t, strings.Join(c.Args(), " "), "-device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56")

	for _, bad := range []NetDevice{{Tap: "t,x", MAC: "52:54:00:12:34:56"}, {Tap: "", MAC: "52:54:00:12:34:56"},
		{Tap: "cpabcdt01234567x", MAC: "52:54:00:12:34:56"}, {Tap: "t0", MAC: "52:54:00:12:34"}} {
		c.Net = &bad
		assert.Error(t, c.Check(), "%+v", bad)
	}
}
