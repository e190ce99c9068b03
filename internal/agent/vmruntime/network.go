package vmruntime

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"

	"computeplane/internal/agent/network"
	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
)

// Network is what the qemu runtime needs of the node's network manager
// (*network.Manager); the runtime's unit tests record the calls instead.
type Network interface {
	Cleanup(keep func(vmID string) bool) error
	Add(vm network.VM) (network.Port, error)
	SetPolicy(vmID string, p network.Policy) error
	Remove(vmID string) error
	Counters() (map[string]network.Counters, error)
	// SetOverlays gives the spec's private networks with their peer
	// nodes (the cross-node overlay); PrivateMTU is the MTU of private
	// VMs that name none (the underlay's less VXLAN's overhead).
	SetOverlays(nets []network.Overlay) error
	PrivateMTU() int
}

// netOf is the network the node spec gives an instance (the control
// plane allocated its address and MAC); nil for a spec without one (a
// control plane from before networks: no card). The runtime sets the
// VM's ID, and fills in the node's MTU when it names none; DNS left empty
// is the node's resolvers (network.Config.Resolvers).
func netOf(spec agentproto.InstanceSpec) *network.VM {
	if spec.Network == nil {
		return nil
	}
	return &network.VM{ID: spec.ID, VMNetwork: *spec.Network}
}

// UseNetwork wires VMs' networks through n from now on. Called once,
// right after NewQEMU: it removes what a previous agent left on the node
// except the taps of the VMs this runtime re-attached to (n.Cleanup), and
// wires those again; an adopted VM whose network cannot be wired again is
// ended and reported failed, like one that cannot be re-attached.
func (r *QEMU) UseNetwork(n Network, mtu int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := func(id string) bool {
		st := r.vms[id]
		return st != nil && st.vm != nil && r.netFor(st.spec) != nil
	}
	if err := n.Cleanup(keep); err != nil {
		return err
	}
	r.net, r.netMTU, r.netPrivateMTU = n, mtu, n.PrivateMTU()
	for id, st := range r.vms {
		if st.vm == nil || r.netFor(st.spec) == nil {
			continue
		}
		if err := r.wire(id, st); err != nil {
			r.Log.Warn("could not wire an adopted VM's network again; ended it", "instance", id, "error", err.Error())
			_ = st.vm.Kill()
			st.vm, st.state, st.err = nil, "failed", "the daemon could not wire the VM's network again: "+err.Error()
		}
	}
	return nil
}

// netFor is the network of an instance as the runtime applies it: the
// spec's (netOf, or the test hook), named by the instance id, with the
// node's MTU when it names none; nil for none.
func (r *QEMU) netFor(spec agentproto.InstanceSpec) *network.VM {
	of := netOf
	if r.netHook != nil {
		of = r.netHook
	}
	n := of(spec)
	if n == nil || n.Mode == network.ModeNone || n.Mode == "" {
		return nil
	}
	v := *n
	v.ID = spec.ID
	if v.MTU == 0 {
		v.MTU = r.netMTU
		if v.Mode == network.ModePrivate && r.netPrivateMTU > 0 {
			v.MTU = r.netPrivateMTU
		}
	}
	if len(v.DNS) == 0 && v.Mode == network.ModeEgress {
		v.DNS = r.NetDNS
	}
	return &v
}

// setOverlays hands the spec's private networks to the network when they
// changed (r.mu held, before the spec's VMs are wired: a VM's first Add
// on a node finds its network's peers). Kept for the next spec only once
// applied, so a failure is tried again.
func (r *QEMU) setOverlays(nets []agentproto.NetworkSpec) error {
	if r.net == nil || slices.EqualFunc(r.overlays, nets, sameOverlay) {
		return nil
	}
	if err := r.net.SetOverlays(nets); err != nil {
		return fmt.Errorf("private networks' overlay: %w", err)
	}
	r.overlays = slices.Clone(nets)
	return nil
}

func sameOverlay(a, b network.Overlay) bool {
	return a.ID == b.ID && a.Tenant == b.Tenant && a.VNI == b.VNI && slices.Equal(a.Peers, b.Peers)
}

// wire adds an instance's network (r.mu held: every network call for an
// instance is made under it, so a removal never overtakes a new boot's
// add) and returns its card. A runtime without a network refuses an
// instance that asks for one rather than boot it without.
func (r *QEMU) wire(id string, st *vmState) error {
	want := r.netFor(st.spec)
	if want == nil {
		return nil
	}
	if r.net == nil {
		return fmt.Errorf("the instance asks for network %s and this node runs without networks (compute-agent run --network none; start it with --network nftables)", want.Mode)
	}
	port, err := r.net.Add(*want)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	st.wired, st.port = want, port
	return nil
}

// unwire removes an instance's network once its VM has ended (r.mu held).
func (r *QEMU) unwire(id string, st *vmState) {
	if st.wired == nil || r.net == nil {
		return
	}
	if err := r.net.Remove(id); err != nil {
		r.Log.Warn("could not remove a VM's network", "instance", id, "error", err.Error())
	}
	st.wired, st.port = nil, network.Port{}
}

// rewire brings a live VM's network to the spec's (r.mu held): a policy
// change alone is applied in place (SetPolicy, no reboot); with identity
// (a claim, whose identity request carries the network to the guest) any
// other change is wired again on the same tap. Other changes to a running
// VM's network (its card, its address) wait for its next boot or claim.
// It says whether the network was wired again (the guest is to be told).
func (r *QEMU) rewire(id string, st *vmState, identity bool) (bool, error) {
	want := r.netFor(st.spec)
	have := st.wired
	if want == nil || have == nil || r.net == nil {
		return false, nil
	}
	if sameNetExceptPolicy(*have, *want) {
		if samePolicy(have.Policy, want.Policy) {
			return false, nil
		}
		if err := r.net.SetPolicy(id, want.Policy); err != nil {
			return false, fmt.Errorf("network policy: %w", err)
		}
		have.Policy = want.Policy
		return false, nil
	}
	if !identity || have.MAC != want.MAC || have.Mode != want.Mode {
		return false, nil
	}
	return true, r.wire(id, st)
}

func samePolicy(a, b network.Policy) bool {
	return slices.Equal(a.Allow, b.Allow) && slices.Equal(a.Deny, b.Deny) &&
		slices.Equal(a.AllowDomains, b.AllowDomains) && slices.Equal(a.DenyDomains, b.DenyDomains)
}

func sameNetExceptPolicy(a, b network.VM) bool {
	a.Policy, b.Policy = network.Policy{}, network.Policy{}
	return a.ID == b.ID && a.Mode == b.Mode && a.Tenant == b.Tenant && a.MAC == b.MAC && a.Address == b.Address &&
		a.Gateway == b.Gateway && slices.Equal(a.DNS, b.DNS) && a.MTU == b.MTU && slices.Equal(a.Peers, b.Peers)
}

// guestNet is the guest's side of a VM's network (compute-guest
// configures its card from it).
func guestNet(n *network.VM) *guestproto.Network {
	if n == nil {
		return nil
	}
	g := &guestproto.Network{MAC: n.MAC, Address: n.Address.String(), MTU: n.MTU}
	if n.Gateway.IsValid() {
		g.Gateway = n.Gateway.String()
	}
	for _, d := range n.DNS {
		g.DNS = append(g.DNS, d.String())
	}
	return g
}

// netCmdline is the kernel command line argument compute-guest configures
// its card from at boot, before its agent answers.
func netCmdline(n *network.VM) string {
	b, _ := json.Marshal(guestNet(n))
	return "compute.net=" + base64.RawURLEncoding.EncodeToString(b)
}

// egress fills in each status's egress counters (cumulative, as the
// network counts them since the VM's port was made) for the control
// plane's usage meter; without a network it leaves them zero.
func (r *QEMU) egress(out []agentproto.InstanceStatus, n Network) []agentproto.InstanceStatus {
	if n == nil {
		return out
	}
	c, err := n.Counters()
	if err != nil {
		r.Log.Warn("could not read the network's counters", "error", err.Error())
		return out
	}
	for i := range out {
		if v, ok := c[out[i].ID]; ok {
			out[i].EgressTxBytes, out[i].EgressRxBytes = v.TxBytes, v.RxBytes
		}
	}
	return out
}
