package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Mode is how a VM is networked.
type Mode string

const (
	// ModeNone: no network device at all.
	ModeNone Mode = "none"
	// ModeEgress: outbound through the node's uplink with source NAT,
	// nothing inbound, the platform deny set always on.
	ModeEgress Mode = "egress"
	// ModePrivate: a layer-2 network among one tenant's VMs, no internet
	// and no route to the node.
	ModePrivate Mode = "private"
)

// VM is one virtual machine's network as the agent applies it and
// compute-guest configures it. It is the shape that moves into
// internal/agentproto (the node spec) once the spec carries networks; the
// control plane allocates Address (per pool, never two live VMs on one)
// and MAC.
type VM struct {
	// ID names the VM (its instance or sandbox id); every object the
	// manager makes for it derives its name from it.
	ID     string `json:"id"`
	Mode   Mode   `json:"mode"`
	Tenant string `json:"tenant"`
	// MAC is the virtio-net card's address, e.g. 52:54:00:12:34:56.
	MAC string `json:"mac,omitempty"`
	// Address is the VM's IPv4 address with its subnet's length, e.g.
	// 10.200.3.7/24 (inside the node's pool for Mode).
	Address netip.Prefix `json:"address,omitzero"`
	// Gateway is the node's address on the tenant's egress bridge (the
	// VM's default route); empty in private mode.
	Gateway netip.Addr   `json:"gateway,omitzero"`
	DNS     []netip.Addr `json:"dns,omitempty"`
	MTU     int          `json:"mtu,omitempty"`
	Policy  Policy       `json:"policy,omitzero"`
	// Peers are the other nodes carrying this tenant's private network
	// (their overlay endpoints). Not used yet: the cross-node overlay
	// (VXLAN on the tenant's private bridge) comes later.
	Peers []netip.Addr `json:"peers,omitempty"`
}

// Policy is a VM's own egress policy, under the platform deny set (which
// no policy lifts). An empty Allow admits everything the deny set and
// Deny leave; a non-empty Allow admits exactly its entries.
type Policy struct {
	Allow []netip.Prefix `json:"allow,omitempty"`
	Deny  []netip.Prefix `json:"deny,omitempty"`
	// AllowDomains and DenyDomains are matched on TLS SNI and the HTTP
	// Host by a DomainFilter (Config); without one a policy naming
	// domains is refused (ErrDomains) rather than silently ignored.
	AllowDomains []string `json:"allowDomains,omitempty"`
	DenyDomains  []string `json:"denyDomains,omitempty"`
}

// Counters are a VM's routed traffic through the node (egress mode):
// Tx leaves the VM past the policy, Rx comes back.
type Counters struct {
	TxBytes, TxPackets, RxBytes, RxPackets uint64
}

// ErrDomains: a policy names domains and no DomainFilter is configured.
var ErrDomains = errors.New("network: domain policies need a domain filter (not built yet)")

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
	for _, p := range append(append([]netip.Prefix(nil), v.Policy.Allow...), v.Policy.Deny...) {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("network: policy entry %v is not an IPv4 prefix", p)
		}
	}
	return nil
}
