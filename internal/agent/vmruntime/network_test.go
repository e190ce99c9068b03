package vmruntime

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent/network"
	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// fakeNet is the node's network manager as the runtime sees it: it
// records the calls, in one log with the launcher's starts, so a test
// sees that a network is added before its VM starts and removed after it
// ended.
type fakeNet struct {
	l *fakeLauncher

	mu       sync.Mutex
	log      []string
	nets     map[string]*network.VM // what the test hook returns, by instance id
	addErr   error
	keep     map[string]bool // what Cleanup's keep said, by VM id asked
	counters map[string]network.Counters
}

func newFakeNet(l *fakeLauncher) *fakeNet {
	n := &fakeNet{l: l, nets: map[string]*network.VM{}}
	l.prepare = func(vm *fakeVM) { n.record("start " + vm.cfg.ID) }
	return n
}

func (n *fakeNet) record(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.log = append(n.log, s)
}

// Log returns the calls and starts, in order.
func (n *fakeNet) Log() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.log)
}

// hook is the runtime's netOf for tests.
func (n *fakeNet) hook(spec agentproto.InstanceSpec) *network.VM {
	n.mu.Lock()
	defer n.mu.Unlock()
	if v := n.nets[spec.ID]; v != nil {
		c := *v
		return &c
	}
	return nil
}

func (n *fakeNet) set(id string, v *network.VM) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nets[id] = v
}

func (n *fakeNet) Cleanup(keep func(string) bool) error {
	n.record("cleanup")
	kept := map[string]bool{}
	for _, id := range []string{"run", "gone", "bad", "plain"} {
		kept[id] = keep(id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.keep = kept
	return nil
}

func (n *fakeNet) Add(vm network.VM) (network.Port, error) {
	if err := vm.Validate(); err != nil {
		return network.Port{}, err
	}
	n.record("add " + vm.ID + " " + vm.Address.String())
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.addErr != nil {
		return network.Port{}, n.addErr
	}
	return network.Port{Tap: "cptestt" + vm.ID, MAC: vm.MAC}, nil
}

func (n *fakeNet) SetPolicy(id string, p network.Policy) error {
	n.record("policy " + id + " " + prefixes(p.Allow))
	return nil
}

// Remove records whether the VM's process had ended (it must have).
func (n *fakeNet) Remove(id string) error {
	ended := "ended"
	for _, vm := range n.l.vms(id) {
		if vm.Alive() {
			ended = "ALIVE"
		}
	}
	n.record("remove " + id + " " + ended)
	return nil
}

// SetOverlays records the networks given (ids and peers).
func (n *fakeNet) SetOverlays(nets []network.Overlay) error {
	var s []string
	for _, o := range nets {
		s = append(s, o.ID+"="+addrs(o.Peers))
	}
	n.record("overlays " + strings.Join(s, " "))
	return nil
}

// PrivateMTU is a 1500 underlay's.
func (n *fakeNet) PrivateMTU() int { return 1450 }

func addrs(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

func (n *fakeNet) Counters() (map[string]network.Counters, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.counters, nil
}

func prefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

func egress(addr string) *network.VM {
	return &network.VM{VMNetwork: agentproto.VMNetwork{Mode: network.ModeEgress, Tenant: "t1", MAC: "52:54:00:00:00:02",
		Address: netip.MustParsePrefix(addr + "/24"), Gateway: netip.MustParseAddr("10.200.1.1"),
		DNS: []netip.Addr{netip.MustParseAddr("10.200.1.1")}}}
}

// newNetRuntime is a runtime over fake VMs with a fake network wired.
func newNetRuntime(t *testing.T) (*QEMU, *fakeLauncher, *fakeNet) {
	t.Helper()
	l := &fakeLauncher{}
	n := newFakeNet(l)
	r := newRuntime(t, l)
	r.netHook = n.hook
	require.NoError(t, r.UseNetwork(n, 1400))
	return r, l, n
}

// waitLog waits for the network's log to be want.
func waitLog(t *testing.T, n *fakeNet, want ...string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, want, n.Log()) }, 5*time.Second, 5*time.Millisecond)
}

// cmdlineNet decodes compute.net= from a kernel command line.
func cmdlineNet(t *testing.T, cmdline string) guestproto.Network {
	t.Helper()
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, "compute.net="); ok {
			b, err := base64.RawURLEncoding.DecodeString(v)
			require.NoError(t, err)
			var g guestproto.Network
			require.NoError(t, json.Unmarshal(b, &g))
			return g
		}
	}
	t.Fatalf("no compute.net= in %q", cmdline)
	return guestproto.Network{}
}

// A VM with a network: its network is added before qemu starts, its
// card is on the tap the manager made, compute-guest finds its address on
// the kernel command line, and the network is removed once the VM ended.
func TestANetworkIsAddedBeforeTheVMStartsAndRemovedAfterItEnds(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("a", egress("10.200.1.2"))
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a"}, n.Log())

	vm := l.vm(t, "a")
	assert.Equal(t, &qemu.NetDevice{Tap: "cptestta", MAC: "52:54:00:00:00:02"}, vm.Config().Net)
	g := cmdlineNet(t, vm.Config().Cmdline)
	assert.Equal(t, guestproto.Network{MAC: "52:54:00:00:00:02", Address: "10.200.1.2/24", Gateway: "10.200.1.1", DNS: []string{"10.200.1.1"}, MTU: 1400}, g,
		"the node's MTU where the VM names none")
	require.NoError(t, g.Validate())
	assert.Equal(t, []*guestproto.Network{nil}, vm.Networks(), "a kernel boot is addressed from its command line")

	// The same spec again calls nothing; a reboot keeps the network.
	apply(t, r, inst("a", StateRunning))
	in := inst("a", StateRunning)
	in.Reboots = 1
	apply(t, r, in)
	require.Eventually(t, func() bool { return slices.Contains(vm.Calls(), "reset") }, 5*time.Second, 5*time.Millisecond)
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a"}, n.Log())

	// Deleted: removed after the VM was killed.
	apply(t, r)
	waitLog(t, n, "cleanup", "add a 10.200.1.2/24", "start a", "remove a ended")
}

// A stop removes the network; a start adds it again for the new VM.
func TestAStopRemovesTheNetworkAndAStartAddsItAgain(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("a", egress("10.200.1.2"))
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	apply(t, r, inst("a", StateStopped))
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a", "remove a ended"}, n.Log())
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a", "remove a ended", "add a 10.200.1.2/24", "start a"}, n.Log())
	assert.Len(t, l.vms("a"), 2)
}

// Only a policy change is applied to a live VM, in place (no reboot); a
// running VM's new address waits for its next boot.
func TestAPolicyChangeIsAppliedInPlace(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("a", egress("10.200.1.2"))
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)

	changed := egress("10.200.1.2")
	changed.Policy.Allow = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	n.set("a", changed)
	apply(t, r, inst("a", StateRunning))
	apply(t, r, inst("a", StateRunning)) // the same again: nothing
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a", "policy a 198.51.100.0/24"}, n.Log())

	// Paused too.
	paused := *changed
	paused.Policy.Allow = nil
	n.set("a", &paused)
	apply(t, r, inst("a", StatePaused))
	assert.Equal(t, "policy a ", n.Log()[4])

	// A new address on a running VM: nothing now.
	n.set("a", egress("10.200.1.3"))
	apply(t, r, inst("a", StatePaused))
	assert.Len(t, n.Log(), 5)
	assert.Len(t, l.vms("a"), 1)
	assert.Equal(t, []string{"pause"}, l.vm(t, "a").Calls(), "no reboot, no reset")
}

// A claim keeps a warm instance's network, or wires its new address and
// tells the guest with its identity.
func TestAClaimKeepsOrChangesTheNetwork(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("w", egress("10.200.1.2"))
	apply(t, r, inst("w", StatePaused))
	waitState(t, r, "w", StatePaused)

	claim := inst("w", StateRunning)
	claim.Identity = &agentproto.SpecIdentity{Generation: 2, Hostname: "claimed", MachineID: "m-2"}
	apply(t, r, claim)
	waitState(t, r, "w", StateRunning)
	vm := l.vm(t, "w")
	assert.Equal(t, []*guestproto.Network{nil, nil}, vm.Networks(), "the same network: the guest keeps it")
	assert.Equal(t, []string{"cleanup", "add w 10.200.1.2/24", "start w"}, n.Log())

	apply(t, r, inst("w", StatePaused))
	waitState(t, r, "w", StatePaused)
	n.set("w", egress("10.200.1.9"))
	claim.Identity.Generation = 3
	apply(t, r, claim)
	waitState(t, r, "w", StateRunning)
	assert.Equal(t, []string{"cleanup", "add w 10.200.1.2/24", "start w", "add w 10.200.1.9/24"}, n.Log())
	nets := vm.Networks()
	require.Len(t, nets, 3)
	require.NotNil(t, nets[2])
	assert.Equal(t, "10.200.1.9/24", nets[2].Address, "the claim's identity carries the new address")
}

// Mode none (or no network) adds no card and calls nothing.
func TestModeNoneAddsNoCard(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("a", &network.VM{VMNetwork: agentproto.VMNetwork{Mode: network.ModeNone}})
	apply(t, r, inst("a", StateRunning), inst("b", StateRunning))
	waitState(t, r, "a", StateRunning)
	waitState(t, r, "b", StateRunning)
	for _, id := range []string{"a", "b"} {
		c := l.vm(t, id).Config()
		assert.Nil(t, c.Net)
		assert.NotContains(t, c.Cmdline, "compute.net=")
	}
	apply(t, r)
	time.Sleep(50 * time.Millisecond)
	assert.ElementsMatch(t, []string{"cleanup", "start a", "start b"}, n.Log())
}

// A network that cannot be added fails the boot before qemu starts; a node
// without a network refuses an instance that asks for one.
func TestANetworkThatCannotBeAddedFailsTheBoot(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.addErr = errors.New("network: 10.9.0.2/24 is not inside the egress pool 10.200.0.0/16")
	n.set("a", egress("10.200.1.2"))
	apply(t, r, inst("a", StateRunning))
	st := waitState(t, r, "a", "failed")
	assert.Contains(t, st.Error, "not inside the egress pool")
	assert.Empty(t, l.vms("a"), "no VM started")

	l2 := &fakeLauncher{}
	bare := newRuntime(t, l2)
	bare.netHook = n.hook
	apply(t, bare, inst("a", StateRunning))
	st = waitState(t, bare, "a", "failed")
	assert.Contains(t, st.Error, "asks for network egress and this node runs without networks (compute-agent run --network none; start it with --network nftables)")
	assert.Empty(t, l2.vms("a"))
}

// A VM that dies has its network removed.
func TestAVMThatDiesHasItsNetworkRemoved(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("a", egress("10.200.1.2"))
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	l.vm(t, "a").die()
	waitState(t, r, "a", "failed")
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a", "remove a ended"}, n.Log())
}

// After a restart the runtime keeps the taps of the VMs it re-attached
// to (Cleanup's keep), wires them again, and ends an adopted VM whose
// network cannot be wired again.
func TestANewRuntimeKeepsAndRewiresTheAdoptedVMsNetworks(t *testing.T) {
	run, bad, plain := newFakeVM(&qemu.Config{ID: "run"}), newFakeVM(&qemu.Config{ID: "bad"}), newFakeVM(&qemu.Config{ID: "plain"})
	l := &fakeLauncher{attach: map[string]attachAnswer{"run": {vm: run}, "bad": {vm: bad}, "plain": {vm: plain}}}
	n := newFakeNet(l)
	n.set("run", egress("10.200.1.2"))
	n.set("gone", egress("10.200.1.3"))
	n.set("bad", egress("10.200.1.4"))
	n.nets["bad"].MAC = "not a mac"
	dir := t.TempDir()
	for _, id := range []string{"run", "gone", "bad", "plain"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "vms", id), 0o700))
		b, err := json.Marshal(inst(id, StateRunning))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vms", id, "instance.json"), b, 0o600))
	}
	r, err := newQEMU(dir, "tcg", discard, l)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	r.netHook = n.hook
	require.NoError(t, r.UseNetwork(n, 0))
	assert.Equal(t, map[string]bool{"run": true, "gone": false, "bad": true, "plain": false}, n.keep,
		"kept: the re-attached VMs with a network")
	assert.Equal(t, []string{"cleanup", "add run 10.200.1.2/24"}, n.Log())
	st := byID(r.Observe(t.Context()))
	assert.Equal(t, StateRunning, st["run"].State)
	assert.Equal(t, StateRunning, st["plain"].State)
	assert.Equal(t, "failed", st["bad"].State)
	assert.Contains(t, st["bad"].Error, "could not wire the VM's network again")
	assert.Equal(t, []string{"kill"}, bad.Calls())
}

// Each VM's egress counters reach the control plane in its status (the
// usage meter vps.egress.bytes); without a network there are none.
func TestEgressCountersInStatus(t *testing.T) {
	r, _, n := newNetRuntime(t)
	n.counters = map[string]network.Counters{"a": {TxBytes: 1234, RxBytes: 99}}
	out := r.egress([]agentproto.InstanceStatus{{ID: "a"}, {ID: "b"}}, n)
	assert.Equal(t, uint64(1234), out[0].EgressTxBytes)
	assert.Equal(t, uint64(99), out[0].EgressRxBytes)
	assert.Zero(t, out[1].EgressTxBytes+out[1].EgressRxBytes)
	plain := newRuntime(t, &fakeLauncher{})
	assert.Zero(t, plain.egress([]agentproto.InstanceStatus{{ID: "a"}}, nil)[0].EgressTxBytes, "no network, no meter")
}

// The node spec's network is the VM's, named by the instance.
func TestNetOfTheSpec(t *testing.T) {
	assert.Nil(t, netOf(agentproto.InstanceSpec{ID: "a"}), "a spec without a network: no card")
	nw := agentproto.VMNetwork{Mode: agentproto.NetEgress, Tenant: "t1", MAC: "02:00:00:00:00:01",
		Address: netip.MustParsePrefix("10.200.0.2/24"), Gateway: netip.MustParseAddr("10.200.0.1"),
		Policy: agentproto.EgressPolicy{Deny: []netip.Prefix{netip.MustParsePrefix("8.8.8.8/32")}}}
	got := netOf(agentproto.InstanceSpec{ID: "a", Network: &nw})
	require.NotNil(t, got)
	assert.Equal(t, "a", got.ID)
	assert.Equal(t, nw, got.VMNetwork)
}

var _ Network = (*network.Manager)(nil)

// A spec's private networks reach the network before its VMs are wired,
// only when they change, and a peer joining a running VM's network
// neither re-adds nor reboots it; a private VM that names no MTU gets
// the overlay's.
func TestTheSpecsOverlaysAreGivenBeforeItsVMsAndOnlyWhenTheyChange(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("p", &network.VM{VMNetwork: agentproto.VMNetwork{Mode: network.ModePrivate, Tenant: "t1", MAC: "52:54:00:00:00:03",
		Address: netip.MustParsePrefix("10.201.0.2/24"), NetworkID: "pnet_1"}})
	peer1, peer2 := netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	spec := func(peers ...netip.Addr) agentproto.SpecBody {
		return agentproto.SpecBody{Instances: []agentproto.InstanceSpec{inst("p", StateRunning)},
			Networks: []agentproto.NetworkSpec{{ID: "pnet_1", Tenant: "t1", VNI: 7, Peers: peers}}}
	}
	_, err := r.Apply(t.Context(), 1, spec(peer1))
	require.NoError(t, err)
	waitState(t, r, "p", StateRunning)
	assert.Equal(t, []string{"cleanup", "overlays pnet_1=192.0.2.2", "add p 10.201.0.2/24", "start p"}, n.Log())
	assert.Equal(t, 1450, cmdlineNet(t, l.vm(t, "p").Config().Cmdline).MTU, "the overlay's MTU, not the node's 1400")

	_, err = r.Apply(t.Context(), 2, spec(peer1))
	require.NoError(t, err)
	_, err = r.Apply(t.Context(), 3, spec(peer1, peer2))
	require.NoError(t, err)
	assert.Equal(t, []string{"cleanup", "overlays pnet_1=192.0.2.2", "add p 10.201.0.2/24", "start p", "overlays pnet_1=192.0.2.2,192.0.2.3"}, n.Log())
	assert.Len(t, l.vms("p"), 1, "the VM kept running")
	assert.NotContains(t, l.vm(t, "p").Calls(), "reset")
}

// A VM given the address of one being removed (the control plane frees
// an address once its VM is no longer reported) is added only after the
// other's rules are gone: two VMs never hold one address on the node.
func TestAnAddressIsAddedAgainOnlyAfterItsRemoval(t *testing.T) {
	r, l, n := newNetRuntime(t)
	n.set("a", egress("10.200.1.2"))
	n.set("b", egress("10.200.1.2"))
	apply(t, r, inst("a", StateRunning))
	waitState(t, r, "a", StateRunning)
	gate := make(chan struct{})
	l.vm(t, "a").killGate = gate
	apply(t, r, inst("b", StateRunning)) // a deleted, b booted with its address
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, []string{"cleanup", "add a 10.200.1.2/24", "start a"}, n.Log(), "b waits for a's removal")
	close(gate)
	waitLog(t, n, "cleanup", "add a 10.200.1.2/24", "start a", "remove a ended", "add b 10.200.1.2/24", "start b")
	waitState(t, r, "b", StateRunning)
}
