package vmruntime

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// fakeLauncher starts fakeVMs: the converge loop's state machine runs
// without qemu. The real VMs are tested by internal/instances and
// internal/sandboxes, which boot them through compute-agent.
type fakeLauncher struct {
	mu      sync.Mutex
	started []*fakeVM
	// startErr fails the next starts; prepare sets up each VM before
	// Start returns it (gates, failures).
	startErr error
	prepare  func(*fakeVM)
	// attach answers Attach by the VM directory's name; killedDirs
	// records KillDir.
	attach     map[string]attachAnswer
	killedDirs []string
}

type attachAnswer struct {
	vm  *fakeVM
	err error
}

func (l *fakeLauncher) Start(_ context.Context, c *qemu.Config) (VM, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.startErr != nil {
		return nil, l.startErr
	}
	vm := newFakeVM(c)
	if c.MemoryFile != "" && !c.MemoryPrivate {
		if err := os.WriteFile(c.MemoryFile, []byte("guest memory"), 0o600); err != nil {
			return nil, err
		}
	}
	if l.prepare != nil {
		l.prepare(vm)
	}
	l.started = append(l.started, vm)
	return vm, nil
}

func (l *fakeLauncher) Attach(dir string) (VM, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.attach[filepath.Base(dir)]
	if !ok {
		return nil, qemu.ErrGone
	}
	if a.err != nil {
		return nil, a.err
	}
	return a.vm, nil
}

func (l *fakeLauncher) KillDir(dir string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.killedDirs = append(l.killedDirs, filepath.Base(dir))
}

// vms are the VMs started for instance id, in order.
func (l *fakeLauncher) vms(id string) []*fakeVM {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*fakeVM
	for _, vm := range l.started {
		if vm.cfg.ID == id {
			out = append(out, vm)
		}
	}
	return out
}

// vm is the one VM started for instance id.
func (l *fakeLauncher) vm(t *testing.T, id string) *fakeVM {
	t.Helper()
	vms := l.vms(id)
	require.Len(t, vms, 1, "VMs started for %s", id)
	return vms[0]
}

// fakeVM is a VM and its guest agent. A gate (a channel) holds the
// operation until the test closes it.
type fakeVM struct {
	cfg *qemu.Config

	mu        sync.Mutex
	alive     bool
	status    string   // running, paused
	calls     []string // pause, resume, reset, stop, kill, detach, save, nice
	requests  []string
	hostname  string
	machineID string
	networks  []*guestproto.Network // the identity requests' networks, in order
	userData  string                // as RunUserData got it

	readyGate chan struct{} // Ready waits for it
	callGate  chan struct{} // a guest request waits for it
	saveGate  chan struct{} // SaveState waits for it
	killGate  chan struct{} // Kill waits for it
	saving    chan struct{} // closed when SaveState is entered
	guestErr  error         // Guest fails (the channel does not open)
	qmpErr    error         // Status fails (QMP does not answer)
	resumeErr error
	rootBad   bool // the guest's root filesystem does not check out
}

func newFakeVM(c *qemu.Config) *fakeVM {
	return &fakeVM{cfg: c, alive: true, status: "running", saving: make(chan struct{})}
}

func (v *fakeVM) record(call string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.calls = append(v.calls, call)
}

// Calls returns what was done to the VM, in order.
func (v *fakeVM) Calls() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.calls)
}

// Requests returns the guest requests the VM answered, in order.
func (v *fakeVM) Requests() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.requests)
}

// Hostname is the one the guest was given last.
func (v *fakeVM) Hostname() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hostname
}

// Networks are the networks the identity requests carried, in order.
func (v *fakeVM) Networks() []*guestproto.Network {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.networks)
}

// UserData is what the guest was given as user data.
func (v *fakeVM) UserData() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.userData
}

// die ends the VM's process, as a crash or a kill from outside would.
func (v *fakeVM) die() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.alive = false
}

func (v *fakeVM) Alive() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.alive
}

func (v *fakeVM) Status() (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.qmpErr != nil {
		return "", v.qmpErr
	}
	return v.status, nil
}

func (v *fakeVM) Pause() error {
	v.record("pause")
	v.mu.Lock()
	defer v.mu.Unlock()
	v.status = "paused"
	return nil
}

func (v *fakeVM) Resume() error {
	v.record("resume")
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.resumeErr != nil {
		return v.resumeErr
	}
	v.status = "running"
	return nil
}

func (v *fakeVM) Reset() error { v.record("reset"); return nil }

func (v *fakeVM) Stop(context.Context) error {
	v.record("stop")
	v.die()
	return nil
}

func (v *fakeVM) Kill() error {
	if v.killGate != nil {
		<-v.killGate
	}
	v.record("kill")
	v.die()
	return nil
}

func (v *fakeVM) Detach() { v.record("detach") }

func (v *fakeVM) SetNice(nice int) error {
	v.record("nice")
	v.mu.Lock()
	defer v.mu.Unlock()
	v.cfg.Nice = nice
	return nil
}

func (v *fakeVM) SaveState(ctx context.Context, file string) error {
	v.record("save")
	close(v.saving)
	if v.saveGate != nil {
		select {
		case <-v.saveGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return os.WriteFile(file, []byte("device state"), 0o600)
}

func (v *fakeVM) Guest() (Guest, error) {
	if v.guestErr != nil {
		return nil, v.guestErr
	}
	return v, nil
}

func (v *fakeVM) Config() *qemu.Config { return v.cfg }
func (v *fakeVM) Pid() int             { return 4242 }

func (v *fakeVM) Ready(ctx context.Context) (guestproto.Ready, error) {
	if v.readyGate != nil {
		select {
		case <-v.readyGate:
		case <-ctx.Done():
			return guestproto.Ready{}, ctx.Err()
		}
	}
	return guestproto.Ready{BootID: "boot"}, nil
}

func (v *fakeVM) Call(ctx context.Context, r guestproto.Request) (guestproto.Response, error) {
	v.mu.Lock()
	gate := v.callGate
	v.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return guestproto.Response{}, ctx.Err()
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.requests = append(v.requests, r.Op)
	if r.Op == guestproto.OpIdentity {
		v.hostname, v.machineID = r.Identity.Hostname, r.Identity.MachineID
		v.networks = append(v.networks, r.Identity.Network)
	}
	return guestproto.Response{OK: true, Status: &guestproto.Status{Hostname: v.hostname, MachineID: v.machineID, RootOK: !v.rootBad}}, nil
}

func (v *fakeVM) RunUserData(_ context.Context, userData string) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.requests = append(v.requests, guestproto.OpWriteFile)
	v.userData = userData
	return 0, nil
}

// newRuntime is a qemu runtime over fake VMs in a directory of its own.
func newRuntime(t *testing.T, l *fakeLauncher) *QEMU {
	t.Helper()
	r, err := newQEMU(t.TempDir(), "tcg", discard, l)
	require.NoError(t, err)
	r.VolumeDir = t.TempDir()
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// inst is an instance of a kernel+initrd image (no overlay to make).
func inst(id, state string) agentproto.InstanceSpec {
	return agentproto.InstanceSpec{ID: id, State: state, Hostname: id + "-host",
		Boot: agentproto.Boot{Format: "kernel+initrd", Location: "/images/vmlinuz", Initrd: "/images/initrd"}}
}

func apply(t *testing.T, r *QEMU, in ...agentproto.InstanceSpec) map[string]agentproto.InstanceStatus {
	t.Helper()
	st, err := r.Apply(t.Context(), 1, agentproto.SpecBody{Instances: in})
	require.NoError(t, err)
	return byID(st)
}

func byID(st []agentproto.InstanceStatus) map[string]agentproto.InstanceStatus {
	out := map[string]agentproto.InstanceStatus{}
	for _, s := range st {
		out[s.ID] = s
	}
	return out
}

func observe(r *QEMU, id string) agentproto.InstanceStatus {
	return byID(r.Observe(context.Background()))[id]
}

// waitState waits for instance id to report state.
func waitState(t *testing.T, r *QEMU, id, state string) agentproto.InstanceStatus {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, state, observe(r, id).State)
	}, 5*time.Second, 5*time.Millisecond)
	return observe(r, id)
}

// drain drains the runtime's change signal.
func drain(r *QEMU) {
	select {
	case <-r.Changes():
	default:
	}
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

var errNoQMP = errors.New("qemu: QMP: connection refused")
