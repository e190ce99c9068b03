package qemudriver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/drivers"
	"computeplane/internal/drivers/qemudriver"
	"computeplane/internal/qemu/qemutest"
)

func hostDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mh") // short: unix socket paths under it
	require.NoError(t, err)
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "vm", "qemu.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

func TestFirmwareSettingsWithoutBooting(t *testing.T) {
	dir := hostDir(t)
	raw, _ := json.Marshal(qemudriver.Config{Dir: dir, DiskBytes: 32 << 20})
	d, err := qemudriver.Open(t.Context(), raw)
	require.NoError(t, err)
	ctx := t.Context()
	st, err := d.PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, drivers.PowerOff, st)
	require.NoError(t, d.Power(ctx, drivers.ActionOff), "off when off")

	inv, err := d.Inventory(ctx)
	require.NoError(t, err)
	assert.Equal(t, "QEMU", inv.Manufacturer)
	assert.EqualValues(t, 32<<20, inv.Disks[0].SizeBytes)
	assert.True(t, strings.HasPrefix(inv.SerialNumber, "QEMU-"))
	d2, err := qemudriver.Open(ctx, raw)
	require.NoError(t, err)
	inv2, err := d2.Inventory(ctx)
	require.NoError(t, err)
	assert.Equal(t, inv.SerialNumber, inv2.SerialNumber, "the host keeps its identity across opens")

	// A blank disk does not boot; cd without bootable media neither.
	err = d.Power(ctx, drivers.ActionOn)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no /boot/vmlinux on disk0")
	require.NoError(t, d.SetBootDevice(ctx, drivers.BootCD, true))
	err = d.Power(ctx, drivers.ActionOn)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no bootable kernel+initrd media in slot cd")
	assert.ErrorIs(t, d.SetBootDevice(ctx, drivers.BootPXE, false), drivers.ErrUnsupported)

	assert.Error(t, d.InsertMedia(ctx, drivers.Media{Slot: "floppy", Format: "raw", URL: "/dev/null"}))
	assert.Error(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotUSB, Format: "raw", URL: "http://x/y.raw"}), "a local path")
	assert.Error(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotUSB, Format: "raw", URL: filepath.Join(dir, "missing.raw")}))
	assert.Error(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotUSB, Format: "kernel+initrd", URL: "/dev/null", Initrd: "/dev/null"}),
		"a kernel boots from slot cd only")
	require.NoError(t, d.EjectMedia(ctx, drivers.SlotUSB), "an empty slot")
	_, err = d.Agent(ctx)
	assert.Error(t, err, "no agent while off")
	out, err := d.Console(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, out)

	_, err = qemudriver.Open(ctx, json.RawMessage(`{"dir": "relative"}`))
	assert.Error(t, err)
}

// One VM through the driver: power on from the virtual CD (the in-memory
// agent), the agent reached, a reset with unchanged media is a QMP
// system_reset of the same qemu (a new boot), power off.
func TestBootFromVirtualMedia(t *testing.T) {
	im := qemutest.Image(t)
	dir := hostDir(t)
	d, err := qemudriver.New(qemudriver.Config{Dir: dir, DiskBytes: 32 << 20})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	require.NoError(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotCD, Format: "kernel+initrd", URL: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline}))
	require.NoError(t, d.SetBootDevice(ctx, drivers.BootCD, false))
	require.NoError(t, d.Power(ctx, drivers.ActionOn))
	require.NoError(t, d.Power(ctx, drivers.ActionOn), "on when on")
	st, err := d.PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, drivers.PowerOn, st)

	status := func() *drivers.AgentStatus {
		var out *drivers.AgentStatus
		require.Eventually(t, func() bool {
			a, err := d.Agent(ctx)
			if err != nil {
				return false
			}
			defer a.Close()
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			out, err = a.Status(cctx)
			return err == nil
		}, time.Minute, 100*time.Millisecond)
		return out
	}
	first := status()
	assert.Contains(t, first.Cmdline, "compute.boot=cd")
	pid, err := os.ReadFile(filepath.Join(dir, "vm", "qemu.pid"))
	require.NoError(t, err)

	require.NoError(t, d.Power(ctx, drivers.ActionReset))
	var second *drivers.AgentStatus
	require.Eventually(t, func() bool { second = status(); return second.BootID != first.BootID }, time.Minute, 200*time.Millisecond)
	pid2, err := os.ReadFile(filepath.Join(dir, "vm", "qemu.pid"))
	require.NoError(t, err)
	assert.Equal(t, string(pid), string(pid2), "the same qemu, reset over QMP")

	console, err := d.Console(ctx, 1<<20)
	require.NoError(t, err)
	assert.NotEmpty(t, console)
	require.NoError(t, d.Power(ctx, drivers.ActionOff))
	st, err = d.PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, drivers.PowerOff, st)
}
