package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"computeplane/internal/agentproto"
)

// The private overlay: a tenant's private bridge on this node gets a
// VXLAN port (cp<id>x…) whose VNI is its network's (the control plane
// allocates it, unique in the pool) and whose forwarding database holds
// one all-zero entry per peer node, so that broadcast and unknown
// unicast frames are copied to each peer over the nodes' own
// connection (no multicast), and the peers' VMs' MACs are learned from
// what arrives. VXLAN packets reach the node only from a peer of some
// network (an nftables input rule on the overlay's UDP port).

// Overlay is a private network's overlay as the node spec gives it.
type Overlay = agentproto.NetworkSpec

// DefaultVXLANPort is the overlay's UDP port (IANA's VXLAN port).
const DefaultVXLANPort = 4789

// VXLANOverhead is what VXLAN adds to each frame over IPv4: outer IPv4
// (20), UDP (8), VXLAN (8) and the inner Ethernet header (14). A private
// VM's MTU is the underlay's less this (1450 on a 1500 underlay).
const VXLANOverhead = 50

const setOverlayPeers = "overlay4" // the underlay addresses of every overlay's peers

var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

func (c Config) vxlanPort() int {
	if c.VXLANPort == 0 {
		return DefaultVXLANPort
	}
	return c.VXLANPort
}

func (c Config) checkOverlay() error {
	if c.Underlay.IsValid() && (!c.Underlay.Is4() || c.Underlay.IsUnspecified() || c.Underlay.IsLoopback()) {
		return fmt.Errorf("network: underlay %v is not a unicast IPv4 address", c.Underlay)
	}
	if c.VXLANPort < 0 || c.VXLANPort > 65535 {
		return fmt.Errorf("network: vxlan port %d is outside 1..65535", c.VXLANPort)
	}
	return nil
}

func (n names) vxlan(tenant string) string {
	return n.ifPrefix() + "x" + hash(string(ModePrivate)+"/"+tenant, 6)
}

// findUnderlay looks up the interface holding the underlay address (in
// the manager's namespace) and derives the private networks' MTU from
// it. Without an underlay the private MTU is the node's.
func (m *Manager) findUnderlay() error {
	m.privateMTU = m.defaultMTU()
	m.underlayIndex = 0
	if !m.cfg.Underlay.IsValid() {
		return nil
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == m.cfg.Underlay {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return err
			}
			m.underlayIndex = a.LinkIndex
			m.privateMTU = min(m.privateMTU, l.Attrs().MTU-VXLANOverhead)
			return nil
		}
	}
	return fmt.Errorf("network: no interface of the node holds the underlay address %v", m.cfg.Underlay)
}

func (m *Manager) defaultMTU() int {
	if m.cfg.MTU > 0 {
		return m.cfg.MTU
	}
	return 1500
}

// PrivateMTU is the MTU of private VMs that name none: the underlay's
// less VXLANOverhead, at most the node's MTU. Known once Cleanup ran.
func (m *Manager) PrivateMTU() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.privateMTU == 0 {
		return m.defaultMTU()
	}
	return m.privateMTU
}

// addOverlayBase queues the overlay's part of the base ruleset: the set of
// peers and, with an underlay, the input rule that drops VXLAN packets
// from anywhere else. Without an underlay the agent leaves the port alone
// (other software of the host may use it).
func (m *Manager) addOverlayBase(c *nftables.Conn, b *base) error {
	peers := &nftables.Set{Table: b.inet, Name: setOverlayPeers, KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(peers, nil); err != nil {
		return err
	}
	if !m.cfg.Underlay.IsValid() {
		return nil
	}
	c.AddRule(&nftables.Rule{Table: b.inet, Chain: b.input, Exprs: append(ipv4Only(),
		load(expr.MetaKeyL4PROTO), eq([]byte{unix.IPPROTO_UDP}),
		payload(expr.PayloadBaseTransportHeader, 2, 2), eq(binaryutil.BigEndian.PutUint16(uint16(m.cfg.vxlanPort()))),
		ipSaddr(), notIn(peers), verdict(expr.VerdictDrop))})
	return nil
}

// SetOverlays gives the node's private networks and their peers (the
// spec's Networks): each private bridge of a listed network gets its
// VXLAN port towards exactly those peers; a bridge of a network not
// listed loses its port (its VMs reach only this node's). Networks whose
// first VM is Added later get their port then. Without an underlay
// (Config.Underlay) there is no overlay and only the list is kept.
func (m *Manager) SetOverlays(nets []Overlay) error {
	want := make(map[string]Overlay, len(nets))
	for _, n := range nets {
		if n.ID == "" || n.VNI == 0 || n.VNI > agentproto.MaxVNI {
			return fmt.Errorf("network: overlay %q with vni %d", n.ID, n.VNI)
		}
		for _, p := range n.Peers {
			if !p.Is4() {
				return fmt.Errorf("network: overlay %s: peer %v is not IPv4", n.ID, p)
			}
		}
		want[n.ID] = n
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return errors.New("network: Cleanup has not run")
	}
	m.overlays = want
	if !m.cfg.Underlay.IsValid() {
		return nil
	}
	return m.do(func() error {
		// The private bridges of this node: tenant -> network, from the
		// VMs Added.
		bridges := map[string]string{}
		for _, vm := range m.vms {
			if vm.Mode == ModePrivate {
				bridges[vm.Tenant] = vm.NetworkID
			}
		}
		for tenant, id := range bridges {
			br, err := netlink.LinkByName(m.names.bridge(ModePrivate, tenant))
			if err != nil {
				return fmt.Errorf("network: private bridge of %s: %w", tenant, err)
			}
			if err := m.ensureOverlay(id, tenant, br); err != nil {
				return err
			}
		}
		return m.setPeers()
	})
}

// ensureOverlay makes, updates or removes (network not listed) the VXLAN
// port of a tenant's private bridge (in the manager's namespace, m.mu
// held).
func (m *Manager) ensureOverlay(networkID, tenant string, br netlink.Link) error {
	if !m.cfg.Underlay.IsValid() {
		return nil
	}
	name := m.names.vxlan(tenant)
	ov, listed := m.overlays[networkID]
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case err != nil && !errors.As(err, &nf):
		return err
	case err == nil:
		vx, ok := l.(*netlink.Vxlan)
		same := ok && listed && vx.VxlanId == int(ov.VNI) && vx.Port == m.cfg.vxlanPort() &&
			vx.SrcAddr.Equal(m.cfg.Underlay.AsSlice()) && vx.MasterIndex == br.Attrs().Index
		if !same {
			if err := netlink.LinkDel(l); err != nil {
				return fmt.Errorf("network: remove %s: %w", name, err)
			}
			l = nil
		}
	default:
		l = nil
	}
	if !listed {
		return nil
	}
	if l == nil {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: m.privateMTU},
			VxlanId: int(ov.VNI), SrcAddr: m.cfg.Underlay.AsSlice(), VtepDevIndex: m.underlayIndex,
			Port: m.cfg.vxlanPort(), Learning: true}
		if err := netlink.LinkAdd(vx); err != nil {
			return fmt.Errorf("network: vxlan %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return err
		}
		if err := disableIPv6(name); err != nil {
			return err
		}
		for _, step := range []func() error{
			func() error { return netlink.LinkSetAlias(l, vxlanAliasPrefix+networkID) },
			func() error { return netlink.LinkSetMaster(l, br) },
			func() error { return netlink.LinkSetUp(l) },
		} {
			if err := step(); err != nil {
				return fmt.Errorf("network: vxlan %s: %w", name, err)
			}
		}
	}
	return m.setFDB(l, ov.Peers)
}

// setFDB makes the VXLAN port's forwarding database name exactly peers:
// an all-zero entry each (flooding), and no entry, learned or not, of a
// node that is no longer one.
func (m *Manager) setFDB(l netlink.Link, peers []netip.Addr) error {
	idx := l.Attrs().Index
	have, err := netlink.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return err
	}
	flooded := map[netip.Addr]bool{}
	for _, n := range have {
		ip, ok := netip.AddrFromSlice(n.IP.To4())
		if !ok || n.LinkIndex != idx {
			continue
		}
		if !slices.Contains(peers, ip) || ip == m.cfg.Underlay {
			if err := netlink.NeighDel(&n); err != nil {
				return fmt.Errorf("network: forget peer %v on %s: %w", ip, l.Attrs().Name, err)
			}
			continue
		}
		if n.HardwareAddr.String() == zeroMAC.String() {
			flooded[ip] = true
		}
	}
	for _, p := range peers {
		if flooded[p] || p == m.cfg.Underlay {
			continue
		}
		err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, IP: p.AsSlice(), HardwareAddr: zeroMAC})
		if err != nil {
			return fmt.Errorf("network: peer %v on %s: %w", p, l.Attrs().Name, err)
		}
	}
	return nil
}

// setPeers makes the nftables set of peers the union of every listed
// overlay's (m.mu held, in the namespace).
func (m *Manager) setPeers() error {
	var all []netip.Addr
	for _, ov := range m.overlays {
		for _, p := range ov.Peers {
			if p != m.cfg.Underlay && !slices.Contains(all, p) {
				all = append(all, p)
			}
		}
	}
	c, err := m.conn()
	if err != nil {
		return err
	}
	inet, _ := m.tables()
	set := &nftables.Set{Table: inet, Name: setOverlayPeers, KeyType: nftables.TypeIPAddr}
	c.FlushSet(set)
	els := make([]nftables.SetElement, len(all))
	for i, p := range all {
		els[i] = nftables.SetElement{Key: p.AsSlice()}
	}
	if err := c.SetAddElements(set, els); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: overlay peers: %w", err)
	}
	return nil
}

// isVXLAN says whether a link is one of this agent's VXLAN ports.
func (n names) isVXLAN(name string) bool { return strings.HasPrefix(name, n.ifPrefix()+"x") }

const vxlanAliasPrefix = "computeplane overlay "
