package network

import (
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The platform deny set: under every mode and above every VM's policy.
var (
	// hardDeny is never reachable from a VM, whatever the operator allows.
	hardDeny = mustPrefixes("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
	// privateRanges are denied unless the operator allows a range for the
	// pool (Config.AllowPrivate).
	privateRanges = mustPrefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Set and chain names in the agent's tables.
const (
	setHard      = "hard4"      // hardDeny + pools + Config.Deny
	setPrivate   = "private4"   // privateRanges
	setAllowPriv = "allowpriv4" // Config.AllowPrivate
	setPool      = "pool4"      // the egress pool (source NAT)
	setResolvers = "resolvers4" // Config.Resolvers (port 53 only)
	mapFromVM    = "fromvm4"    // VM address -> jump vm_<key>
	mapToVM      = "tovm4"      // VM address -> jump rx_<key>
	mapPorts     = "ports"      // tap -> jump port_<key> (bridge)
	mapOutPorts  = "outports"   // tap -> jump out_<key> (bridge)
)

func vmChain(key string) string    { return "vm_" + key }
func rxChain(key string) string    { return "rx_" + key }
func portChain(key string) string  { return "port_" + key }
func outChain(key string) string   { return "out_" + key }
func allowSet(key string) string   { return "allow_" + key }
func denySet(key string) string    { return "deny_" + key }
func txCounter(key string) string  { return "tx_" + key }
func rxCounter(key string) string  { return "rx_" + key }
func ifnameKey(name string) []byte { b := make([]byte, 16); copy(b, name); return b }

// Expression helpers: register 1 holds what is compared.
func load(key expr.MetaKey) expr.Any { return &expr.Meta{Key: key, Register: 1} }
func eq(data []byte) expr.Any        { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }
func neq(data []byte) expr.Any       { return &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data} }
func payload(base expr.PayloadBase, off, n uint32) expr.Any {
	return &expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: n}
}
func ipSaddr() expr.Any { return payload(expr.PayloadBaseNetworkHeader, 12, 4) }
func ipDaddr() expr.Any { return payload(expr.PayloadBaseNetworkHeader, 16, 4) }
func in(set *nftables.Set) expr.Any {
	return &expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID}
}
func notIn(set *nftables.Set) expr.Any {
	return &expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true}
}
func vmap(set *nftables.Set) expr.Any {
	return &expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, DestRegister: 0, IsDestRegSet: true}
}
func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }
func jump(chain string) *expr.Verdict     { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }
func counter(name string) expr.Any {
	return &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}
}
func ipv4Only() []expr.Any {
	return []expr.Any{load(expr.MetaKeyNFPROTO), eq([]byte{unix.NFPROTO_IPV4})}
}

// base is the agent's ruleset without any VM: a VM that no Add wired (an
// unknown tap or source address) gets no packet through.
type base struct {
	inet, bridge                                      *nftables.Table
	hard, private, allowPriv, pool, resolvers         *nftables.Set
	fromVM, toVM, ports, outPorts                     *nftables.Set
	domains, proxied                                  *nftables.Set // with a DomainFilter only
	forward, input, fromVMChain, toVMChain, pre, post *nftables.Chain
}

func (m *Manager) tables() (*nftables.Table, *nftables.Table) {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: m.names.table()},
		&nftables.Table{Family: nftables.TableFamilyBridge, Name: m.names.table()}
}

// addBase queues the base ruleset on c.
func (m *Manager) addBase(c *nftables.Conn) (*base, error) {
	b := &base{}
	b.inet, b.bridge = m.tables()
	c.AddTable(b.inet)
	c.AddTable(b.bridge)

	interval := func(name string, ps []netip.Prefix) (*nftables.Set, error) {
		s := &nftables.Set{Table: b.inet, Name: name, KeyType: nftables.TypeIPAddr, Interval: true}
		return s, c.AddSet(s, intervalElements(ps))
	}
	var err error
	hard := append(append(append([]netip.Prefix(nil), hardDeny...), m.cfg.EgressPool, m.cfg.PrivatePool), m.cfg.Deny...)
	if b.hard, err = interval(setHard, hard); err != nil {
		return nil, err
	}
	if b.private, err = interval(setPrivate, privateRanges); err != nil {
		return nil, err
	}
	if b.allowPriv, err = interval(setAllowPriv, m.cfg.AllowPrivate); err != nil {
		return nil, err
	}
	if b.pool, err = interval(setPool, []netip.Prefix{m.cfg.EgressPool}); err != nil {
		return nil, err
	}
	var res []netip.Prefix
	for _, a := range m.cfg.Resolvers {
		res = append(res, netip.PrefixFrom(a, 32))
	}
	if b.resolvers, err = interval(setResolvers, res); err != nil {
		return nil, err
	}
	verdictMap := func(t *nftables.Table, name string, key nftables.SetDatatype) (*nftables.Set, error) {
		s := &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: key, DataType: nftables.TypeVerdict}
		return s, c.AddSet(s, nil)
	}
	if b.fromVM, err = verdictMap(b.inet, mapFromVM, nftables.TypeIPAddr); err != nil {
		return nil, err
	}
	if b.toVM, err = verdictMap(b.inet, mapToVM, nftables.TypeIPAddr); err != nil {
		return nil, err
	}
	if b.ports, err = verdictMap(b.bridge, mapPorts, nftables.TypeIFName); err != nil {
		return nil, err
	}
	if b.outPorts, err = verdictMap(b.bridge, mapOutPorts, nftables.TypeIFName); err != nil {
		return nil, err
	}

	accept := nftables.ChainPolicyAccept
	ours := []byte(m.names.ifPrefix()) // a prefix match: every interface of this agent
	rule := func(ch *nftables.Chain, ex ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: ex})
	}

	b.fromVMChain = c.AddChain(&nftables.Chain{Table: b.inet, Name: "from_vm"})
	b.toVMChain = c.AddChain(&nftables.Chain{Table: b.inet, Name: "to_vm"})
	b.forward = c.AddChain(&nftables.Chain{Table: b.inet, Name: "forward", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Frames bridged between a private network's ports pass through here
	// too where br_netfilter is loaded (bridge-nf-call-iptables, Docker
	// hosts): the node routes nothing of a private bridge (it holds no
	// address), so private to private is always a bridged frame.
	private := []byte(m.names.ifPrefix() + "p")
	rule(b.forward, load(expr.MetaKeyIIFNAME), eq(private), load(expr.MetaKeyOIFNAME), eq(private), verdict(expr.VerdictAccept))
	rule(b.forward, load(expr.MetaKeyIIFNAME), eq(ours), &expr.Verdict{Kind: expr.VerdictJump, Chain: b.fromVMChain.Name})
	rule(b.forward, load(expr.MetaKeyOIFNAME), eq(ours), &expr.Verdict{Kind: expr.VerdictJump, Chain: b.toVMChain.Name})
	// From a VM: IPv4 from an address Add wired, to its own chain; the
	// rest (IPv6, private-mode VMs, spoofed sources) is dropped.
	rule(b.fromVMChain, append(ipv4Only(), ipSaddr(), vmap(b.fromVM))...)
	rule(b.fromVMChain, verdict(expr.VerdictDrop))
	// To a VM: replies only, nothing inbound.
	rule(b.toVMChain, &expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		neq(make([]byte, 4)), ipDaddr(), vmap(b.toVM))
	rule(b.toVMChain, verdict(expr.VerdictDrop))
	// The node itself: only the operator's resolvers on port 53 when
	// they are local; every other address and service of the node is out
	// of reach.
	b.input = c.AddChain(&nftables.Chain{Table: b.inet, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(b.input, append(append([]expr.Any{load(expr.MetaKeyIIFNAME), eq(ours)}, ipv4Only()...), ipDaddr(), in(b.resolvers),
			load(expr.MetaKeyL4PROTO), eq([]byte{proto}), payload(expr.PayloadBaseTransportHeader, 2, 2), eq(binaryutil.BigEndian.PutUint16(53)),
			verdict(expr.VerdictAccept))...)
	}
	if m.cfg.Domains != nil {
		if err := m.addDomainBase(c, b, ours); err != nil {
			return nil, err
		}
	}
	rule(b.input, load(expr.MetaKeyIIFNAME), eq(ours), verdict(expr.VerdictDrop))
	// Source NAT of the egress pool out of the uplink.
	nat := c.AddChain(&nftables.Chain{Table: b.inet, Name: "postrouting", Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	rule(nat, append(append([]expr.Any{load(expr.MetaKeyOIFNAME), eq(ifnameKey(m.cfg.Uplink))}, ipv4Only()...),
		ipSaddr(), in(b.pool), &expr.Masq{})...)

	// The bridge table: every frame from a tap goes through its port chain
	// (anti-spoofing, the VM's upload cap); a tap without one is dropped.
	taps := []byte(m.names.tapPrefix())
	b.pre = c.AddChain(&nftables.Chain{Table: b.bridge, Name: "prerouting", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-200), Policy: &accept})
	rule(b.pre, load(expr.MetaKeyIIFNAME), vmap(b.ports))
	rule(b.pre, load(expr.MetaKeyIIFNAME), eq(taps), verdict(expr.VerdictDrop))
	b.post = c.AddChain(&nftables.Chain{Table: b.bridge, Name: "postrouting", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(-200), Policy: &accept})
	rule(b.post, load(expr.MetaKeyOIFNAME), vmap(b.outPorts))
	if err := m.addOverlayBase(c, b); err != nil {
		return nil, err
	}
	return b, nil
}

// existingBase names the base objects of tables already installed.
func (m *Manager) existingBase() *base {
	b := &base{}
	b.inet, b.bridge = m.tables()
	set := func(t *nftables.Table, name string) *nftables.Set { return &nftables.Set{Table: t, Name: name} }
	b.hard, b.private, b.allowPriv = set(b.inet, setHard), set(b.inet, setPrivate), set(b.inet, setAllowPriv)
	b.pool, b.resolvers = set(b.inet, setPool), set(b.inet, setResolvers)
	b.fromVM, b.toVM = set(b.inet, mapFromVM), set(b.inet, mapToVM)
	b.ports, b.outPorts = set(b.bridge, mapPorts), set(b.bridge, mapOutPorts)
	if m.cfg.Domains != nil {
		b.domains, b.proxied = set(b.inet, mapDomains), set(b.inet, mapProxied)
	}
	return b
}

// addVM queues one VM's objects: its counters (kept when they exist),
// its policy sets and chains, and the map elements that send its
// packets there.
func (m *Manager) addVM(c *nftables.Conn, b *base, vm *VM, tap string) error {
	key := vmKey(vm.ID)
	for _, name := range []string{txCounter(key), rxCounter(key)} {
		c.AddObj(&nftables.NamedObj{Table: b.inet, Name: name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	}
	if vm.Mode == ModeEgress {
		if err := m.addPolicy(c, b, vm, false); err != nil {
			return err
		}
		rx := c.AddChain(&nftables.Chain{Table: b.inet, Name: rxChain(key)})
		c.AddRule(&nftables.Rule{Table: b.inet, Chain: rx, Exprs: []expr.Any{counter(rxCounter(key)), verdict(expr.VerdictAccept)}})
		addr := vm.Address.Addr().AsSlice()
		if err := c.SetAddElements(b.fromVM, []nftables.SetElement{{Key: addr, VerdictData: jump(vmChain(key))}}); err != nil {
			return err
		}
		if err := c.SetAddElements(b.toVM, []nftables.SetElement{{Key: addr, VerdictData: jump(rxChain(key))}}); err != nil {
			return err
		}
		if m.cfg.Domains != nil {
			if err := m.addDomainVM(c, b, vm); err != nil {
				return err
			}
		}
	}

	// Anti-spoofing on the VM's port: its MAC, its address, IPv4 and ARP
	// only.
	mac, _ := net.ParseMAC(vm.MAC)
	ip := vm.Address.Addr().AsSlice()
	port := c.AddChain(&nftables.Chain{Table: b.bridge, Name: portChain(key)})
	rule := func(ch *nftables.Chain, ex ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: b.bridge, Chain: ch, Exprs: ex})
	}
	drop := verdict(expr.VerdictDrop)
	rule(port, payload(expr.PayloadBaseLLHeader, 6, 6), neq(mac), drop)
	arp, ipv4 := binaryutil.BigEndian.PutUint16(unix.ETH_P_ARP), binaryutil.BigEndian.PutUint16(unix.ETH_P_IP)
	// ARP for IPv4 over Ethernet whose sender is this VM.
	rule(port, load(expr.MetaKeyPROTOCOL), eq(arp), payload(expr.PayloadBaseNetworkHeader, 0, 6), neq([]byte{0, 1, 8, 0, 6, 4}), drop)
	rule(port, load(expr.MetaKeyPROTOCOL), eq(arp), payload(expr.PayloadBaseNetworkHeader, 8, 6), neq(mac), drop)
	rule(port, load(expr.MetaKeyPROTOCOL), eq(arp), payload(expr.PayloadBaseNetworkHeader, 14, 4), neq(ip), drop)
	rule(port, load(expr.MetaKeyPROTOCOL), eq(ipv4), ipSaddr(), neq(ip), drop)
	if rate := m.rateBytes(); rate > 0 {
		rule(port, &expr.Limit{Type: expr.LimitTypePktBytes, Rate: rate, Over: true, Unit: expr.LimitTimeSecond, Burst: burst(rate)}, drop)
	}
	rule(port, load(expr.MetaKeyPROTOCOL), eq(arp), verdict(expr.VerdictAccept))
	rule(port, load(expr.MetaKeyPROTOCOL), eq(ipv4), verdict(expr.VerdictAccept))
	rule(port, drop)
	if err := c.SetAddElements(b.ports, []nftables.SetElement{{Key: ifnameKey(tap), VerdictData: jump(port.Name)}}); err != nil {
		return err
	}
	if rate := m.rateBytes(); rate > 0 {
		out := c.AddChain(&nftables.Chain{Table: b.bridge, Name: outChain(key)})
		rule(out, &expr.Limit{Type: expr.LimitTypePktBytes, Rate: rate, Over: true, Unit: expr.LimitTimeSecond, Burst: burst(rate)}, drop)
		if err := c.SetAddElements(b.outPorts, []nftables.SetElement{{Key: ifnameKey(tap), VerdictData: jump(out.Name)}}); err != nil {
			return err
		}
	}
	return nil
}

// addPolicy queues a VM's egress chain with its allow and deny sets;
// replace flushes them first, so a policy change is one transaction.
func (m *Manager) addPolicy(c *nftables.Conn, b *base, vm *VM, replace bool) error {
	key := vmKey(vm.ID)
	allow := &nftables.Set{Table: b.inet, Name: allowSet(key), KeyType: nftables.TypeIPAddr, Interval: true}
	deny := &nftables.Set{Table: b.inet, Name: denySet(key), KeyType: nftables.TypeIPAddr, Interval: true}
	ch := &nftables.Chain{Table: b.inet, Name: vmChain(key)}
	if replace {
		c.FlushSet(allow)
		c.FlushSet(deny)
		c.FlushChain(ch)
		if err := c.SetAddElements(allow, intervalElements(vm.Policy.Allow)); err != nil {
			return err
		}
		if err := c.SetAddElements(deny, intervalElements(vm.Policy.Deny)); err != nil {
			return err
		}
	} else {
		if err := c.AddSet(allow, intervalElements(vm.Policy.Allow)); err != nil {
			return err
		}
		if err := c.AddSet(deny, intervalElements(vm.Policy.Deny)); err != nil {
			return err
		}
		ch = c.AddChain(ch)
	}
	rule := func(ex ...expr.Any) { c.AddRule(&nftables.Rule{Table: b.inet, Chain: ch, Exprs: ex}) }
	drop := verdict(expr.VerdictDrop)
	// Every packet, not only a connection's first: a policy change cuts
	// connections already open.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(ipDaddr(), in(b.resolvers), load(expr.MetaKeyL4PROTO), eq([]byte{proto}),
			payload(expr.PayloadBaseTransportHeader, 2, 2), eq(binaryutil.BigEndian.PutUint16(53)), counter(txCounter(key)), verdict(expr.VerdictAccept))
	}
	rule(ipDaddr(), in(b.hard), drop)
	rule(ipDaddr(), in(b.private), notIn(b.allowPriv), drop)
	rule(load(expr.MetaKeyL4PROTO), eq([]byte{unix.IPPROTO_TCP}), payload(expr.PayloadBaseTransportHeader, 2, 2), eq(binaryutil.BigEndian.PutUint16(25)), drop)
	rule(ipDaddr(), in(deny), drop)
	// An allow list (CIDRs or domains: what the domain filter admits
	// never comes here) drops the rest.
	if len(vm.Policy.Allow) > 0 || hasDomains(vm.Policy) {
		rule(ipDaddr(), notIn(allow), drop)
	}
	rule(counter(txCounter(key)), verdict(expr.VerdictAccept))
	return nil
}

// burst is a cap's allowance above its rate: nftables' byte limit holds a
// second's worth plus the burst, so a VM may send about 1.1 s of its cap
// at once, then no more than the cap.
func burst(rate uint64) uint32 { return uint32(min(rate/10, 1<<30)) }
