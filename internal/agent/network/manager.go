// Package network is compute-agent's host side of VM networking: a tap
// per VM on a bridge per mode and tenant (netlink), and the node's
// filtering, source NAT, anti-spoofing, egress policy and byte counters
// in the agent's own nftables tables. See docs/networking.md.
package network

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Config is the operator's choice for a node (compute-agent's flags or its
// pool's settings).
type Config struct {
	// ID is this agent's four-character id (AgentID of the node id):
	// every interface and table the manager makes carries it.
	ID string
	// Uplink is the interface egress traffic leaves by (source NAT).
	Uplink string
	// EgressPool and PrivatePool hold every VM address of their mode on
	// this node; no VM reaches either pool through the node.
	EgressPool, PrivatePool netip.Prefix
	// AllowPrivate are private ranges (10/8, 172.16/12, 192.168/16,
	// 100.64/10) egress VMs of this pool may reach.
	AllowPrivate []netip.Prefix
	// Deny are further addresses no VM reaches: the node's services on
	// other hosts (API, gateways, database). The node's own addresses are
	// always out of reach.
	Deny []netip.Prefix
	// Resolvers are DNS servers VMs may reach on port 53 even when the
	// deny set covers them (a resolver on the node or in a private range).
	Resolvers []netip.Addr
	// BandwidthMbps caps each VM's traffic each way (megabits per
	// second); 0 is no cap.
	BandwidthMbps int
	// MTU of taps whose VM names none; 0 is 1500.
	MTU int
	// NetNS is the path of the network namespace to work in (tests);
	// "" is the agent's own.
	NetNS string
	// Domains enforces policies' domain entries; nil refuses them.
	Domains DomainFilter
	// Underlay is the node's IPv4 address on the pool's own connection:
	// its private networks' VXLAN packets leave from it and the other
	// nodes' arrive at it (overlay.go). Invalid: no overlay, a private
	// network stays within the node.
	Underlay netip.Addr
	// VXLANPort is the overlay's UDP port (0: DefaultVXLANPort); with an
	// underlay the node drops packets to it from anything but a peer.
	VXLANPort int
}

// Port is what a VM's runtime needs to plug a VM in: qemu's
// -netdev tap,ifname=<Tap>,script=no,downscript=no
// -device virtio-net-pci,mac=<MAC>.
type Port struct {
	Tap string
	MAC string
}

// Manager wires VMs' networks on one node. Its methods are safe for
// concurrent use.
type Manager struct {
	cfg   Config
	names names
	ns    netns.NsHandle // -1: the agent's own

	mu    sync.Mutex
	ready bool           // Cleanup installed the base ruleset
	vms   map[string]*VM // by id: what Add applied
	// overlays are the private networks' overlays by network id
	// (SetOverlays); privateMTU and underlayIndex come from the underlay's
	// interface (findUnderlay, at Cleanup).
	overlays      map[string]Overlay
	privateMTU    int
	underlayIndex int
}

// New checks cfg; it changes nothing on the node (Cleanup does).
func New(cfg Config) (*Manager, error) {
	if err := checkID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.Uplink == "" || len(cfg.Uplink) > 15 {
		return nil, fmt.Errorf("network: uplink %q is not an interface name", cfg.Uplink)
	}
	for _, p := range []netip.Prefix{cfg.EgressPool, cfg.PrivatePool} {
		if !p.IsValid() || !p.Addr().Is4() || p != p.Masked() {
			return nil, fmt.Errorf("network: pool %v is not an IPv4 prefix", p)
		}
	}
	if cfg.EgressPool.Overlaps(cfg.PrivatePool) {
		return nil, errors.New("network: the egress and private pools overlap")
	}
	for _, p := range append(append([]netip.Prefix(nil), cfg.AllowPrivate...), cfg.Deny...) {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, fmt.Errorf("network: %v is not an IPv4 prefix", p)
		}
	}
	if cfg.BandwidthMbps < 0 {
		return nil, errors.New("network: a negative bandwidth cap")
	}
	if err := cfg.checkOverlay(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, names: names{cfg.ID}, ns: -1, vms: map[string]*VM{}}
	if cfg.NetNS != "" {
		h, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
		m.ns = h
	}
	return m, nil
}

// Close lets go of the namespace handle.
func (m *Manager) Close() error {
	if m.ns >= 0 {
		return m.ns.Close()
	}
	return nil
}

func (m *Manager) rateBytes() uint64 { return uint64(m.cfg.BandwidthMbps) * 1_000_000 / 8 }

// do runs f in the manager's namespace: on a thread of its own that is
// thrown away afterwards, so no goroutine ever runs in the wrong one.
func (m *Manager) do(f func() error) error {
	if m.ns < 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(m.ns); err != nil {
			errc <- fmt.Errorf("network: enter namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

func (m *Manager) conn() (*nftables.Conn, error) {
	if m.ns >= 0 {
		return nftables.New(nftables.WithNetNSFd(int(m.ns)))
	}
	return nftables.New()
}

func sysctl(path, value string) error {
	return os.WriteFile("/proc/sys/"+path, []byte(value), 0o644)
}

// disableIPv6 turns IPv6 off on an interface the manager made (a bridge,
// a tap, a VXLAN port; called in the manager's namespace): the node holds
// no IPv6 address (not even link-local) where VMs are, sends no router or
// neighbour advertisements there and takes no IPv6 packet in from them.
// VMs have IPv4 only; the ports' filters drop their IPv6 as well
// (docs/networking.md, "IPv6"). A kernel without IPv6 has nothing to turn
// off; any other failure is an error, never ignored.
func disableIPv6(name string) error {
	err := sysctl("net/ipv6/conf/"+name+"/disable_ipv6", "1")
	if err != nil && errors.Is(err, os.ErrNotExist) {
		if _, statErr := os.Stat("/proc/sys/net/ipv6"); errors.Is(statErr, os.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("network: turn IPv6 off on %s: %w", name, err)
	}
	return nil
}

// Cleanup runs once when the agent starts, before any Add: it removes
// every interface and rule this agent made (its id in their names) except
// the taps of VMs keep names (VMs still running, which the agent adopts
// and Adds again), and installs the base ruleset. Until a kept VM is
// Added again its packets are dropped. Counters of kept VMs carry on.
func (m *Manager) Cleanup(keep func(vmID string) bool) error {
	if keep == nil {
		keep = func(string) bool { return false }
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.do(func() error {
		if err := sysctl("net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
		if err := m.findUnderlay(); err != nil {
			return err
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		keptBridges := map[int]bool{}
		var bridges []netlink.Link
		for _, l := range links {
			name := l.Attrs().Name
			switch {
			case !strings.HasPrefix(name, m.names.ifPrefix()):
			case strings.HasPrefix(name, m.names.tapPrefix()):
				if id, ok := strings.CutPrefix(l.Attrs().Alias, tapAliasPrefix); ok && keep(id) && name == m.names.tap(id) {
					keptBridges[l.Attrs().MasterIndex] = true
					continue
				}
				if err := netlink.LinkDel(l); err != nil {
					return fmt.Errorf("network: remove %s: %w", name, err)
				}
			default:
				bridges = append(bridges, l)
			}
		}
		for _, l := range bridges {
			if !keptBridges[l.Attrs().Index] {
				if err := netlink.LinkDel(l); err != nil {
					return fmt.Errorf("network: remove %s: %w", l.Attrs().Name, err)
				}
			}
		}

		c, err := m.conn()
		if err != nil {
			return err
		}
		inet, bridge := m.tables()
		// Kept VMs' counters are carried into the new table.
		carried := map[string]*nftables.NamedObj{}
		tables, err := c.ListTables()
		if err != nil {
			return err
		}
		for _, t := range tables {
			if t.Name != inet.Name || (t.Family != inet.Family && t.Family != bridge.Family) {
				continue
			}
			if t.Family == inet.Family {
				objs, err := c.GetNamedObjects(inet)
				if err != nil {
					return err
				}
				for _, o := range objs {
					if no, ok := o.(*nftables.NamedObj); ok && no.Type == nftables.ObjTypeCounter {
						carried[no.Name] = no
					}
				}
			}
			c.DelTable(t)
		}
		b, err := m.addBase(c)
		if err != nil {
			return err
		}
		for _, l := range links {
			id, ok := strings.CutPrefix(l.Attrs().Alias, tapAliasPrefix)
			if !ok || !keep(id) || l.Attrs().Name != m.names.tap(id) {
				continue
			}
			for _, name := range []string{txCounter(vmKey(id)), rxCounter(vmKey(id))} {
				if o := carried[name]; o != nil {
					c.AddObj(&nftables.NamedObj{Table: b.inet, Name: name, Type: nftables.ObjTypeCounter, Obj: o.Obj})
				}
			}
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("network: install base ruleset: %w", err)
		}
		m.vms = map[string]*VM{}
		m.ready = true
		return nil
	})
}

// Add wires a VM's network and returns the tap its runtime plugs in
// (zero for mode none). Adding a VM again (a kept VM after an agent
// restart, or a changed spec) replaces its rules and keeps its tap and
// counters.
func (m *Manager) Add(vm VM) (Port, error) {
	if err := vm.Validate(); err != nil {
		return Port{}, err
	}
	if vm.Mode == ModeNone {
		return Port{}, nil
	}
	pool := m.cfg.EgressPool
	if vm.Mode == ModePrivate {
		pool = m.cfg.PrivatePool
	}
	if !pool.Contains(vm.Address.Addr()) || vm.Address.Bits() < pool.Bits() {
		return Port{}, fmt.Errorf("network: %v is not inside the %s pool %v", vm.Address, vm.Mode, pool)
	}
	if len(vm.Policy.AllowDomains)+len(vm.Policy.DenyDomains) > 0 && m.cfg.Domains == nil {
		return Port{}, ErrDomains
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return Port{}, errors.New("network: Cleanup has not run")
	}
	if vm.Mode == ModePrivate && vm.MTU > m.privateMTU {
		return Port{}, fmt.Errorf("network: mtu %d is above the private networks' %d (the underlay's less VXLAN's %d bytes)", vm.MTU, m.privateMTU, VXLANOverhead)
	}
	tap := m.names.tap(vm.ID)
	err := m.do(func() error {
		br, err := m.ensureBridge(&vm)
		if err != nil {
			return err
		}
		if vm.Mode == ModePrivate {
			if err := m.ensureOverlay(vm.NetworkID, vm.Tenant, br); err != nil {
				return err
			}
		}
		if err := m.ensureTap(&vm, tap, br); err != nil {
			return err
		}
		c, err := m.conn()
		if err != nil {
			return err
		}
		b := m.existingBase()
		// A VM added again: its old rules go in the same transaction.
		if err := m.queueRemoveNFT(c, b, vm.ID, false); err != nil {
			return err
		}
		if err := m.addVM(c, b, &vm, tap); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("network: rules for %s: %w", vm.ID, err)
		}
		return nil
	})
	if err != nil {
		return Port{}, err
	}
	if err := m.setFilter(vm); err != nil {
		return Port{}, err
	}
	v := vm
	m.vms[vm.ID] = &v
	return Port{Tap: tap, MAC: vm.MAC}, nil
}

// ensureBridge returns the tenant's bridge for vm's mode, made when
// missing: an egress bridge holds the VM's gateway address; a private one
// none (the node is no member of a private network).
func (m *Manager) ensureBridge(vm *VM) (netlink.Link, error) {
	name := m.names.bridge(vm.Mode, vm.Tenant)
	br, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, err
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return nil, fmt.Errorf("network: bridge %s: %w", name, err)
		}
		if br, err = netlink.LinkByName(name); err != nil {
			return nil, err
		}
		if err := disableIPv6(name); err != nil {
			return nil, err
		}
		if err := netlink.LinkSetAlias(br, bridgeAliasPrefix+string(vm.Mode)+" "+vm.Tenant); err != nil {
			return nil, err
		}
	} else if br.Attrs().Alias != bridgeAliasPrefix+string(vm.Mode)+" "+vm.Tenant {
		return nil, fmt.Errorf("network: bridge %s belongs to %q", name, br.Attrs().Alias)
	}
	if vm.Mode == ModeEgress {
		gw := netip.PrefixFrom(vm.Gateway, vm.Address.Bits())
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return nil, err
		}
		has := false
		for _, a := range addrs {
			p, _ := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			got := netip.PrefixFrom(p, ones)
			switch {
			case a.LinkIndex == br.Attrs().Index && got == gw:
				has = true
			case got.Overlaps(gw):
				return nil, fmt.Errorf("network: %v on %s overlaps %s's subnet %v", got, linkName(a.LinkIndex), vm.Tenant, gw.Masked())
			}
		}
		if !has {
			if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: netipNet(gw)}); err != nil {
				return nil, fmt.Errorf("network: gateway %v on %s: %w", gw, name, err)
			}
		}
	}
	return br, netlink.LinkSetUp(br)
}

func linkName(index int) string {
	if l, err := netlink.LinkByIndex(index); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprint("link ", index)
}

// ensureTap makes the VM's persistent tap on br (qemu opens it by name).
func (m *Manager) ensureTap(vm *VM, name string, br netlink.Link) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return err
		}
		t := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP,
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_ONE_QUEUE | netlink.TUNTAP_VNET_HDR}
		if err := netlink.LinkAdd(t); err != nil {
			return fmt.Errorf("network: tap %s: %w", name, err)
		}
		for _, f := range t.Fds { // persistent: qemu attaches by name
			_ = f.Close()
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return err
		}
		if err := disableIPv6(name); err != nil {
			return err
		}
	}
	mtu := vm.MTU
	if mtu == 0 {
		mtu = m.defaultMTU()
		if vm.Mode == ModePrivate {
			mtu = m.privateMTU
		}
	}
	for _, step := range []func() error{
		func() error { return netlink.LinkSetAlias(l, tapAliasPrefix+vm.ID) },
		func() error { return netlink.LinkSetMTU(l, mtu) },
		func() error { return netlink.LinkSetMaster(l, br) },
		// Egress VMs of one tenant do not reach each other either.
		func() error { return netlink.LinkSetIsolated(l, vm.Mode == ModeEgress) },
		func() error { return netlink.LinkSetUp(l) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("network: tap %s: %w", name, err)
		}
	}
	return nil
}

// SetPolicy replaces a running (or paused) VM's egress policy in one
// transaction: it holds for the next packet, open connections included.
func (m *Manager) SetPolicy(vmID string, p Policy) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	vm, ok := m.vms[vmID]
	if !ok {
		return fmt.Errorf("network: no VM %s", vmID)
	}
	next := *vm
	next.Policy = p
	if err := next.Validate(); err != nil {
		return err
	}
	if len(p.AllowDomains)+len(p.DenyDomains) > 0 && m.cfg.Domains == nil {
		return ErrDomains
	}
	if next.Mode == ModeEgress {
		err := m.do(func() error {
			c, err := m.conn()
			if err != nil {
				return err
			}
			b := m.existingBase()
			if err := m.addPolicy(c, b, &next, true); err != nil {
				return err
			}
			if m.cfg.Domains != nil {
				if err := m.setRedirect(c, b, vm, &next); err != nil {
					return err
				}
			}
			return c.Flush()
		})
		if err != nil {
			return fmt.Errorf("network: policy of %s: %w", vmID, err)
		}
	}
	if err := m.setFilter(next); err != nil {
		return err
	}
	*vm = next
	return nil
}

// Remove deletes everything Add made for a VM: its rules, counters, tap,
// and its bridge when no other VM is on it. Removing an unknown VM is no
// error (it may have been removed before the agent restarted).
func (m *Manager) Remove(vmID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	tap := m.names.tap(vmID)
	err := m.do(func() error {
		c, err := m.conn()
		if err != nil {
			return err
		}
		if err := m.queueRemoveNFT(c, m.existingBase(), vmID, true); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("network: remove rules of %s: %w", vmID, err)
		}
		l, err := netlink.LinkByName(tap)
		if err != nil {
			return nil
		}
		master := l.Attrs().MasterIndex
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("network: remove %s: %w", tap, err)
		}
		return m.removeBridgeIfEmpty(master)
	})
	if err != nil {
		return err
	}
	delete(m.vms, vmID)
	if m.cfg.Domains != nil {
		return m.cfg.Domains.Remove(vmID)
	}
	return nil
}

func (m *Manager) removeBridgeIfEmpty(index int) error {
	if index == 0 {
		return nil
	}
	br, err := netlink.LinkByIndex(index)
	if err != nil || !strings.HasPrefix(br.Attrs().Name, m.names.ifPrefix()) {
		return nil
	}
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	var vxlans []netlink.Link // a private bridge's overlay port goes with it
	for _, l := range links {
		if l.Attrs().MasterIndex != index {
			continue
		}
		if !m.names.isVXLAN(l.Attrs().Name) {
			return nil
		}
		vxlans = append(vxlans, l)
	}
	for _, l := range vxlans {
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
	}
	return netlink.LinkDel(br)
}

// queueRemoveNFT queues the deletion of whatever exists of a VM's
// objects (an nftables transaction fails on a missing one, so it looks
// first). The maps' keys are the VM's tap and its address as last Added
// (the base ruleset is new since the agent started, so every element in
// it was Added by this manager).
func (m *Manager) queueRemoveNFT(c *nftables.Conn, b *base, vmID string, counters bool) error {
	key, tap := vmKey(vmID), m.names.tap(vmID)
	keys := map[*nftables.Set][]byte{b.ports: ifnameKey(tap), b.outPorts: ifnameKey(tap)}
	if old := m.vms[vmID]; old != nil && old.Mode == ModeEgress {
		keys[b.fromVM] = old.Address.Addr().AsSlice()
		keys[b.toVM] = old.Address.Addr().AsSlice()
		if m.cfg.Domains != nil {
			keys[b.domains] = old.Address.Addr().AsSlice()
			keys[b.proxied] = old.Address.Addr().AsSlice()
		}
	}
	for mp, k := range keys {
		els, err := c.GetSetElements(mp)
		if err != nil {
			return err
		}
		for _, e := range els {
			if bytes.Equal(e.Key, k) {
				if err := c.SetDeleteElements(mp, []nftables.SetElement{{Key: k}}); err != nil {
					return err
				}
			}
		}
	}
	for _, t := range []*nftables.Table{b.inet, b.bridge} {
		chains, err := c.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Table.Name == t.Name && strings.HasSuffix(ch.Name, "_"+key) {
				c.FlushChain(ch)
				c.DelChain(ch)
			}
		}
	}
	sets, err := c.GetSets(b.inet)
	if err != nil {
		return err
	}
	for _, s := range sets {
		if s.Name == allowSet(key) || s.Name == denySet(key) {
			c.DelSet(s)
		}
	}
	if counters {
		objs, err := c.GetNamedObjects(b.inet)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if no, ok := o.(*nftables.NamedObj); ok && (no.Name == txCounter(key) || no.Name == rxCounter(key)) {
				c.DeleteObject(no)
			}
		}
	}
	return nil
}

// Counters reads every Added VM's counters, by VM id.
func (m *Manager) Counters() (map[string]Counters, error) {
	m.mu.Lock()
	byKey := map[string]string{}
	for id := range m.vms {
		byKey[vmKey(id)] = id
	}
	m.mu.Unlock()
	out := map[string]Counters{}
	err := m.do(func() error {
		c, err := m.conn()
		if err != nil {
			return err
		}
		inet, _ := m.tables()
		objs, err := c.GetNamedObjects(inet)
		if err != nil {
			return err
		}
		for _, o := range objs {
			no, ok := o.(*nftables.NamedObj)
			if !ok || no.Type != nftables.ObjTypeCounter {
				continue
			}
			ctr, ok := no.Obj.(*expr.Counter)
			dir, key, _ := strings.Cut(no.Name, "_")
			id, known := byKey[key]
			if !ok || !known {
				continue
			}
			v := out[id]
			if dir == "tx" {
				v.TxBytes, v.TxPackets = ctr.Bytes, ctr.Packets
			} else {
				v.RxBytes, v.RxPackets = ctr.Bytes, ctr.Packets
			}
			out[id] = v
		}
		return nil
	})
	return out, err
}
