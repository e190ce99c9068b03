package benchkit

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"computeplane/internal/images"
	"computeplane/internal/qemu"
)

// RuntimeMachine is the qemu configuration the qemu runtime gives a VM of
// im (microvm, TCG, 1 vCPU, 256 MiB), with cmdline appended to the
// image's kernel command line: benchmarks boot it to compare the
// runtime's boots with qemu alone.
func RuntimeMachine(id, dir string, im *images.Image, cmdline string) *qemu.Config {
	return &qemu.Config{ID: id, Dir: dir, VCPU: 1, MemoryMiB: 256, Accel: qemu.AccelTCG,
		Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: strings.TrimSpace(im.Cmdline + " " + cmdline)}
}

// GuestChannel waits until vm's guest channel opens, or ctx ends.
func GuestChannel(ctx context.Context, vm *qemu.VM) (*qemu.Guest, error) {
	for {
		g, err := vm.Guest()
		if err == nil {
			return g, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("guest channel: %w (last: %v)", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// BareBoot boots the image with qemu alone (the runtime's machine and
// flags, TCG) until compute-guest's ready event, and ends it: the
// baseline a benchmark compares the runtime's boots with.
func BareBoot(ctx context.Context, work string, im *images.Image, i int) (time.Duration, error) {
	c := RuntimeMachine("bare-"+strconv.Itoa(i), filepath.Join(work, "bare"), im, "compute.hostname=bare")
	start := time.Now()
	vm, err := qemu.Start(ctx, c)
	if err != nil {
		return 0, err
	}
	defer func() { _ = vm.Kill() }()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	g, err := GuestChannel(rctx, vm)
	if err != nil {
		return 0, err
	}
	if _, err = g.Ready(rctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
