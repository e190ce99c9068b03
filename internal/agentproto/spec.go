package agentproto

import (
	"fmt"
	"net/netip"
)

// The node spec: what the control plane wants a node to run. The control
// plane builds it (nodework.PushSpec), stores the body in node_specs and
// the gateway sends it as is; the daemon decodes it once, with the
// message, and hands the typed values to its volume store and runtime.
//
// Version rules (protocol 1): a field is only ever added, optional
// (omitempty or a zero value that means what its absence meant), and an
// older peer ignores what it does not know (encoding/json drops unknown
// keys). Renaming a field, changing its type or what it means takes a new
// protocol version (ProtocolMax, buildinfo.AgentProtocolMax).
// testdata/spec-v1.json is a spec as protocol-1 control planes send it;
// spec_test.go keeps it readable and keeps what this build sends readable
// by a daemon that knows only those fields.

// SpecBody is the body of a spec.
type SpecBody struct {
	Instances []InstanceSpec `json:"instances"`
	// Volumes are the node's volume store (nil: a control plane that does
	// not speak of volumes; the store is left as it is).
	Volumes []VolumeSpec `json:"volumes"`
	// Networks are the private networks of the node's VMs with the
	// pool's other nodes carrying each (the overlay, docs/networking.md);
	// a daemon from before ignores them and its private networks stay
	// within the node.
	Networks []NetworkSpec `json:"networks,omitempty"`
	// Tunnels are reserved for a later version: this one sends none and
	// a daemon ignores them.
	Tunnels []TunnelSpec `json:"tunnels,omitempty"`
}

// Desired states of an instance in a spec.
const (
	StateRunning = "running"
	StateStopped = "stopped"
	StatePaused  = "paused"
	StateDeleted = "deleted"
)

// Observed states an InstanceStatus carries besides running, stopped and
// paused.
const (
	StateStarting = "starting"
	StateFailed   = "failed"
)

// InstanceSpec is one desired instance: a VM of a flavor booting an image.
type InstanceSpec struct {
	ID        string `json:"id"`
	State     string `json:"state"` // running, stopped, paused, deleted
	Hostname  string `json:"hostname"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int64  `json:"memoryMiB"`
	DiskGiB   int64  `json:"diskGiB"`
	Boot      Boot   `json:"boot"`
	UserData  string `json:"userData,omitempty"`
	// Reboots counts the reboots asked for: a higher count than the
	// runtime saw reboots the VM once.
	Reboots int `json:"reboots"`
	// Sandboxes and warm instances (docs/sandboxes.md): who the guest is
	// (a claim raises the generation), the volumes it mounts, guest
	// memory in a shared file (fast pause, snapshot, restore), the
	// snapshot it starts from.
	Identity   *SpecIdentity `json:"identity,omitempty"`
	Volumes    []SpecVolume  `json:"volumes,omitempty"`
	MemoryFile bool          `json:"memoryFile,omitempty"`
	Restore    string        `json:"restore,omitempty"`
	// Network is the VM's network (issue 23); nil from a control plane
	// that does not speak of networks (the VM gets none, as before).
	Network *VMNetwork `json:"network,omitempty"`
}

// IdentityGeneration is the identity generation the spec asks for, 0
// without one.
func (in InstanceSpec) IdentityGeneration() int64 {
	if in.Identity == nil {
		return 0
	}
	return in.Identity.Generation
}

// Boot is what a runtime needs of an instance's image, resolved when the
// instance was created (an image changed later does not change it).
type Boot struct {
	Format   string `json:"format"` // qcow2, raw, kernel+initrd
	Location string `json:"location"`
	Initrd   string `json:"initrd,omitempty"`
	Cmdline  string `json:"cmdline,omitempty"`
	SHA256   string `json:"sha256"`
}

// Network modes of a VM.
const (
	NetNone    = "none"    // no network device at all
	NetEgress  = "egress"  // outbound through the node's uplink, source NAT, nothing inbound
	NetPrivate = "private" // a layer-2 network among one tenant's VMs of a pool, no internet
)

// VMNetwork is one VM's network, field for field the agent's
// network.VM (internal/agent/network) less its id, which is the
// instance's. The control plane allocates Address and MAC per pool (never
// two live VMs on one address); DNS and MTU left empty are the agent's
// own (its resolvers, its taps' MTU).
type VMNetwork struct {
	Mode   string `json:"mode"` // none, egress, private
	Tenant string `json:"tenant,omitempty"`
	// MAC is the virtio-net card's address (locally administered,
	// derived from the instance id).
	MAC string `json:"mac,omitempty"`
	// Address is the VM's IPv4 address with its subnet's length, inside
	// the pool's range for Mode (docs/networking.md).
	Address netip.Prefix `json:"address,omitzero"`
	// Gateway is the node's address on the tenant's egress bridge; empty
	// in private mode.
	Gateway netip.Addr   `json:"gateway,omitzero"`
	DNS     []netip.Addr `json:"dns,omitempty"`
	MTU     int          `json:"mtu,omitempty"`
	Policy  EgressPolicy `json:"policy,omitzero"`
	// NetworkID names the tenant's private network of the pool (private
	// mode): SpecBody.Networks holds its overlay under this id.
	NetworkID string `json:"networkId,omitempty"`
	// Peers is never sent: a private network's peers are the node's
	// (SpecBody.Networks), not each VM's. A daemon ignores it.
	Peers []netip.Addr `json:"peers,omitempty"`
}

// EgressPolicy is a VM's own egress policy, under the platform deny set.
// An empty Allow and AllowDomains admit what the deny set and Deny leave;
// otherwise exactly their entries pass. Domains are matched on TLS SNI
// and the HTTP Host; a domain is only ever allowed.
type EgressPolicy struct {
	Allow        []netip.Prefix `json:"allow,omitempty"`
	Deny         []netip.Prefix `json:"deny,omitempty"`
	AllowDomains []string       `json:"allowDomains,omitempty"`
	DenyDomains  []string       `json:"denyDomains,omitempty"`
}

// NetworkSpec is a private network some of the node's VMs are on
// (VMNetwork.NetworkID): the node joins it to the pool's other nodes
// carrying it by a VXLAN port on the tenant's private bridge, VNI VNI,
// towards each peer's underlay address (Inventory.Underlay).
type NetworkSpec struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant,omitempty"`
	// VNI is the overlay's VXLAN network identifier (1 to 2^24-1),
	// unique among the pool's private networks: the control plane
	// derives it from the tenant's private subnet (vmnet.VNI).
	VNI uint32 `json:"vni,omitempty"`
	// Peers are the underlay addresses of the pool's other nodes with a
	// VM on this network, sorted (empty: the network is this node's
	// alone for now).
	Peers []netip.Addr `json:"peers,omitempty"`
}

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// TunnelSpec is reserved: a tunnel of the node (a later version).
type TunnelSpec struct {
	ID string `json:"id"`
}

// MaxInstances bounds one spec.
const MaxInstances = 1024

// Validate checks what a runtime relies on: at most MaxInstances
// instances, each with an id of 1 to 128 characters, given once, a
// desired state and a network mode this version knows.
func (b SpecBody) Validate() error {
	if len(b.Instances) > MaxInstances {
		return fmt.Errorf("agentproto: at most %d instances in a spec", MaxInstances)
	}
	seen := make(map[string]bool, len(b.Instances))
	for i, in := range b.Instances {
		switch {
		case in.ID == "" || len(in.ID) > 128:
			return fmt.Errorf("agentproto: instances[%d]: an id of 1 to 128 characters", i)
		case seen[in.ID]:
			return fmt.Errorf("agentproto: instances[%d]: id %s twice", i, in.ID)
		}
		switch in.State {
		case StateRunning, StateStopped, StatePaused, StateDeleted:
		default:
			return fmt.Errorf("agentproto: instances[%d]: state %q", i, in.State)
		}
		if n := in.Network; n != nil && n.Mode != NetNone && n.Mode != NetEgress && n.Mode != NetPrivate {
			return fmt.Errorf("agentproto: instances[%d]: network mode %q", i, n.Mode)
		}
		seen[in.ID] = true
	}
	nets := make(map[string]bool, len(b.Networks))
	for i, n := range b.Networks {
		switch {
		case n.ID == "" || len(n.ID) > 128:
			return fmt.Errorf("agentproto: networks[%d]: an id of 1 to 128 characters", i)
		case nets[n.ID]:
			return fmt.Errorf("agentproto: networks[%d]: id %s twice", i, n.ID)
		case n.VNI == 0 || n.VNI > MaxVNI:
			return fmt.Errorf("agentproto: networks[%d]: vni %d is outside 1..%d", i, n.VNI, MaxVNI)
		}
		for _, p := range n.Peers {
			if !p.IsValid() {
				return fmt.Errorf("agentproto: networks[%d]: a peer without an address", i)
			}
		}
		nets[n.ID] = true
	}
	return nil
}
