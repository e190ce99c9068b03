package network

import (
	"computeplane/internal/agentproto"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Mode is how a VM is networked: the node spec's modes.
type Mode = string

// The modes (agentproto.NetNone, NetEgress, NetPrivate).
const (
	// ModeNone: no network device at all.
	ModeNone = agentproto.NetNone
	// ModeEgress: outbound through the node's uplink with source NAT,
	// nothing inbound, the platform deny set always on.
	ModeEgress = agentproto.NetEgress
	// ModePrivate: a layer-2 network among one tenant's VMs, no internet
	// and no route to the node.
	ModePrivate = agentproto.NetPrivate
)

// VM is one virtual machine's network as the node spec carries it
// (agentproto.VMNetwork: the control plane allocates Address and MAC) with
// the id of its VM, which names every object the manager makes for it.
type VM struct {
	ID string `json:"id"`
	agentproto.VMNetwork
}

// Policy is a VM's own egress policy (agentproto.EgressPolicy), under the
// platform deny set, which no policy lifts. Domain entries are matched on
// TLS SNI and the HTTP Host by a DomainFilter (Config); without one a
// policy naming domains is refused (ErrDomains) rather than ignored.
type Policy = agentproto.EgressPolicy

// Counters are a VM's routed traffic through the node (egress mode):
// Tx leaves the VM past the policy, Rx comes back.
type Counters struct {
	TxBytes, TxPackets, RxBytes, RxPackets uint64
}

// ErrDomains: a policy names domains and no DomainFilter is configured
// (compute-agent's --net-domain-filter=false).
var ErrDomains = errors.New("network: domain policies need a domain filter (the node runs without one)")

// Validate checks a VM's network before anything is made for it.
func (v *VM) Validate() error {
	if v.ID == "" {
		return errors.New("network: a VM needs an id")
	}
	switch v.Mode {
	case ModeNone:
		return nil
	case ModeEgress, ModePrivate:
	default:
		return fmt.Errorf("network: unknown mode %q", v.Mode)
	}
	if v.Tenant == "" {
		return errors.New("network: a VM needs a tenant")
	}
	if hw, err := net.ParseMAC(v.MAC); err != nil || len(hw) != 6 || hw[0]&1 == 1 {
		return fmt.Errorf("network: %q is not a unicast Ethernet address", v.MAC)
	}
	if !v.Address.IsValid() || !v.Address.Addr().Is4() || v.Address.Bits() > 30 || v.Address.Addr() == v.Address.Masked().Addr() {
		return fmt.Errorf("network: %v is not an IPv4 host address in a subnet of /30 or larger", v.Address)
	}
	if v.Mode == ModeEgress && (!v.Gateway.IsValid() || !v.Address.Contains(v.Gateway) || v.Gateway == v.Address.Addr()) {
		return fmt.Errorf("network: gateway %v is not another address in %v", v.Gateway, v.Address.Masked())
	}
	if v.MTU != 0 && (v.MTU < 576 || v.MTU > 9000) {
		return fmt.Errorf("network: mtu %d is outside 576..9000", v.MTU)
	}
	if len(v.Policy.DenyDomains) > 0 {
		return errors.New("network: a domain entry belongs in the allow list only (deny takes addresses and CIDRs)")
	}
	for _, p := range append(append([]netip.Prefix(nil), v.Policy.Allow...), v.Policy.Deny...) {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("network: policy entry %v is not an IPv4 prefix", p)
		}
	}
	return nil
}
