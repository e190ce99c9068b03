// Package vmnet is the control plane's side of VM networks (issue 23,
// docs/networking.md): the egress policies the API takes (checked and
// stored as given), the addresses it allocates per pool, the MAC it
// derives from an instance id, and the agentproto.VMNetwork a node's spec
// carries for each instances row (a VPS, a warm instance, a sandbox's VM).
//
// Addressing: each pool has an egress range and a private range (Ranges);
// a tenant takes one /24 of a range at its first VM of that mode in the
// pool and keeps it (vm_subnets); its first address is the gateway (the
// node's address on the tenant's egress bridge), the others are its VMs'.
// No two live rows of a pool share an address (a partial unique index of
// instances): a row's address is free again once the row is deleted.
package vmnet

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
)

// Modes, as the API and the node spec name them.
const (
	None    = agentproto.NetNone
	Egress  = agentproto.NetEgress
	Private = agentproto.NetPrivate
)

// The ranges every pool allocates from, and the size of a tenant's
// subnet. They must be the agents' network.Config EgressPool and
// PrivatePool (the agents' defaults); a per-pool setting is left to do.
var (
	EgressRange  = netip.MustParsePrefix("10.200.0.0/16")
	PrivateRange = netip.MustParsePrefix("10.201.0.0/16")
)

// SubnetBits is the length of a tenant's subnet: 253 VMs per tenant, mode
// and pool, 256 tenants per range.
const SubnetBits = 24

// MaxEntries bounds each list of a policy (the catalog says it too).
const MaxEntries = 64

// Range is the range of a mode.
func Range(mode string) netip.Prefix {
	if mode == Private {
		return PrivateRange
	}
	return EgressRange
}

// CheckPolicy checks a policy the API took under field (e.g. "egress")
// and returns it normalized: addresses as /32, CIDRs masked, domains
// lowercased, duplicates dropped. A domain in deny, an IPv6 entry or
// anything else that is neither is INVALID_INPUT naming the entry.
func CheckPolicy(field string, p api.EgressPolicy) (api.EgressPolicy, error) {
	var out api.EgressPolicy
	for _, l := range []struct {
		name string
		in   []string
		out  *[]string
	}{{"allow", p.Allow, &out.Allow}, {"deny", p.Deny, &out.Deny}} {
		if len(l.in) > MaxEntries {
			return api.EgressPolicy{}, api.Errorf(api.CodeInvalidInput, "%s.%s: at most %d entries", field, l.name, MaxEntries)
		}
		seen := map[string]bool{}
		for i, e := range l.in {
			at := fmt.Sprintf("%s.%s[%d]", field, l.name, i)
			norm, domain, err := entry(e)
			if err != nil {
				return api.EgressPolicy{}, api.Errorf(api.CodeInvalidInput, "%s: %q %s", at, e, err)
			}
			if domain && l.name == "deny" {
				return api.EgressPolicy{}, api.Errorf(api.CodeInvalidInput,
					"%s: %q is a domain name; domains go only in allow (deny takes addresses and CIDRs)", at, e)
			}
			if !seen[norm] {
				seen[norm] = true
				*l.out = append(*l.out, norm)
			}
		}
	}
	return out, nil
}

// entry reads one policy entry: an IPv4 CIDR or address, or a domain
// name (optionally "*." for its subdomains).
func entry(e string) (norm string, domain bool, err error) {
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return "", false, errors.New("is not a CIDR")
		}
		if !p.Addr().Is4() {
			return "", false, errors.New("is not IPv4 (VMs have no IPv6 yet)")
		}
		return p.Masked().String(), false, nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if !a.Is4() {
			return "", false, errors.New("is not IPv4 (VMs have no IPv6 yet)")
		}
		return netip.PrefixFrom(a, 32).String(), false, nil
	}
	d := strings.TrimSuffix(strings.ToLower(e), ".")
	name := strings.TrimPrefix(d, "*.")
	labels := strings.Split(name, ".")
	if len(d) > 253 || len(labels) < 2 {
		return "", false, errors.New("is neither an IPv4 address, a CIDR nor a domain name of two labels or more")
	}
	for _, l := range labels {
		if !label(l) {
			return "", false, errors.New("is neither an IPv4 address, a CIDR nor a domain name")
		}
	}
	if _, err := netip.ParseAddr(name); err == nil || allDigits(labels[len(labels)-1]) {
		return "", false, errors.New("is not a domain name (a top-level label is never numeric)")
	}
	return d, true, nil
}

func label(l string) bool {
	if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, c := range l {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	return strings.Trim(s, "0123456789") == ""
}

// Encode is a policy as instances and templates store it: nil when it has
// no entry.
func Encode(p api.EgressPolicy) []byte {
	if len(p.Allow)+len(p.Deny) == 0 {
		return nil
	}
	b, _ := json.Marshal(p)
	return b
}

// Decode reads a stored policy (none: empty lists, as the API shows it).
func Decode(b []byte) api.EgressPolicy {
	p := api.EgressPolicy{}
	if len(b) > 0 {
		_ = json.Unmarshal(b, &p)
	}
	if p.Allow == nil {
		p.Allow = []string{}
	}
	if p.Deny == nil {
		p.Deny = []string{}
	}
	return p
}

// CheckMode refuses a policy under a network other than egress.
func CheckMode(field, mode string, p api.EgressPolicy) error {
	if mode != Egress && len(p.Allow)+len(p.Deny) > 0 {
		return api.Errorf(api.CodeInvalidInput, "%s: an egress policy applies only under network egress, not %s", field, mode)
	}
	return nil
}

// MAC is an instance's MAC address: locally administered, unicast, from
// a hash of its id (stable for the VM's life; a collision on one tenant's
// bridge is a chance of about n²/2⁴⁷).
func MAC(instanceID string) string {
	h := sha256.Sum256([]byte("computeplane/mac/" + instanceID))
	h[0] = h[0]&0xfc | 0x02
	return net.HardwareAddr(h[:6]).String()
}

// Assigns reports whether Assign changes a row inserted without a network
// (network none, no policy, as InsertInstance writes it) for mode and
// policy: when not, what follows the insert may travel with it.
func Assigns(mode string, policy []byte) bool { return mode != None || policy != nil }

// Assign gives row (just inserted) its network: mode, an address of its
// tenant's subnet of the pool (none under mode none) and its policy.
// CAPACITY_UNAVAILABLE when the range has no subnet or the subnet no
// address left.
func Assign(ctx context.Context, q *db.Queries, r db.Instance, mode string, policy []byte) (db.Instance, error) {
	if !Assigns(mode, policy) && r.Network == None && r.EgressPolicy == nil {
		return r, nil // as inserted: no statement
	}
	params := db.SetInstanceNetworkParams{InstanceID: r.InstanceID, Network: mode, EgressPolicy: policy}
	if mode != None {
		addr, err := allocate(ctx, q, r.PoolID, r.TenantID, mode)
		if err != nil {
			return db.Instance{}, err
		}
		params.NetAddress = pgtype.Text{String: addr.String(), Valid: true}
	}
	return q.SetInstanceNetwork(ctx, params)
}

// allocate takes the lowest free address of the tenant's subnet, taking
// the subnet first when the tenant has none. Allocations of a pool and
// mode are serialized until commit.
func allocate(ctx context.Context, q *db.Queries, pool, tenant, mode string) (netip.Prefix, error) {
	if err := q.LockVMSubnets(ctx, db.LockVMSubnetsParams{PoolID: pool, Network: mode}); err != nil {
		return netip.Prefix{}, err
	}
	subnet, err := subnetOf(ctx, q, pool, tenant, mode)
	if err != nil {
		return netip.Prefix{}, err
	}
	live, err := q.LiveVMAddresses(ctx, db.LiveVMAddressesParams{PoolID: pool, Network: mode, TenantID: tenant})
	if err != nil {
		return netip.Prefix{}, err
	}
	taken := make(map[netip.Addr]bool, len(live))
	for _, s := range live {
		if p, err := netip.ParsePrefix(s); err == nil {
			taken[p.Addr()] = true
		}
	}
	// .0 is the subnet, .1 the gateway, the last the broadcast.
	for a := subnet.Addr().Next().Next(); subnet.Contains(a.Next()); a = a.Next() {
		if !taken[a] {
			return netip.PrefixFrom(a, subnet.Bits()), nil
		}
	}
	return netip.Prefix{}, api.Errorf(api.CodeCapacityUnavailable, "network: the tenant's %s subnet %v of the pool has no address left", mode, subnet)
}

// subnetOf is the tenant's subnet of a pool's range, taken when missing.
func subnetOf(ctx context.Context, q *db.Queries, pool, tenant, mode string) (netip.Prefix, error) {
	s, err := q.GetVMSubnet(ctx, db.GetVMSubnetParams{PoolID: pool, Network: mode, TenantID: tenant})
	if err == nil {
		return netip.ParsePrefix(s)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return netip.Prefix{}, err
	}
	all, err := q.VMSubnets(ctx, db.VMSubnetsParams{PoolID: pool, Network: mode})
	if err != nil {
		return netip.Prefix{}, err
	}
	used := make(map[netip.Prefix]bool, len(all))
	for _, s := range all {
		if p, err := netip.ParsePrefix(s); err == nil {
			used[p] = true
		}
	}
	rng := Range(mode)
	step := uint32(1) << (32 - SubnetBits)
	base := rng.Addr().As4()
	start := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	for i := uint32(0); i < 1<<(SubnetBits-rng.Bits()); i++ {
		v := start + i*step
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), SubnetBits)
		if !used[p] {
			err := q.InsertVMSubnet(ctx, db.InsertVMSubnetParams{PoolID: pool, Network: mode, TenantID: tenant, Subnet: p.String()})
			return p, err
		}
	}
	return netip.Prefix{}, api.Errorf(api.CodeCapacityUnavailable, "network: the pool's %s range %v has no subnet left for another tenant", mode, rng)
}

// Spec is row's network as its node's spec carries it (nil for a row of
// no mode, which never happens after the migration's default).
func Spec(r db.Instance) (*agentproto.VMNetwork, error) {
	n := &agentproto.VMNetwork{Mode: r.Network}
	if r.Network == "" || r.Network == None {
		n.Mode = None
		return n, nil
	}
	addr, err := netip.ParsePrefix(r.NetAddress.String)
	if err != nil {
		return nil, fmt.Errorf("vmnet: instance %s: address %q: %w", r.InstanceID, r.NetAddress.String, err)
	}
	n.Tenant, n.MAC, n.Address = r.TenantID, MAC(r.InstanceID), addr
	switch r.Network {
	case Egress:
		n.Gateway = addr.Masked().Addr().Next()
		p := Decode(r.EgressPolicy)
		for _, e := range p.Allow {
			if pr, err := netip.ParsePrefix(e); err == nil {
				n.Policy.Allow = append(n.Policy.Allow, pr)
			} else {
				n.Policy.AllowDomains = append(n.Policy.AllowDomains, e)
			}
		}
		for _, e := range p.Deny {
			pr, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("vmnet: instance %s: deny entry %q: %w", r.InstanceID, e, err)
			}
			n.Policy.Deny = append(n.Policy.Deny, pr)
		}
	case Private:
		n.NetworkID = PrivateNetworkID(r.PoolID, r.TenantID)
	}
	return n, nil
}

// VNI is the VXLAN network identifier of the private network whose
// subnet holds addr (a VM's address): the subnet's first 24 bits. A
// tenant's subnet is its own in the pool (vm_subnets) and SubnetBits is
// at most 24, so no two private networks of a pool share a VNI (a hash of
// the network id could collide, and a collision would join two tenants'
// networks between nodes).
func VNI(addr netip.Prefix) uint32 {
	a := addr.Masked().Addr().As4()
	return uint32(a[0])<<16 | uint32(a[1])<<8 | uint32(a[2])
}

// PrivateNetworkID names a tenant's private network of a pool: the key of
// its overlay in node specs (agentproto.NetworkSpec).
func PrivateNetworkID(pool, tenant string) string {
	h := sha256.Sum256([]byte(pool + "\x00" + tenant))
	return fmt.Sprintf("pnet_%x", h[:10])
}

// Output is what the API shows of row's network.
func Output(r db.Instance) (mode string, address, mac *string, egress api.EgressPolicy) {
	mode = r.Network
	if mode == "" {
		mode = None
	}
	if r.NetAddress.Valid {
		a, m := r.NetAddress.String, MAC(r.InstanceID)
		address, mac = &a, &m
	}
	return mode, address, mac, Decode(r.EgressPolicy)
}
