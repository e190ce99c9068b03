package benchkit

import (
	"context"
	"path/filepath"
	"strconv"
	"time"

	"computeplane/internal/images"
	"computeplane/internal/qemu"
)

// BareBoot boots the image with qemu alone (the runtime's machine and
// flags, TCG) until compute-guest's ready event, and ends it: the
// baseline a benchmark compares the runtime's boots with.
func BareBoot(ctx context.Context, work string, im *images.Image, i int) (time.Duration, error) {
	c := &qemu.Config{ID: "bare-" + strconv.Itoa(i), Dir: filepath.Join(work, "bare"), VCPU: 1, MemoryMiB: 256, Accel: qemu.AccelTCG,
		Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline + " compute.hostname=bare"}
	start := time.Now()
	vm, err := qemu.Start(ctx, c)
	if err != nil {
		return 0, err
	}
	defer func() { _ = vm.Kill() }()
	var g *qemu.Guest
	for g == nil {
		if g, err = vm.Guest(); err != nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err = g.Ready(rctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
