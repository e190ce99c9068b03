package vmruntime

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// The converge loop's state machine over fake VMs (fake_test.go); the
// real VMs boot in internal/instances and internal/sandboxes.

func TestDesiredRunningFromNothingBoots(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	gate := make(chan struct{})
	l.prepare = func(vm *fakeVM) { vm.readyGate = gate }

	st := apply(t, r, inst("a", StateRunning))
	assert.Equal(t, "starting", st["a"].State, "Apply returns before the guest answers")
	drain(r)
	close(gate)
	waitState(t, r, "a", StateRunning)
	select {
	case <-r.Changes():
	case <-time.After(time.Second):
		t.Fatal("no change signalled when the boot finished")
	}

	vm := l.vm(t, "a")
	c := vm.Config()
	assert.Equal(t, qemu.MachineMicroVM, c.Machine)
	assert.Equal(t, 1, c.VCPU)
	assert.Equal(t, 128, c.MemoryMiB)
	assert.Contains(t, c.Cmdline, "compute.hostname=a-host")
	assert.Zero(t, c.Nice, "an instance somebody waits for boots at normal priority")
	assert.Equal(t, []string{guestproto.OpIdentity}, vm.Requests(), "the guest is given its identity")
	assert.Equal(t, "a-host", vm.Hostname())
	require.NotNil(t, observe(r, "a").Timings)
	assert.Equal(t, "boot", observe(r, "a").Timings.How)

	// The same spec again changes nothing.
	st = apply(t, r, inst("a", StateRunning))
	assert.Equal(t, StateRunning, st["a"].State)
	assert.Len(t, l.vms("a"), 1)
	assert.Empty(t, vm.Calls())
}

// TestAClaimIsAcknowledgedRunningWhenItsResumeChecksOut: Apply waits a
// little (ResumeGrace) for the resumes it starts, so that the spec's
// acknowledgement reports a claimed VM running (one status for the claim,
// no change signalled after it); a resume still going after the grace is
// acknowledged starting and signals its end, as a boot does.
func TestAClaimIsAcknowledgedRunningWhenItsResumeChecksOut(t *testing.T) {
	claim := inst("a", StateRunning)
	claim.Identity = &agentproto.SpecIdentity{Generation: 2, Hostname: "claimed", MachineID: "m-2"}

	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("a", StatePaused))
	waitState(t, r, "a", StatePaused)
	drain(r)
	st := apply(t, r, claim)
	assert.Equal(t, StateRunning, st["a"].State, "acknowledged running")
	assert.Equal(t, int64(2), st["a"].Identity)
	select {
	case <-r.Changes():
		t.Fatal("a change signalled although the acknowledgement reported the resume")
	case <-time.After(100 * time.Millisecond):
	}

	// A guest that answers only after the grace.
	l2 := &fakeLauncher{}
	r2 := newRuntime(t, l2)
	apply(t, r2, inst("a", StatePaused))
	waitState(t, r2, "a", StatePaused)
	vm := l2.vm(t, "a")
	gate := make(chan struct{})
	vm.mu.Lock()
	vm.callGate = gate
	vm.mu.Unlock()
	drain(r2)
	st = apply(t, r2, claim)
	assert.Equal(t, "starting", st["a"].State, "acknowledged starting after the grace")
	close(gate)
	select {
	case <-r2.Changes():
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled when the resume ended after the grace")
	}
	waitState(t, r2, "a", StateRunning)
}

// TestARestoreIsAcknowledgedRunningWhenItChecksOut: a restore is waited
// for as a resume is, so the acknowledgement reports it running (one
// status), and a boot is not (it takes seconds).
func TestARestoreIsAcknowledgedRunningWhenItChecksOut(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	restored := inst("r", StateRunning)
	restored.Restore = "snap_1"
	restored.Identity = &agentproto.SpecIdentity{Generation: 1, Hostname: "restored", MachineID: "m-r"}
	drain(r)
	st := apply(t, r, restored)
	assert.Equal(t, StateRunning, st["r"].State, "acknowledged running")
	require.NotNil(t, st["r"].Timings)
	assert.Equal(t, "restore", st["r"].Timings.How)
	select {
	case <-r.Changes():
		t.Fatal("a change signalled although the acknowledgement reported the restore")
	case <-time.After(100 * time.Millisecond):
	}

	st = apply(t, r, restored, inst("b", StateRunning))
	assert.Equal(t, "starting", st["b"].State, "a boot is not waited for")
}

func TestASandboxsColdBootIsCheckedByItsIdentitysAnswer(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	sbx := inst("a", StateRunning)
	sbx.Identity = &agentproto.SpecIdentity{Generation: 1, Hostname: "sbx-a", MachineID: "m-a"}
	apply(t, r, sbx)
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{guestproto.OpIdentity}, l.vm(t, "a").Requests(),
		"the identity's answer carries the status a ping would: no second round trip")

	// With a volume mounted after the identity, the check comes after it.
	l2 := &fakeLauncher{}
	r2 := newRuntime(t, l2)
	sbx.Volumes = []agentproto.SpecVolume{{Serial: "v1", MountPath: "/data"}}
	apply(t, r2, sbx)
	waitState(t, r2, "a", StateRunning)
	assert.Equal(t, []string{guestproto.OpIdentity, guestproto.OpMount, guestproto.OpPing}, l2.vm(t, "a").Requests())
}

func TestDesiredPausedFromNothingBootsAWarmInstanceThenPauses(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("w", StatePaused))
	waitState(t, r, "w", StatePaused)
	vm := l.vm(t, "w")
	assert.Equal(t, WarmNice, vm.Config().Nice, "a warm boot yields the CPU")
	assert.Equal(t, []string{"pause"}, vm.Calls())
	assert.Equal(t, []string{guestproto.OpIdentity}, vm.Requests(), "checked before it is paused")
}

// From a running or paused VM, each desired change and what it does.
func TestTransitionsOfABootedInstance(t *testing.T) {
	withIdentity := func(in agentproto.InstanceSpec) agentproto.InstanceSpec {
		in.Identity = &agentproto.SpecIdentity{Generation: 2, Hostname: "claimed", MachineID: "m-2"}
		return in
	}
	tests := []struct {
		name     string
		from     string
		to       []agentproto.InstanceSpec // the spec applied
		returned string                    // the state Apply returns (a resume's guest answers at once here)
		state    string                    // the state it settles in ("" gone)
		calls    []string
		requests []string // guest requests after the boot's
	}{
		{name: "running to paused", from: StateRunning, to: []agentproto.InstanceSpec{inst("a", StatePaused)},
			returned: StatePaused, state: StatePaused, calls: []string{"pause"}},
		{name: "paused to running resumes and checks", from: StatePaused, to: []agentproto.InstanceSpec{inst("a", StateRunning)},
			returned: StateRunning, state: StateRunning, calls: []string{"pause", "nice", "resume"}, requests: []string{guestproto.OpPing}},
		{name: "running to stopped", from: StateRunning, to: []agentproto.InstanceSpec{inst("a", StateStopped)},
			returned: StateStopped, state: StateStopped, calls: []string{"stop"}},
		{name: "paused to stopped", from: StatePaused, to: []agentproto.InstanceSpec{inst("a", StateStopped)},
			returned: StateStopped, state: StateStopped, calls: []string{"pause", "stop"}},
		{name: "running to deleted", from: StateRunning, to: []agentproto.InstanceSpec{inst("a", StateDeleted)},
			calls: []string{"kill"}},
		{name: "left out of the spec", from: StatePaused, to: nil,
			calls: []string{"pause", "kill"}},
		{name: "a reboot asked", from: StateRunning, to: []agentproto.InstanceSpec{func() agentproto.InstanceSpec {
			in := inst("a", StateRunning)
			in.Reboots = 1
			return in
		}()}, returned: "starting", state: StateRunning, calls: []string{"reset"}, requests: []string{guestproto.OpIdentity}},
		{name: "a warm instance claimed", from: StatePaused, to: []agentproto.InstanceSpec{withIdentity(inst("a", StateRunning))},
			returned: StateRunning, state: StateRunning, calls: []string{"pause", "nice", "resume"}, requests: []string{guestproto.OpIdentity}},
		{name: "a running instance given a new identity", from: StateRunning, to: []agentproto.InstanceSpec{withIdentity(inst("a", StateRunning))},
			returned: StateRunning, state: StateRunning, calls: []string{"resume"}, requests: []string{guestproto.OpIdentity}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLauncher{}
			r := newRuntime(t, l)
			apply(t, r, inst("a", tt.from))
			waitState(t, r, "a", tt.from)
			vm := l.vm(t, "a")
			booted := len(vm.Requests())

			st := apply(t, r, tt.to...)
			if tt.state == "" {
				assert.NotContains(t, st, "a")
				require.EventuallyWithT(t, func(c *assert.CollectT) {
					assert.Equal(c, tt.calls, vm.Calls())
					assert.NoDirExists(c, r.vmDir("a"))
				}, 5*time.Second, 5*time.Millisecond)
				assert.NotContains(t, byID(r.Observe(t.Context())), "a")
				return
			}
			assert.Equal(t, tt.returned, st["a"].State)
			waitState(t, r, "a", tt.state)
			assert.Equal(t, tt.calls, vm.Calls())
			if tt.requests == nil {
				assert.Empty(t, vm.Requests()[booted:])
			} else {
				assert.Equal(t, tt.requests, vm.Requests()[booted:])
			}
			assert.Len(t, l.vms("a"), 1, "no second VM")
			if tt.to[0].Identity != nil {
				assert.Equal(t, int64(2), observe(r, "a").Identity)
				assert.Equal(t, "claimed", vm.Hostname())
			}
		})
	}
}

func TestAStoppedInstanceStartedAgainBootsANewVM(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	apply(t, r, inst("a", StateStopped))
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	vms := l.vms("a")
	require.Len(t, vms, 2)
	assert.Equal(t, []string{"stop"}, vms[0].Calls())
	assert.True(t, vms[1].Alive())
}

// A reboot asked while the guest is awaited waits for it, then happens.
func TestARebootAskedWhileBootingWaits(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	gate := make(chan struct{})
	l.prepare = func(vm *fakeVM) { vm.readyGate = gate }
	apply(t, r, inst("a", StateRunning))
	require.Eventually(t, func() bool { return len(l.vms("a")) == 1 }, 5*time.Second, 5*time.Millisecond)
	vm := l.vms("a")[0]

	reboot := inst("a", StateRunning)
	reboot.Reboots = 1
	st := apply(t, r, reboot)
	assert.Equal(t, "starting", st["a"].State)
	assert.Empty(t, vm.Calls(), "no reset while the guest is awaited")

	close(gate)
	require.Eventually(t, func() bool { return len(vm.Calls()) > 0 }, 5*time.Second, 5*time.Millisecond)
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{"reset"}, vm.Calls(), "the reboot caught up once")
	assert.Equal(t, []string{guestproto.OpIdentity, guestproto.OpIdentity}, vm.Requests(), "greeted after the boot and after the reboot")
	// Asked once, done once.
	apply(t, r, reboot)
	assert.Equal(t, []string{"reset"}, vm.Calls())
}

// A stop or a delete while booting: the boot lets go of its VM.
func TestAStopOrDeleteWhileBootingEndsTheBoot(t *testing.T) {
	for _, state := range []string{StateStopped, StateDeleted} {
		t.Run(state, func(t *testing.T) {
			l := &fakeLauncher{}
			r := newRuntime(t, l)
			gate := make(chan struct{})
			l.prepare = func(vm *fakeVM) { vm.readyGate = gate }
			apply(t, r, inst("a", StateRunning))
			require.Eventually(t, func() bool { return len(l.vms("a")) == 1 }, 5*time.Second, 5*time.Millisecond)
			vm := l.vms("a")[0]

			apply(t, r, inst("a", state))
			close(gate)
			require.Eventually(t, func() bool { return !vm.Alive() }, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, []string{"kill"}, vm.Calls())
			if state == StateStopped {
				assert.Equal(t, StateStopped, observe(r, "a").State)
			} else {
				assert.NotContains(t, byID(r.Observe(t.Context())), "a")
			}
		})
	}
}

func TestAVMThatDiesIsReported(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	drain(r)
	l.vm(t, "a").die()
	select {
	case <-r.Changes():
	case <-time.After(3 * WatchEvery):
		t.Fatal("the watcher did not signal the VM's end")
	}
	st := observe(r, "a")
	assert.Equal(t, "failed", st.State)
	assert.Contains(t, st.Error, "ended without being asked")

	// Still desired running: the next spec boots it again.
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	assert.Len(t, l.vms("a"), 2)
}

func TestAVMWhoseQMPStopsAnsweringIsEnded(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	vm := l.vm(t, "a")
	vm.mu.Lock()
	vm.qmpErr = errNoQMP
	vm.mu.Unlock()
	st := waitStateWithin(t, r, "a", "failed", 6*WatchEvery)
	assert.Contains(t, st.Error, "ended without being asked")
	// Marked gone, then killed.
	require.Eventually(t, func() bool { return slices.Equal([]string{"kill"}, vm.Calls()) }, 5*time.Second, 5*time.Millisecond)
}

func TestBootFailures(t *testing.T) {
	withIdentity := inst("a", StateRunning)
	withIdentity.Identity = &agentproto.SpecIdentity{Generation: 1, Hostname: "h", MachineID: "m"}
	tests := []struct {
		name     string
		spec     agentproto.InstanceSpec
		startErr error
		prepare  func(*fakeVM)
		err      string
		killed   bool
	}{
		{name: "qemu does not start", spec: inst("a", StateRunning), startErr: errors.New("qemu: no such machine"), err: "no such machine"},
		{name: "the VM exits while booting", spec: inst("a", StateRunning), prepare: func(vm *fakeVM) {
			vm.guestErr, vm.alive = errors.New("qemu: guest channel: refused"), false
		}, err: "the VM exited while booting", killed: true},
		{name: "the guest's root does not check out", spec: withIdentity, prepare: func(vm *fakeVM) { vm.rootBad = true },
			err: "root filesystem", killed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLauncher{startErr: tt.startErr, prepare: tt.prepare}
			r := newRuntime(t, l)
			apply(t, r, tt.spec)
			st := waitState(t, r, "a", "failed")
			assert.Contains(t, st.Error, tt.err)
			if tt.killed {
				assert.Equal(t, []string{"kill"}, l.vm(t, "a").Calls())
			}
		})
	}
}

func TestAResumeThatFailsEndsTheVM(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("a", StatePaused))
	waitState(t, r, "a", StatePaused)
	vm := l.vm(t, "a")
	vm.mu.Lock()
	vm.resumeErr = errNoQMP
	vm.mu.Unlock()
	apply(t, r, inst("a", StateRunning))
	st := waitState(t, r, "a", "failed")
	assert.Contains(t, st.Error, "resume: ")
	assert.Equal(t, []string{"pause", "nice", "resume", "kill"}, vm.Calls())
}

// A snapshot keeps its instance busy: what a spec asks meanwhile is done
// when it ends.
func TestASnapshotWhileBusyCatchesUpAfter(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	in := inst("a", StateRunning)
	in.MemoryFile = true
	apply(t, r, in)
	waitState(t, r, "a", StateRunning)
	vm := l.vm(t, "a")
	vm.saveGate = make(chan struct{})

	done := make(chan error, 1)
	var out agentproto.SnapshotOutput
	go func() {
		var err error
		out, err = r.Snapshot(t.Context(), agentproto.SnapshotArgs{InstanceID: "a", SnapshotID: "s1"})
		done <- err
	}()
	<-vm.saving
	_, err := r.Snapshot(t.Context(), agentproto.SnapshotArgs{InstanceID: "a", SnapshotID: "s2"})
	assert.ErrorContains(t, err, "not running or paused", "one snapshot at a time")

	reboot := in
	reboot.Reboots = 1
	apply(t, r, reboot)
	assert.Equal(t, []string{"pause", "save"}, vm.Calls(), "no reset while the snapshot runs")

	close(vm.saveGate)
	require.NoError(t, <-done)
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{"pause", "save", "resume", "reset"}, vm.Calls(), "the reboot caught up after the snapshot")
	assert.Contains(t, vm.Requests(), guestproto.OpSync, "the guest synced first")
	assert.Positive(t, out.SizeBytes)
	for _, f := range []string{"state", "memory"} {
		assert.FileExists(t, filepath.Join(r.snapshotDir("s1"), f))
	}
}

func TestASnapshotNeedsAMemoryFile(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	_, err := r.Snapshot(t.Context(), agentproto.SnapshotArgs{InstanceID: "a", SnapshotID: "s"})
	assert.ErrorContains(t, err, "keeps no memory file")
	assert.Empty(t, l.vm(t, "a").Calls())
	assert.NoDirExists(t, r.snapshotDir("s"))
}

// A boot that attaches a volume still held by an instance the same spec
// deletes waits for that VM to end; the guest writes the volume out first.
func TestABootWaitsForItsVolumeToBeReleased(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	vol := []agentproto.SpecVolume{{Serial: "v1", MountPath: "/data"}}
	a := inst("a", StateRunning)
	a.Volumes = vol
	apply(t, r, a)
	waitState(t, r, "a", StateRunning)
	held := l.vm(t, "a")
	held.killGate = make(chan struct{})

	b := inst("b", StateRunning)
	b.Volumes = vol
	a.State = StateDeleted
	apply(t, r, a, b)
	time.Sleep(100 * time.Millisecond)
	assert.Empty(t, l.vms("b"), "b's VM does not start while a holds the volume")
	assert.Equal(t, "starting", observe(r, "b").State)

	close(held.killGate)
	waitState(t, r, "b", StateRunning)
	assert.Equal(t, []string{"kill"}, held.Calls())
	assert.Equal(t, []string{guestproto.OpIdentity, guestproto.OpMount, guestproto.OpSync}, held.Requests(),
		"a's guest synced its volume before its VM ended")
	require.Len(t, l.vm(t, "b").Config().Disks, 1)
	assert.Equal(t, "v1", l.vm(t, "b").Config().Disks[0].Serial)
}

// A new runtime takes over the VMs of the one before.
func TestANewRuntimeReattaches(t *testing.T) {
	paused := newFakeVM(&qemu.Config{ID: "p"})
	paused.status = "paused"
	l := &fakeLauncher{attach: map[string]attachAnswer{
		"run":    {vm: newFakeVM(&qemu.Config{ID: "run"})},
		"p":      {vm: paused},
		"broken": {err: errors.New("qemu: QMP handshake timed out")},
		// "gone" and "stopped" have no VM: qemu.ErrGone.
	}}
	dir := t.TempDir()
	for id, state := range map[string]string{"run": StateRunning, "p": StatePaused, "gone": StateRunning, "stopped": StateStopped, "broken": StateRunning} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "vms", id), 0o700))
		b, err := json.Marshal(inst(id, state))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vms", id, "instance.json"), b, 0o600))
	}
	r, err := newQEMU(dir, "tcg", discard, l)
	require.NoError(t, err)
	st := byID(r.Observe(t.Context()))
	assert.Equal(t, StateRunning, st["run"].State)
	assert.Equal(t, StatePaused, st["p"].State)
	assert.Equal(t, StateStopped, st["stopped"].State)
	assert.Equal(t, "failed", st["gone"].State)
	assert.Contains(t, st["gone"].Error, "ended while the daemon was away")
	assert.Equal(t, "failed", st["broken"].State)
	assert.Contains(t, st["broken"].Error, "could not re-attach")
	assert.Equal(t, []string{"broken"}, l.killedDirs, "a VM out of reach is ended, not left running untracked")

	// The same spec changes nothing on the VMs that run; Close detaches.
	apply(t, r, inst("run", StateRunning), inst("p", StatePaused), inst("stopped", StateStopped))
	assert.Empty(t, l.started)
	require.NoError(t, r.Close())
	assert.Equal(t, []string{"detach"}, l.attach["run"].vm.Calls())
	assert.Equal(t, []string{"detach"}, paused.Calls())
}

func TestUserDataIsDeliveredWithItsSecretsAtFirstBootOnly(t *testing.T) {
	l := &fakeLauncher{}
	r := newRuntime(t, l)
	var asked []string
	r.UseSecrets(func(_ context.Context, id string, refs []string) (map[string]string, error) {
		asked = append(asked, refs...)
		return map[string]string{"secret://db/password": "hunter2"}, nil
	})
	in := inst("a", StateRunning)
	in.UserData = "password=secret://db/password"
	apply(t, r, in)
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{"secret://db/password"}, asked)
	vm := l.vm(t, "a")
	assert.Equal(t, []string{guestproto.OpIdentity, guestproto.OpWriteFile}, vm.Requests())
	assert.Equal(t, "password=hunter2", vm.UserData(), "the guest sees the secret's value")

	in.Reboots = 1
	apply(t, r, in)
	require.Eventually(t, func() bool { return len(vm.Requests()) == 3 }, 5*time.Second, 5*time.Millisecond)
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, guestproto.OpIdentity, vm.Requests()[2], "a reboot delivers no user data")
}

// waitStateWithin is waitState with a deadline of its own.
func waitStateWithin(t *testing.T, r *QEMU, id, state string, d time.Duration) agentproto.InstanceStatus {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, state, observe(r, id).State)
	}, d, 10*time.Millisecond)
	return observe(r, id)
}
