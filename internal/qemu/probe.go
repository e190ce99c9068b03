package qemu

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"computeplane/internal/guestproto"
)

// ProbeTimeout bounds the KVM probe boot.
const ProbeTimeout = 20 * time.Second

// ChooseAccel decides KVM or TCG by a real probe boot of kernel and
// initrd under KVM (a guest agent answering within ProbeTimeout), never
// by opening /dev/kvm: some hosts expose a /dev/kvm that stock kernels
// cannot run on (a nested PVM backend). It returns the accelerator and,
// for the report, why.
func ChooseAccel(ctx context.Context, dir, kernel, initrd, cmdline string) (accel, why string) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return AccelTCG, "no /dev/kvm"
	}
	c := &Config{ID: "kvm-probe", Dir: filepath.Join(dir, "kvm-probe"), VCPU: 1, MemoryMiB: 256, Accel: AccelKVM,
		Machine: MachineMicroVM, Kernel: kernel, Initrd: initrd, Cmdline: cmdline}
	defer os.RemoveAll(c.Dir)
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	v, err := Start(ctx, c)
	if err != nil {
		return AccelTCG, "KVM probe: " + err.Error()
	}
	defer func() { _ = v.Kill() }()
	var g *Guest
	for g == nil {
		if g, err = v.Guest(); err != nil {
			if ctx.Err() != nil || !v.Alive() {
				return AccelTCG, "KVM probe: the guest did not come up under KVM"
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := g.Ready(ctx); err != nil {
		return AccelTCG, "KVM probe: the guest did not answer under KVM within " + ProbeTimeout.String()
	}
	if _, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpPing}); err != nil {
		return AccelTCG, "KVM probe: " + err.Error()
	}
	return AccelKVM, "a probe boot answered under KVM"
}
