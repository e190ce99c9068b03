package vmruntime

import (
	"context"

	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// VM is what the qemu runtime's converge loop needs of one virtual
// machine. The real one is a *qemu.VM (qemuVM); the runtime's unit tests
// put a fake behind it, so the state machine runs without booting.
type VM interface {
	Alive() bool
	Status() (string, error) // qemu's run state: running, paused ...
	Pause() error
	Resume() error
	Reset() error
	Stop(ctx context.Context) error
	Kill() error
	Detach()
	SetNice(nice int) error
	SaveState(ctx context.Context, file string) error
	Guest() (Guest, error)
	Config() *qemu.Config
	Pid() int
}

// Guest is what the runtime needs of a guest agent's channel
// (*qemu.Guest).
type Guest interface {
	Ready(ctx context.Context) (guestproto.Ready, error)
	Call(ctx context.Context, r guestproto.Request) (guestproto.Response, error)
	RunUserData(ctx context.Context, userData string) (int, error)
}

// Launcher starts VMs and finds the ones running from before: qemu's
// (qemuLauncher) or a test's.
type Launcher interface {
	Start(ctx context.Context, c *qemu.Config) (VM, error)
	// Attach re-attaches to the VM running in dir; qemu.ErrGone when it
	// no longer runs.
	Attach(dir string) (VM, error)
	// KillDir ends the VM in dir, if it runs.
	KillDir(dir string)
}

// qemuLauncher launches real VMs (internal/qemu).
type qemuLauncher struct{}

func (qemuLauncher) Start(ctx context.Context, c *qemu.Config) (VM, error) {
	vm, err := qemu.Start(ctx, c)
	if err != nil {
		return nil, err
	}
	return qemuVM{vm}, nil
}

func (qemuLauncher) Prestart(ctx context.Context, c *qemu.Config) (PrestartedVM, error) {
	vm, err := qemu.Prestart(ctx, c)
	if err != nil {
		return nil, err
	}
	return qemuVM{vm}, nil
}

func (qemuLauncher) Attach(dir string) (VM, error) {
	vm, err := qemu.Attach(dir)
	if err != nil {
		return nil, err
	}
	return qemuVM{vm}, nil
}

func (qemuLauncher) KillDir(dir string) { qemu.KillDir(dir) }

// qemuVM is a *qemu.VM as a VM: its Config and Pid fields become methods,
// its guest channel an interface (never a nil *qemu.Guest in one).
type qemuVM struct{ *qemu.VM }

func (v qemuVM) Config() *qemu.Config { return v.VM.Config }
func (v qemuVM) Pid() int             { return v.VM.Pid }

func (v qemuVM) Guest() (Guest, error) {
	g, err := v.VM.Guest()
	if err != nil {
		return nil, err
	}
	return g, nil
}
