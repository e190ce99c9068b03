package vmruntime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"computeplane/internal/agent/network"
	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// BootTimeout bounds a VM's boot to a guest agent that answers (TCG is
// slow; a loaded host slower).
const BootTimeout = 90 * time.Second

// QEMU runs each instance as a qemu VM (internal/qemu) under Dir/vms/<id>.
// VMs outlive the daemon: a new QEMU re-attaches to the ones running.
type QEMU struct {
	// applying is set while Apply converges, resuming are the resumes it
	// started (r.mu).
	applying bool
	resuming []*vmState
	Dir      string
	// VolumeDir is the node's volume store (<serial>.raw files): volumes
	// of a spec attach from there.
	VolumeDir string
	// MemoryDir holds the guest memory files of the instances that keep
	// one (agentproto.InstanceSpec.MemoryFile); a tmpfs there spares each page the guest
	// touches a block allocation on disk. Empty keeps them in the VMs'
	// directories.
	MemoryDir string
	Log       *slog.Logger
	accel     string
	// Changed is signalled when an instance's state changes outside Apply
	// (a boot finished, a VM died): the daemon sends a status.
	Changed chan struct{}

	// resolve resolves secret references in user data (UseSecrets).
	resolve ResolveFunc
	// launch starts and re-attaches VMs: qemu's, a fake in unit tests.
	launch Launcher
	// net wires VMs' networks (UseNetwork); nil runs VMs without one.
	// netMTU is the node's MTU for VMs that name none (netPrivateMTU for
	// private ones: the overlay's); netHook replaces netOf in tests;
	// overlays are the spec's private networks last given to net.
	net           Network
	netMTU        int
	netPrivateMTU int
	netHook       func(agentproto.InstanceSpec) *network.VM
	overlays      []network.Overlay
	// NetDNS are the node's resolvers (network.Config.Resolvers): the
	// DNS of an egress VM whose network names none. Set before
	// UseNetwork.
	NetDNS []netip.Addr

	mu   sync.Mutex
	vms  map[string]*vmState
	done chan struct{} // closed by Close: the watcher ends
	// releasing maps a volume's serial to the removal of the VM that
	// still holds it (closed once its qemu is gone); removals counts
	// the removals in flight.
	releasing map[string]chan struct{}
	removals  sync.WaitGroup
	// pool keeps qemus started ahead for restores (UseRestorePool); nil
	// when off.
	pool *restorePool
}

// UseRestorePool keeps qemu processes started ahead for the snapshots
// restored here (restorepool.go); Size 0 keeps none. Call it once, before
// the first Apply.
func (r *QEMU) UseRestorePool(cfg RestorePool) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	if cfg.Size == 0 {
		return nil
	}
	p, ok := r.launch.(Prestarter)
	if !ok {
		return errors.New("--restore-pool: this runtime's launcher starts no qemu ahead")
	}
	r.pool = newRestorePool(cfg, r.Dir, p, r.Log)
	return nil
}

type vmState struct {
	spec    agentproto.InstanceSpec
	vm      VM
	state   string
	err     string
	reboots int
	cancel  context.CancelFunc // of a boot in progress
	// qmpFailures counts the watcher's unanswered QMP checks; forceGone
	// marks a VM the watcher ended because QMP stopped answering.
	qmpFailures int
	forceGone   bool
	boots       int // raised by each boot and each stop: a boot that finds it changed lets go of its VM
	// identity is the identity generation the guest took and was checked
	// with; timings are the last start's.
	identity int64
	timings  *agentproto.HostTimings
	// wired is the network the node applied for the VM (Network.Add),
	// port its card; nil while none is.
	wired *network.VM
	port  network.Port
	// saved is the spec as instance.json holds it: a spec that repeats it
	// (every instance's, at each spec of the node) writes nothing.
	saved []byte
	// acked is set while the Apply that resumed the VM waits for the
	// resume (ResumeGrace): the resume closes it instead of signalling a
	// change, since that Apply's acknowledgement reports it.
	acked chan struct{}
}

// NewQEMU re-attaches to the VMs under dir. accel is kvm or tcg (the
// caller decides, by qemu.ChooseAccel where /dev/kvm exists).
func NewQEMU(dir, accel string, log *slog.Logger) (*QEMU, error) {
	return newQEMU(dir, accel, log, qemuLauncher{})
}

func newQEMU(dir, accel string, log *slog.Logger, launch Launcher) (*QEMU, error) {
	r := &QEMU{Dir: dir, Log: log, accel: accel, launch: launch, Changed: make(chan struct{}, 1), vms: map[string]*vmState{}, releasing: map[string]chan struct{}{}}
	if err := os.MkdirAll(filepath.Join(dir, "vms"), 0o700); err != nil {
		return nil, err
	}
	// Pooled qemus are the daemon's own: what a daemon that did not stop
	// cleanly left is ended.
	clearPoolDir(dir, launch)
	dirs, _ := filepath.Glob(filepath.Join(dir, "vms", "*"))
	for _, d := range dirs {
		var spec agentproto.InstanceSpec
		if readSpec(d, &spec) != nil {
			continue
		}
		st := &vmState{spec: spec, reboots: spec.Reboots, identity: readIdentity(d)}
		vm, err := launch.Attach(d)
		switch {
		case err == nil:
			st.vm, st.state = vm, StateRunning
			if s, err := vm.Status(); err == nil && s == "paused" {
				st.state = StatePaused
			}
			log.Info("re-attached to a running VM", "instance", spec.ID, "pid", vm.Pid())
		case spec.State == StateStopped:
			st.state = StateStopped
		case errors.Is(err, qemu.ErrGone):
			st.state, st.err = "failed", "the VM ended while the daemon was away"
		default:
			// Running but out of reach: end it rather than leave it
			// running untracked.
			launch.KillDir(d)
			st.state, st.err = "failed", "the daemon could not re-attach to the VM: "+err.Error()
			log.Warn("could not re-attach to a VM; ended it", "instance", spec.ID, "error", err.Error())
		}
		r.vms[spec.ID] = st
	}
	r.done = make(chan struct{})
	go r.watch()
	return r, nil
}

// WatchEvery is how often the runtime looks for VMs that ended on their
// own, so that they are reported without waiting for a heartbeat.
const WatchEvery = time.Second

func (r *QEMU) watch() {
	t := time.NewTicker(WatchEvery)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-t.C:
		}
		r.mu.Lock()
		died := false
		var check []*vmState
		for _, st := range r.vms {
			if st.vm != nil && st.cancel == nil && (st.state == StateRunning || st.state == StatePaused) {
				if !st.vm.Alive() {
					died = true
				} else {
					check = append(check, st)
				}
			}
		}
		r.mu.Unlock()
		// A VM whose process looks alive but whose QMP no longer answers
		// three times in a row is gone too (killed, hung): end it.
		for _, st := range check {
			_, err := st.vm.Status()
			r.mu.Lock()
			if err != nil {
				st.qmpFailures++
			} else {
				st.qmpFailures = 0
			}
			gone := st.qmpFailures >= 3 && !st.forceGone
			st.forceGone = st.forceGone || gone
			vm, id := st.vm, st.spec.ID
			r.mu.Unlock()
			if gone {
				r.Log.Warn("a VM's QMP does not answer; ending it", "instance", id)
				if vm != nil {
					_ = vm.Kill()
				}
				died = true
			}
		}
		if died {
			r.changed() // the daemon's status (Observe) reports it
		}
	}
}

func readSpec(dir string, s *agentproto.InstanceSpec) error {
	b, err := os.ReadFile(filepath.Join(dir, "instance.json"))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, s)
}

func (r *QEMU) vmDir(id string) string { return filepath.Join(r.Dir, "vms", id) }

// The identity generation a guest took survives a daemon restart in its
// VM's directory.
func readIdentity(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "identity"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func (r *QEMU) keepIdentity(id string, gen int64) {
	_ = os.WriteFile(filepath.Join(r.vmDir(id), "identity"), []byte(strconv.FormatInt(gen, 10)), 0o600)
}

// UseSecrets gives the runtime the daemon's way to resolve secret
// references in user data.
func (r *QEMU) UseSecrets(f ResolveFunc) { r.resolve = f }

// withSecrets substitutes the values of the secret references in user
// data, resolved through the daemon's session; they live in memory only.
func (r *QEMU) withSecrets(ctx context.Context, id, userData string) (string, error) {
	refs := agentproto.SecretReferences(userData)
	if len(refs) == 0 {
		return userData, nil
	}
	if r.resolve == nil {
		return "", errors.New("user data: secret references, and no way to resolve them")
	}
	values, err := r.resolve(ctx, id, refs)
	if err != nil {
		return "", fmt.Errorf("user data: secret references: %w", err)
	}
	for _, ref := range refs {
		v, ok := values[ref]
		if !ok {
			return "", fmt.Errorf("user data: %s was not resolved", ref)
		}
		userData = strings.ReplaceAll(userData, ref, v)
	}
	return userData, nil
}

// Name is "qemu".
func (r *QEMU) Name() string { return "qemu" }

// Accel is kvm or tcg.
func (r *QEMU) Accel() string { return r.accel }

func (r *QEMU) changed() {
	select {
	case r.Changed <- struct{}{}:
	default:
	}
}

// Apply converges the VMs on the spec. Boots run in the background (a
// status follows through Changed); stops, pauses and deletes are done
// when it returns.
func (r *QEMU) Apply(ctx context.Context, _ int64, spec agentproto.SpecBody) ([]agentproto.InstanceStatus, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	desired := make(map[string]agentproto.InstanceSpec, len(spec.Instances))
	for _, in := range spec.Instances {
		desired[in.ID] = in
	}
	var errs []error
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applying, r.resuming = true, nil
	if err := r.setOverlays(spec.Networks); err != nil {
		errs = append(errs, err)
	}
	for id, st := range r.vms {
		if _, ok := desired[id]; !ok {
			r.remove(id, st)
		}
	}
	// Deletions first: a boot of this spec may attach a volume that an
	// instance deleted by it still holds (released).
	for _, deleting := range []bool{true, false} {
		for id, vs := range desired {
			if (vs.State == StateDeleted) != deleting {
				continue
			}
			if err := r.converge(ctx, id, vs); err != nil {
				errs = append(errs, fmt.Errorf("instance %s: %w", id, err))
			}
		}
	}
	r.applying = false
	r.awaitResumes(ctx)
	return r.observeLocked(), errors.Join(errs...)
}

// awaited registers a start that someone waits for (a resume, a restore)
// with the Apply in progress, if any (r.mu held). The start calls done,
// r.mu held, when it ended (changed) or was superseded: it tells the
// waiting Apply, whose acknowledgement then reports it, or else signals a
// change as any start's end does.
func (r *QEMU) awaited(st *vmState) (done func(changed bool)) {
	if !r.applying {
		return func(changed bool) {
			if changed {
				r.changed()
			}
		}
	}
	acked := make(chan struct{})
	st.acked = acked
	r.resuming = append(r.resuming, st)
	return func(changed bool) {
		if st.acked == acked {
			st.acked = nil
			close(acked)
			return
		}
		if changed {
			r.changed()
		}
	}
}

// ResumeGrace is how long Apply waits for the resumes and restores it
// started (a warm instance claimed, a paused sandbox resumed, a sandbox
// restored from a snapshot) before it returns.
const ResumeGrace = 50 * time.Millisecond

// awaitResumes waits, r.mu released, up to ResumeGrace for the resumes
// this Apply started (r.resuming) to check out (r.mu held). Someone waits
// for each, and a resume takes milliseconds: so the daemon's
// acknowledgement of the spec, which follows Apply, reports the VM
// running, and the control plane writes one status for the claim instead
// of a "starting" one during the resume and a "running" one after it,
// queued behind the first on the node's session, both on the claim's 2
// cores. A resume that takes longer is acknowledged starting and reports
// running when it ends, as before.
func (r *QEMU) awaitResumes(ctx context.Context) {
	waits := r.resuming
	r.resuming = nil
	if len(waits) == 0 {
		return
	}
	chans := make([]chan struct{}, len(waits))
	for i, st := range waits {
		chans[i] = st.acked
	}
	r.mu.Unlock()
	t := time.NewTimer(ResumeGrace)
wait:
	for _, c := range chans {
		select {
		case <-c:
		case <-t.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	t.Stop()
	r.mu.Lock()
	for i, st := range waits {
		if st.acked == chans[i] {
			st.acked = nil // still resuming: it signals a change when it ends
		}
	}
}

// remove forgets an instance and ends its VM in the background (r.mu
// held): a guest with volumes writes their filesystems out first, which
// may take seconds, and nothing else on the node waits for it but a boot
// that attaches one of those volumes (released).
func (r *QEMU) remove(id string, st *vmState) {
	if st.cancel != nil {
		st.cancel()
	}
	delete(r.vms, id)
	gone := make(chan struct{})
	if st.vm != nil {
		for _, v := range st.spec.Volumes {
			r.releasing[v.Serial] = gone
		}
	}
	// A boot of the same id waits too: its network is added after this
	// one's is removed. So does a boot of another VM given this one's
	// address (the control plane frees it once this VM is no longer
	// reported, before its rules are gone).
	r.releasing[endingKey(id)] = gone
	if st.wired != nil {
		r.releasing[addressKey(st.wired)] = gone
	}
	vm, quiesce := st.vm, len(st.spec.Volumes) > 0 && st.state == StateRunning
	r.removals.Add(1)
	go func() {
		defer r.removals.Done()
		if vm != nil {
			if quiesce {
				// The guest writes its volumes' filesystems in place
				// first: the next sandbox may attach them read-only.
				if g, err := vm.Guest(); err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					_, _ = g.Call(ctx, guestproto.Request{Op: guestproto.OpSync})
					cancel()
				}
			}
			_ = vm.Kill()
		}
		if vm != nil && vm.Config().ExecDir != "" {
			_ = os.Remove(vm.Config().ExecDir) // the link a pooled qemu's paths go through (adopt)
		}
		_ = os.RemoveAll(r.vmDir(id))
		_ = os.Remove(r.memoryFile(id))
		r.mu.Lock()
		r.unwire(id, st)
		for serial, ch := range r.releasing {
			if ch == gone {
				delete(r.releasing, serial)
			}
		}
		r.mu.Unlock()
		close(gone)
	}()
}

// endingKey is an instance's own key in releasing (serials hold no
// spaces).
func endingKey(id string) string { return "vm " + id }

// addressKey is a network address's key in releasing.
func addressKey(n *network.VM) string { return "net " + n.Mode + " " + n.Address.Addr().String() }

// released returns what a boot of instance id with these volumes and
// this network waits for: the removal of an earlier instance of that id,
// of the VMs that still hold one of the volumes, and of one that still
// holds its address (r.mu held).
func (r *QEMU) released(id string, volumes []agentproto.SpecVolume, net *network.VM) []chan struct{} {
	var out []chan struct{}
	if ch := r.releasing[endingKey(id)]; ch != nil {
		out = append(out, ch)
	}
	if net != nil {
		if ch := r.releasing[addressKey(net)]; ch != nil {
			out = append(out, ch)
		}
	}
	for _, v := range volumes {
		if ch := r.releasing[v.Serial]; ch != nil {
			out = append(out, ch)
		}
	}
	return out
}

// memoryFile is where instance id's guest memory lives when it keeps it
// in a file of its own.
func (r *QEMU) memoryFile(id string) string {
	if r.MemoryDir != "" {
		return filepath.Join(r.MemoryDir, id+".memory")
	}
	return filepath.Join(r.vmDir(id), "memory")
}

// converge moves one instance towards its desired state (r.mu held).
func (r *QEMU) converge(ctx context.Context, id string, vs agentproto.InstanceSpec) error {
	st := r.vms[id]
	if vs.State == StateDeleted {
		if st != nil {
			r.remove(id, st)
		}
		return nil
	}
	if st == nil {
		st = &vmState{spec: vs, state: StateStopped, reboots: vs.Reboots}
		r.vms[id] = st
	}
	st.spec = vs
	if b, _ := json.Marshal(vs); !bytes.Equal(b, st.saved) {
		if err := os.MkdirAll(r.vmDir(id), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(r.vmDir(id), "instance.json"), b, 0o600); err != nil {
			return err
		}
		st.saved = b
	}
	alive := st.vm != nil && st.vm.Alive()
	// A live VM's network follows the spec: a policy change at once, a
	// claim's new address with its identity (restart).
	claim := alive && st.cancel == nil && vs.State == StateRunning && vs.IdentityGeneration() > st.identity
	newNet := false
	if alive && st.cancel == nil && vs.State != StateStopped {
		var err error
		if newNet, err = r.rewire(id, st, claim); err != nil {
			return err
		}
	}
	switch vs.State {
	case StateRunning:
		switch {
		case !alive && st.cancel == nil:
			r.boot(id, st)
		case alive && st.cancel == nil && vs.IdentityGeneration() > st.identity:
			// A warm instance claimed: resumed, given its new identity and
			// checked before it is called running.
			r.restart(id, st, true, newNet)
		case alive && st.state == StatePaused && st.cancel == nil:
			// Every resume is checked before it is called running.
			r.restart(id, st, false, false)
		case alive && st.cancel == nil && vs.Reboots > st.reboots:
			// (While the guest is awaited, the reboot waits for it: the
			// wait re-converges when it ends.)
			st.reboots = vs.Reboots
			if err := st.vm.Reset(); err != nil {
				return err
			}
			st.state = "starting"
			r.awaitGuest(id, st, false)
		}
	case StatePaused:
		if !alive && st.cancel == nil {
			r.boot(id, st) // a warm instance: booted, checked, then paused
		} else if alive && st.state == StateRunning && st.cancel == nil {
			if err := st.vm.Pause(); err != nil {
				return err
			}
			st.state = StatePaused
		}
	case StateStopped:
		if st.cancel != nil {
			st.cancel()
			st.cancel = nil
		}
		st.boots++ // a boot in flight ends its VM itself
		if st.vm != nil {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := st.vm.Stop(sctx)
			cancel()
			if err != nil {
				return err
			}
			st.vm = nil
		}
		r.unwire(id, st)
		st.state, st.err = StateStopped, ""
	}
	return nil
}

// vmConfig is the qemu config of instance id's VM for spec vs: how it
// starts (boot or restore), the snapshot's disk a restore copies in, and
// the image a root overlay is made of.
func (r *QEMU) vmConfig(id string, vs agentproto.InstanceSpec) (c *qemu.Config, how, restoreDisk, rootImage string) {
	c = &qemu.Config{ID: id, Dir: r.vmDir(id), VCPU: max(vs.VCPU, 1), MemoryMiB: int(max(vs.MemoryMiB, 128)), Accel: r.accel,
		Machine: qemu.MachineMicroVM, Kernel: vs.Boot.Location, Initrd: vs.Boot.Initrd, Cmdline: vs.Boot.Cmdline + " compute.hostname=" + vs.Hostname}
	if vs.Boot.Format != "kernel+initrd" {
		// The image is shared by every VM of it: each boots from a qcow2
		// overlay of its own (made below, off the lock).
		c.Kernel, c.Initrd = "", ""
		rootImage = vs.Boot.Location
		c.Disks = append(c.Disks, qemu.Disk{Path: filepath.Join(r.vmDir(id), "root.qcow2"), Serial: "root", Format: "qcow2"})
		c.Machine = qemu.MachineQ35
	}
	how = "boot"
	if vs.MemoryFile {
		c.MemoryFile = r.memoryFile(id)
	}
	if vs.Restore != "" {
		// Started from a snapshot: its memory file mapped copy-on-write
		// (shared by every restore, never written), its disk copied in,
		// its device state loaded (qemu -incoming); no boot.
		snap := r.snapshotDir(vs.Restore)
		c.MemoryFile, c.MemoryPrivate = filepath.Join(snap, "memory"), true
		if _, err := os.Stat(filepath.Join(snap, "disk0.raw")); err == nil {
			restoreDisk = filepath.Join(snap, "disk0.raw") // copied in below, off the lock
		}
		c.Incoming, how = filepath.Join(snap, "state"), "restore"
	}
	if vs.DiskGiB > 0 {
		c.Disks = append(c.Disks, qemu.Disk{Path: filepath.Join(r.vmDir(id), "disk0.raw"), Serial: "disk0", Format: "raw"})
	}
	for _, v := range vs.Volumes {
		c.Disks = append(c.Disks, qemu.Disk{Path: filepath.Join(r.VolumeDir, v.Serial+".raw"), Serial: v.Serial, Format: "raw", ReadOnly: v.ReadOnly})
	}
	return c, how, restoreDisk, rootImage
}

// boot starts the VM and waits for its guest in the background (r.mu
// held).
func (r *QEMU) boot(id string, st *vmState) {
	vs := st.spec
	c, how, restoreDisk, rootImage := r.vmConfig(id, vs)
	t := startTimings(how) // the host's share includes a restore's copies
	if vs.DiskGiB > 0 {
		disk := filepath.Join(r.vmDir(id), "disk0.raw")
		if _, err := os.Stat(disk); restoreDisk == "" && errors.Is(err, os.ErrNotExist) {
			if f, err := os.Create(disk); err == nil {
				_ = f.Truncate(vs.DiskGiB << 30) // sparse
				_ = f.Close()
			}
		}
	}
	if vs.State == StatePaused {
		// A warm instance: nobody waits for it, so its boot yields the
		// CPU to the claims and sandboxes it is there to serve.
		c.Nice = WarmNice
	}
	// qemu starts in the background too: Apply returns at once, so the
	// daemon acknowledges the spec without waiting for a process to start.
	ctx, cancel := context.WithTimeout(context.Background(), BootTimeout)
	st.state, st.err, st.cancel = "starting", "", cancel
	st.forceGone, st.qmpFailures = false, 0
	st.boots++
	boot := st.boots
	done := func(changed bool) {
		if changed {
			r.changed()
		}
	}
	if how == "restore" {
		// A restore is waited for, as a resume is (a pooled qemu's takes
		// milliseconds): Apply's acknowledgement may report its end.
		done = r.awaited(st)
	}
	holders := r.released(id, vs.Volumes, r.netFor(vs))
	go func() {
		defer cancel()
		for _, gone := range holders {
			select {
			case <-gone:
			case <-ctx.Done():
			}
		}
		// The network first: qemu opens the VM's tap by name.
		r.mu.Lock()
		if r.vms[id] != st || st.boots != boot {
			done(false)
			r.mu.Unlock()
			return // removed or stopped meanwhile
		}
		err := r.wire(id, st)
		wired, port := st.wired, st.port
		r.mu.Unlock()
		var guestNetwork *guestproto.Network
		if wired != nil {
			c.Net = &qemu.NetDevice{Tap: port.Tap, MAC: port.MAC}
			if c.Kernel != "" {
				// compute-guest addresses its card before its agent answers.
				c.Cmdline += " " + netCmdline(wired)
			}
			if c.Kernel == "" || how == "restore" {
				// Booted by firmware, or restored (with an address of its
				// own): the identity request carries the network.
				guestNetwork = guestNet(wired)
			}
		}
		var vm VM
		var pv PrestartedVM
		if err == nil && how == "restore" && r.pool != nil && poolable(c, restoreDisk) {
			// A qemu started ahead for this snapshot, its directory made
			// the VM's: no process start, no QMP handshake, no disk copy.
			if pv = r.pool.take(ctx, vs.Restore, c); pv != nil {
				if err = r.adopt(id, st, boot, pv); err != nil {
					_ = pv.Kill()
					_ = os.RemoveAll(pv.Config().Dir)
					pv = nil
				}
			}
		}
		if pv != nil {
			if nerr := pv.SetNice(0); nerr != nil {
				r.Log.Warn("could not raise a pooled qemu's CPU priority", "instance", id, "error", nerr.Error())
			}
			if err = pv.Restore(ctx); err == nil {
				vm = pv
			} else {
				_ = pv.Kill()
			}
		} else {
			if err == nil && restoreDisk != "" {
				if err = copySparse(ctx, restoreDisk, filepath.Join(c.Dir, "disk0.raw")); err != nil {
					err = fmt.Errorf("restore: %w", err)
				}
			}
			if err == nil && rootImage != "" {
				err = qemu.Overlay(ctx, rootImage, vs.Boot.Format, c.Disks[0].Path)
			}
			if err == nil {
				vm, err = r.launch.Start(ctx, c)
			}
		}
		switch {
		case err == nil && how == "restore":
			// The guest runs on from where it was snapshotted: it gets its
			// own identity and is checked, it does not boot.
			err = r.check(ctx, vm, vs, true, guestNetwork, t)
		case err == nil:
			err = r.greet(ctx, vm, vs, true, guestNetwork, t)
		}
		if err == nil && how == "restore" && r.pool != nil {
			// Once this restore's guest answered, the pool gets another
			// qemu of its shape (at WarmNice, off the next restore's path).
			r.pool.want(vs.Restore, c, restoreDisk)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.vms[id] != st || st.boots != boot {
			if vm != nil {
				_ = vm.Kill() // removed or stopped meanwhile
			}
			done(false)
			return
		}
		st.cancel = nil
		if err != nil {
			st.state, st.err = "failed", err.Error()
			if vm != nil {
				_ = vm.Kill()
			}
			r.unwire(id, st)
		} else {
			st.vm, st.state, st.timings = vm, StateRunning, t.done()
			r.tookIdentity(id, st, vs)
			if st.spec.State == StatePaused && vm.Pause() == nil {
				st.state = StatePaused
			}
			r.catchUp(id, st)
		}
		done(true)
	}()
}

// adopt makes a pooled qemu's directory instance id's: the files the
// runtime already keeps for the instance (instance.json) move into it,
// and it is renamed to the VM's directory. Nothing changes when the boot
// was superseded meanwhile.
func (r *QEMU) adopt(id string, st *vmState, boot int, pv PrestartedVM) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.vms[id] != st || st.boots != boot {
		return errors.New("the restore was superseded")
	}
	dir, from := r.vmDir(id), pv.Config().Dir
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if _, err := os.Lstat(filepath.Join(from, e.Name())); err == nil {
			// Never over a file of the pooled qemu (its disk).
			return r.unadopt(id, st, fmt.Errorf("%s is in both directories", e.Name()))
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(from, e.Name())); err != nil {
			return r.unadopt(id, st, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return r.unadopt(id, st, err)
	}
	if err := pv.Move(dir, id); err != nil {
		return r.unadopt(id, st, err)
	}
	_ = os.Remove(filepath.Join(dir, ReadyFile))
	// qemu still names its files by the directory it was started in (it
	// reopens a disk by name, e.g. read-only at the end of a migration
	// out): that path leads to the VM's directory for the VM's life
	// (removed with it, remove; a dangling one at the next start).
	if err := os.Symlink(dir, from); err != nil {
		return fmt.Errorf("restore pool: %w", err) // the VM is moved: no way back
	}
	return nil
}

// unadopt puts the instance's directory back after a failed adopt, so
// that its qemu starts the ordinary way (r.mu held).
func (r *QEMU) unadopt(id string, st *vmState, err error) error {
	_ = os.MkdirAll(r.vmDir(id), 0o700)
	if b, merr := json.Marshal(st.spec); merr == nil {
		_ = os.WriteFile(filepath.Join(r.vmDir(id), "instance.json"), b, 0o600)
		st.saved = b
	}
	r.Log.Warn("could not take a pooled qemu", "instance", id, "error", err.Error())
	return err
}

// catchUp applies what Apply asked of an instance while a boot, resume,
// guest wait or snapshot kept it busy (converge skips a busy instance),
// such as a claim's new identity or a reboot (r.mu held).
func (r *QEMU) catchUp(id string, st *vmState) {
	if err := r.converge(context.Background(), id, st.spec); err != nil {
		r.Log.Warn("catching up with the spec", "instance", id, "error", err.Error())
	}
}

// WarmNice is the CPU niceness a warm instance boots at.
const WarmNice = 10

// timer measures a start for HostTimings.
type timer struct {
	how                 string
	start, guest, ready time.Time
}

func startTimings(how string) *timer { return &timer{how: how, start: time.Now()} }

func (t *timer) done() *agentproto.HostTimings {
	ms := func(at time.Time) int64 {
		if at.IsZero() {
			at = time.Now()
		}
		return at.Sub(t.start).Milliseconds()
	}
	return &agentproto.HostTimings{How: t.how, StartMs: 0, GuestMs: ms(t.guest), IdentityMs: ms(t.ready)}
}

// tookIdentity records that the guest runs with the spec's identity (r.mu
// held).
func (r *QEMU) tookIdentity(id string, st *vmState, vs agentproto.InstanceSpec) {
	if g := vs.IdentityGeneration(); g > 0 {
		st.identity = g
		r.keepIdentity(id, g)
	}
}

// restart resumes a paused VM in the background and, with identity, gives
// the guest the spec's (new) identity; either way the guest is checked (its
// agent answers, its root filesystem takes a write) before the instance is
// called running again (r.mu held).
func (r *QEMU) restart(id string, st *vmState, identity, newNet bool) {
	ctx, cancel := context.WithTimeout(context.Background(), BootTimeout)
	vm, vs := st.vm, st.spec
	var gn *guestproto.Network
	if newNet {
		gn = guestNet(st.wired) // the claim's new address
	}
	st.cancel, st.state, st.err = cancel, "starting", ""
	done := r.awaited(st)
	go func() {
		defer cancel()
		t := startTimings("resume")
		if vm.Config().Nice != 0 {
			if err := vm.SetNice(0); err != nil {
				r.Log.Warn("could not raise a claimed VM's CPU priority", "instance", id, "error", err.Error())
			}
		}
		err := vm.Resume()
		if err == nil {
			err = r.check(ctx, vm, vs, identity, gn, t)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.vms[id] != st || st.vm != vm {
			done(false) // nothing of this resume to report
			return
		}
		st.cancel = nil
		if err != nil {
			st.state, st.err = "failed", "resume: "+err.Error()
			_ = vm.Kill()
			st.vm = nil
			r.unwire(id, st)
		} else {
			st.state, st.timings = StateRunning, t.done()
			if identity {
				r.tookIdentity(id, st, vs)
			}
			if st.spec.State == StatePaused && vm.Pause() == nil {
				st.state = StatePaused
			}
			r.catchUp(id, st)
		}
		done(true)
	}()
}

// check gives a running guest its identity (when asked) and checks it:
// the agent answers, the root filesystem takes a write and reads it back,
// hostname and machine id are the spec's.
func (r *QEMU) check(ctx context.Context, vm VM, vs agentproto.InstanceSpec, identity bool, net *guestproto.Network, t *timer) error {
	g, err := vm.Guest()
	if err != nil {
		return err
	}
	// One round trip: an identity change answers with the same status a
	// ping does (the first request to a resumed guest is the slow one
	// under emulation).
	req := guestproto.Request{Op: guestproto.OpPing}
	switch {
	case identity && vs.Identity != nil:
		req = guestproto.Request{Op: guestproto.OpIdentity, Identity: &guestproto.Identity{
			Hostname: vs.Identity.Hostname, MachineID: vs.Identity.MachineID, Env: vs.Identity.Env, Network: net}}
	case identity && net != nil:
		req = guestproto.Request{Op: guestproto.OpIdentity, Identity: &guestproto.Identity{Hostname: vs.Hostname, Network: net}}
	}
	resp, err := g.Call(ctx, req)
	if err != nil {
		return fmt.Errorf("the guest agent did not answer: %w", err)
	}
	t.guest = time.Now()
	return checked(vs, resp.Status, t)
}

// checked checks a guest's status (a ping's, or an identity change's,
// which answers with the same): its root filesystem took a write and
// read it back, its hostname and machine id are the spec's.
func checked(vs agentproto.InstanceSpec, st *guestproto.Status, t *timer) error {
	switch {
	case st == nil || !st.RootOK:
		return errors.New("the guest's root filesystem did not check out")
	case vs.Identity != nil && (st.Hostname != vs.Identity.Hostname || st.MachineID != vs.Identity.MachineID):
		return fmt.Errorf("the guest runs as %s, not %s", st.Hostname, vs.Identity.Hostname)
	}
	t.ready = time.Now()
	return nil
}

// awaitGuest waits, in the background, for the guest agent to answer,
// then gives the guest its identity and, at first boot, its user data.
func (r *QEMU) awaitGuest(id string, st *vmState, first bool) {
	ctx, cancel := context.WithTimeout(context.Background(), BootTimeout)
	st.cancel = cancel
	vm, vs := st.vm, st.spec
	var gn *guestproto.Network
	if vm.Config().Kernel == "" {
		gn = guestNet(st.wired) // booted by firmware: no kernel command line
	}
	go func() {
		defer cancel()
		err := r.greet(ctx, vm, vs, first, gn, startTimings("boot"))
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.vms[id] != st || st.vm != vm {
			return // replaced or removed meanwhile
		}
		st.cancel = nil
		if err != nil {
			st.state, st.err = "failed", err.Error()
			_ = vm.Kill()
			st.vm = nil
			r.unwire(id, st)
		} else if st.state == "starting" {
			st.state = StateRunning
			if st.spec.State == StatePaused && vm.Pause() == nil {
				st.state = StatePaused
			}
			r.catchUp(id, st)
		}
		r.changed()
	}()
}

func (r *QEMU) greet(ctx context.Context, vm VM, vs agentproto.InstanceSpec, first bool, net *guestproto.Network, t *timer) error {
	var g Guest
	for {
		var err error
		if g, err = vm.Guest(); err == nil {
			break
		}
		if !vm.Alive() {
			return errors.New("the VM exited while booting")
		}
		select {
		case <-ctx.Done():
			return errors.New("the guest channel did not open")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := g.Ready(ctx); err != nil {
		return fmt.Errorf("the guest agent did not answer within %s: %w", BootTimeout, err)
	}
	t.guest = time.Now()
	ident := &guestproto.Identity{Hostname: vs.Hostname}
	if vs.Identity != nil {
		ident = &guestproto.Identity{Hostname: vs.Identity.Hostname, MachineID: vs.Identity.MachineID, Env: vs.Identity.Env}
	}
	ident.Network = net
	resp, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpIdentity, Identity: ident})
	if err != nil {
		return err
	}
	if vs.Identity != nil && len(vs.Volumes) == 0 && (!first || vs.UserData == "") {
		// Nothing runs in the guest after its identity: the identity's
		// answer is the check (a ping's status), one round trip fewer
		// on a cold boot's path.
		return checked(vs, resp.Status, t)
	}
	for _, v := range vs.Volumes {
		if _, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpMount, Mount: &guestproto.Mount{
			Serial: v.Serial, Path: v.MountPath, ReadOnly: v.ReadOnly, Format: !v.ReadOnly}}); err != nil {
			return fmt.Errorf("volume %s: %w", v.Serial, err)
		}
	}
	if first && vs.UserData != "" {
		userData, err := r.withSecrets(ctx, vs.ID, vs.UserData)
		if err != nil {
			return err
		}
		code, err := g.RunUserData(ctx, userData)
		if err != nil {
			return err
		}
		r.Log.Info("user data delivered", "exitCode", code)
	}
	if vs.Identity != nil {
		return r.check(ctx, vm, vs, false, nil, t)
	}
	t.ready = time.Now()
	return nil
}

// Changes signals boots that finished and VMs that died.
func (r *QEMU) Changes() <-chan struct{} { return r.Changed }

// Observe reports every instance; a VM that died without being asked to
// shows as failed.
func (r *QEMU) Observe(context.Context) []agentproto.InstanceStatus {
	r.mu.Lock()
	out, n := r.observeLocked(), r.net
	r.mu.Unlock()
	// Read outside the lock: counters come from the kernel, not from us.
	return r.egress(out, n)
}

func (r *QEMU) observeLocked() []agentproto.InstanceStatus {
	out := make([]agentproto.InstanceStatus, 0, len(r.vms))
	for id, st := range r.vms {
		if st.vm != nil && st.cancel == nil && (st.state == StateRunning || st.state == StatePaused) && (st.forceGone || !st.vm.Alive()) {
			st.state, st.err, st.vm = "failed", "the VM's process ended without being asked (killed from outside or crashed)", nil
			r.Log.Warn("a VM ended unexpectedly", "instance", id)
			r.unwire(id, st)
		}
		out = append(out, agentproto.InstanceStatus{ID: id, State: st.state, Error: st.err, Identity: st.identity, Timings: st.timings})
	}
	return out
}

// Close detaches from the VMs; they keep running. The removals in
// flight finish first.
func (r *QEMU) Close() error {
	close(r.done)
	if r.pool != nil {
		r.pool.close() // pooled qemus are not VMs: none outlives the daemon
	}
	r.removals.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.vms {
		if st.cancel != nil {
			st.cancel()
		}
		if st.vm != nil {
			st.vm.Detach()
		}
	}
	return nil
}

// guest is the guest channel of a running instance (not paused: a paused
// guest answers nothing).
func (r *QEMU) guest(id string) (Guest, error) {
	r.mu.Lock()
	st := r.vms[id]
	r.mu.Unlock()
	if st == nil || st.vm == nil || st.state != StateRunning {
		return nil, fmt.Errorf("instance %s is not running here", id)
	}
	return st.vm.Guest()
}

// Exec runs a program in an instance's guest (agentproto.CommandExec).
func (r *QEMU) Exec(ctx context.Context, a agentproto.ExecArgs) (agentproto.ExecOutput, error) {
	g, err := r.guest(a.InstanceID)
	if err != nil {
		return agentproto.ExecOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(a.TimeoutMs)*time.Millisecond+10*time.Second)
	defer cancel()
	resp, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: a.Argv, Env: a.Env, Dir: a.Dir,
		Stdin: a.Stdin, TimeoutMs: a.TimeoutMs}})
	if err != nil {
		return agentproto.ExecOutput{}, err
	}
	e := resp.Exec
	return agentproto.ExecOutput{ExitCode: e.ExitCode, Stdout: e.Stdout, Stderr: e.Stderr, Truncated: e.Truncated, TimedOut: e.TimedOut,
		DurationMs: e.DurationMs}, nil
}

// Process passes a request to the process table of an instance's guest
// (agentproto.CommandProcess); a wait is bounded by the guest's
// MaxProcessWaitMs.
func (r *QEMU) Process(ctx context.Context, a agentproto.ProcessArgs) (agentproto.ProcessOutput, error) {
	var p guestproto.Process
	if err := json.Unmarshal(a.Process, &p); err != nil {
		return agentproto.ProcessOutput{}, err
	}
	g, err := r.guest(a.InstanceID)
	if err != nil {
		return agentproto.ProcessOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(p.WaitMs)*time.Millisecond+FileTimeout)
	defer cancel()
	resp, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpProcess, Process: &p})
	if err != nil {
		return agentproto.ProcessOutput{}, err
	}
	var out agentproto.ProcessOutput
	if resp.Processes != nil {
		out.Processes, _ = json.Marshal(resp.Processes)
	}
	if resp.ProcessOutput != nil {
		out.ProcessOutput, _ = json.Marshal(resp.ProcessOutput)
	}
	return out, nil
}

// Start starts an interactive program in an instance's guest (a tunnel).
func (r *QEMU) Start(ctx context.Context, instanceID string, e *guestproto.Exec) (*qemu.Stream, error) {
	g, err := r.guest(instanceID)
	if err != nil {
		return nil, err
	}
	s, ok := g.(interface {
		Start(context.Context, *guestproto.Exec) (*qemu.Stream, error)
	})
	if !ok {
		return nil, fmt.Errorf("instance %s: its guest channel streams no programs", instanceID)
	}
	return s.Start(ctx, e)
}

// Dial connects to a TCP port of an instance's guest (a tcp tunnel):
// compute-guest dials it on the guest's loopback.
func (r *QEMU) Dial(ctx context.Context, instanceID string, port int) (*qemu.Stream, error) {
	g, err := r.guest(instanceID)
	if err != nil {
		return nil, err
	}
	s, ok := g.(interface {
		Dial(context.Context, int) (*qemu.Stream, error)
	})
	if !ok {
		return nil, fmt.Errorf("instance %s: its guest channel streams no connections", instanceID)
	}
	return s.Dial(ctx, port)
}

// Console opens the serial console of a running instance (a console
// tunnel).
func (r *QEMU) Console(instanceID string) (*qemu.Console, error) {
	r.mu.Lock()
	st := r.vms[instanceID]
	r.mu.Unlock()
	if st == nil || st.vm == nil || st.state != StateRunning {
		return nil, fmt.Errorf("instance %s is not running here", instanceID)
	}
	return qemu.OpenConsole(st.vm.Config())
}

// FileTimeout bounds a file read or write in a guest.
const FileTimeout = 20 * time.Second

// ReadFile reads a file of an instance's guest (agentproto.CommandReadFile).
func (r *QEMU) ReadFile(ctx context.Context, a agentproto.FileArgs) (agentproto.FileOutput, error) {
	g, err := r.guest(a.InstanceID)
	if err != nil {
		return agentproto.FileOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, FileTimeout)
	defer cancel()
	resp, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpReadFile, File: &guestproto.File{Path: a.Path}})
	if err != nil {
		return agentproto.FileOutput{}, err
	}
	return agentproto.FileOutput{Data: resp.Data, SizeBytes: int64(len(resp.Data))}, nil
}

// WriteFile writes a file into an instance's guest (agentproto.CommandWriteFile).
func (r *QEMU) WriteFile(ctx context.Context, a agentproto.FileArgs) (agentproto.FileOutput, error) {
	g, err := r.guest(a.InstanceID)
	if err != nil {
		return agentproto.FileOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, FileTimeout)
	defer cancel()
	if _, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpWriteFile, File: &guestproto.File{Path: a.Path, Data: a.Data, Mode: a.Mode}}); err != nil {
		return agentproto.FileOutput{}, err
	}
	return agentproto.FileOutput{SizeBytes: int64(len(a.Data))}, nil
}

func (r *QEMU) snapshotDir(id string) string {
	return filepath.Join(r.Dir, "snapshots", filepath.Base(id))
}

// copySparse copies a file keeping its holes (and sharing its blocks where
// the filesystem can).
func copySparse(ctx context.Context, from, to string) error {
	out, err := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", from, to).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %v: %s", filepath.Base(from), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Snapshot saves a running or paused instance whose memory is in a shared
// file: the guest syncs, the VM pauses, its device state is saved
// (x-ignore-shared: memory stays in its file), the memory file and disk
// are copied, and a running VM goes on. The instance is busy meanwhile
// (as during a boot: Apply records its spec and acts on it when the
// snapshot is done, a stop or a delete cancels it); the node's other VMs
// are not held up.
func (r *QEMU) Snapshot(ctx context.Context, a agentproto.SnapshotArgs) (agentproto.SnapshotOutput, error) {
	id := a.InstanceID
	r.mu.Lock()
	st := r.vms[id]
	if st == nil || st.vm == nil || st.cancel != nil || (st.state != StateRunning && st.state != StatePaused) {
		r.mu.Unlock()
		return agentproto.SnapshotOutput{}, fmt.Errorf("instance %s is not running or paused here", id)
	}
	if !st.spec.MemoryFile {
		r.mu.Unlock()
		return agentproto.SnapshotOutput{}, fmt.Errorf("instance %s keeps no memory file", id)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	vm, running := st.vm, st.state == StateRunning
	spec, wired := st.spec, st.wired != nil
	st.cancel = cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.vms[id] == st && st.vm == vm && st.cancel != nil {
			st.cancel = nil
			r.catchUp(id, st)
			r.changed()
		}
	}()

	dir := r.snapshotDir(a.SnapshotID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return agentproto.SnapshotOutput{}, err
	}
	if running {
		if g, err := vm.Guest(); err == nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = g.Call(sctx, guestproto.Request{Op: guestproto.OpSync})
			cancel()
		}
	}
	start := time.Now()
	err := func() error {
		if running {
			if err := vm.Pause(); err != nil {
				return err
			}
		}
		if err := vm.SaveState(ctx, filepath.Join(dir, "state")); err != nil {
			return err
		}
		if err := saveMemory(ctx, vm.Config(), filepath.Join(dir, "memory")); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(r.vmDir(id), "disk0.raw")); err == nil {
			return copySparse(ctx, filepath.Join(r.vmDir(id), "disk0.raw"), filepath.Join(dir, "disk0.raw"))
		}
		return nil
	}()
	if running {
		if rerr := vm.Resume(); err == nil {
			err = rerr
		}
	}
	paused := time.Since(start)
	if err != nil {
		_ = os.RemoveAll(dir)
		return agentproto.SnapshotOutput{}, fmt.Errorf("snapshot: %w", err)
	}
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				if sys, ok := info.Sys().(*syscall.Stat_t); ok {
					size += sys.Blocks * 512 // allocated, not apparent
				}
			}
		}
		return nil
	})
	if r.pool != nil && !wired && len(spec.Volumes) == 0 {
		// Its first restore here may well come soon (a sandbox's
		// snapshot): the pool starts qemus for a restore of the
		// instance's shape.
		spec.Restore = a.SnapshotID
		c, _, disk, _ := r.vmConfig("restore", spec)
		r.pool.want(a.SnapshotID, c, disk)
	}
	return agentproto.SnapshotOutput{SizeBytes: size, PausedMs: paused.Milliseconds()}, nil
}

// saveMemory writes a paused VM's memory file for a snapshot: a copy of
// its shared memory file or, for a VM that maps a snapshot's memory
// privately (a restored one, whose memory SaveState put in the migration
// stream), an empty file of its size for the restore to map.
func saveMemory(ctx context.Context, c *qemu.Config, to string) error {
	if !c.MemoryPrivate {
		return copySparse(ctx, c.MemoryFile, to)
	}
	f, err := os.Create(to)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(c.MemoryMiB) << 20); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// DeleteSnapshot removes a snapshot's files (none is fine).
func (r *QEMU) DeleteSnapshot(_ context.Context, id string) error {
	if r.pool != nil {
		r.pool.drop(id)
	}
	return os.RemoveAll(r.snapshotDir(id))
}
