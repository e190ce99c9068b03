package network

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// DomainFilter enforces policies' domain entries (TLS SNI and the HTTP
// Host): a transparent proxy on the node (internal/agent/egressproxy)
// that the manager's rules send a filtered VM's TCP 80 and 443 to.
type DomainFilter interface {
	// Port is the TCP port the filter listens on, on every IPv4 address
	// of the manager's namespace.
	Port() uint16
	// Set has the filter admit the VM's connections to names allow
	// admits ("*." entries: their subdomains) whose destination
	// reachable lets through, and cut open ones that no longer pass; an
	// empty allow stops filtering the VM.
	Set(vmID string, addr netip.Addr, allow []string, reachable func(netip.Addr) bool) error
	// Remove stops filtering a VM and cuts its connections.
	Remove(vmID string) error
}

// The domain filter's objects in the inet table (only with a filter).
const (
	mapDomains = "domains4" // VM address -> jump dom_<key>: VMs with domain entries
	mapProxied = "proxied4" // VM address -> jump ptx_<key>: count what reaches the filter
)

func domChain(key string) string { return "dom_" + key }
func ptxChain(key string) string { return "ptx_" + key }

// hasDomains: a policy whose connections the filter decides.
func hasDomains(p Policy) bool { return len(p.AllowDomains) > 0 }

// ipsDstNAT is conntrack's IPS_DST_NAT status bit (a redirect is one).
const ipsDstNAT = 1 << 5

// ctDNAT matches packets of connections the redirect rewrote.
func ctDNAT() []expr.Any {
	return []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		neq(make([]byte, 4))}
}

func tcpDport(port uint16) []expr.Any {
	return []expr.Any{load(expr.MetaKeyL4PROTO), eq([]byte{unix.IPPROTO_TCP}),
		payload(expr.PayloadBaseTransportHeader, 2, 2), eq(binaryutil.BigEndian.PutUint16(port))}
}

// addDomainBase queues the filter's part of the base ruleset: the
// redirect (nat prerouting) of filtered VMs, and in the input chain,
// before its drop of everything from a VM, the accept of their
// redirected connections, counted as the VM's tx; an output chain counts
// the filter's answers as the VM's rx (tovm4). Redirected traffic never
// crosses the forward hook, where the other counters are.
func (m *Manager) addDomainBase(c *nftables.Conn, b *base, ours []byte) error {
	port := m.cfg.Domains.Port()
	b.domains = &nftables.Set{Table: b.inet, Name: mapDomains, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	b.proxied = &nftables.Set{Table: b.inet, Name: mapProxied, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	for _, s := range []*nftables.Set{b.domains, b.proxied} {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	accept := nftables.ChainPolicyAccept
	rule := func(ch *nftables.Chain, ex ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: ex})
	}
	pre := c.AddChain(&nftables.Chain{Table: b.inet, Name: "prerouting", Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	rule(pre, append(append([]expr.Any{load(expr.MetaKeyIIFNAME), eq(ours)}, ipv4Only()...), ipSaddr(), vmap(b.domains))...)
	// The filter's port takes redirected connections only.
	rule(b.input, append(append(append([]expr.Any{load(expr.MetaKeyIIFNAME), eq(ours)}, ipv4Only()...), tcpDport(port)...),
		append(ctDNAT(), ipSaddr(), vmap(b.proxied))...)...)
	rule(b.input, append(append(ipv4Only(), tcpDport(port)...), verdict(expr.VerdictDrop))...)
	out := c.AddChain(&nftables.Chain{Table: b.inet, Name: "output", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	rule(out, append(append(append([]expr.Any{load(expr.MetaKeyOIFNAME), eq(ours)}, ipv4Only()...), ctDNAT()...), ipDaddr(), vmap(b.toVM))...)
	return nil
}

// addDomainVM queues an egress VM's filter chains (with a filter): dom_
// redirects its TCP 80 and 443 to the filter unless the destination is
// local, denied (the platform deny set, its deny list: the forward hook
// drops it) or in its allowed CIDRs (it passes without the filter);
// ptx_ counts and accepts what reaches the filter.
func (m *Manager) addDomainVM(c *nftables.Conn, b *base, vm *VM) error {
	key := vmKey(vm.ID)
	dom := c.AddChain(&nftables.Chain{Table: b.inet, Name: domChain(key)})
	rule := func(ch *nftables.Chain, ex ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: b.inet, Chain: ch, Exprs: ex})
	}
	ret := verdict(expr.VerdictReturn)
	allow := &nftables.Set{Table: b.inet, Name: allowSet(key)}
	deny := &nftables.Set{Table: b.inet, Name: denySet(key)}
	rule(dom, &expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true}, eq(binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)), ret)
	rule(dom, ipDaddr(), in(b.hard), ret)
	rule(dom, ipDaddr(), in(b.private), notIn(b.allowPriv), ret)
	rule(dom, ipDaddr(), in(deny), ret)
	rule(dom, ipDaddr(), in(allow), ret)
	for _, p := range []uint16{80, 443} {
		rule(dom, append(tcpDport(p),
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(m.cfg.Domains.Port())},
			&expr.Redir{RegisterProtoMin: 1})...)
	}
	ptx := c.AddChain(&nftables.Chain{Table: b.inet, Name: ptxChain(key)})
	rule(ptx, counter(txCounter(key)), verdict(expr.VerdictAccept))
	addr := vm.Address.Addr().AsSlice()
	if err := c.SetAddElements(b.proxied, []nftables.SetElement{{Key: addr, VerdictData: jump(ptxChain(key))}}); err != nil {
		return err
	}
	if hasDomains(vm.Policy) {
		return c.SetAddElements(b.domains, []nftables.SetElement{{Key: addr, VerdictData: jump(domChain(key))}})
	}
	return nil
}

// setRedirect queues the change of a running VM's redirect when its
// policy gains or loses domain entries.
func (m *Manager) setRedirect(c *nftables.Conn, b *base, old, next *VM) error {
	addr := next.Address.Addr().AsSlice()
	switch was, is := hasDomains(old.Policy), hasDomains(next.Policy); {
	case is && !was:
		return c.SetAddElements(b.domains, []nftables.SetElement{{Key: addr, VerdictData: jump(domChain(vmKey(next.ID)))}})
	case was && !is:
		return c.SetDeleteElements(b.domains, []nftables.SetElement{{Key: addr}})
	}
	return nil
}

// reachable is the check the filter applies to a destination of vm's
// (on top of the rules, which never redirect a denied one): the platform
// deny set and the VM's deny list.
func (m *Manager) reachable(vm VM) func(netip.Addr) bool {
	hard := append(append(append([]netip.Prefix(nil), hardDeny...), m.cfg.EgressPool, m.cfg.PrivatePool), m.cfg.Deny...)
	allowPriv := append([]netip.Prefix(nil), m.cfg.AllowPrivate...)
	deny := append([]netip.Prefix(nil), vm.Policy.Deny...)
	within := func(ps []netip.Prefix, a netip.Addr) bool {
		for _, p := range ps {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(a netip.Addr) bool {
		a = a.Unmap()
		switch {
		case !a.Is4(), within(hard, a), within(deny, a):
			return false
		case within(privateRanges, a) && !within(allowPriv, a):
			return false
		}
		return true
	}
}

// setFilter tells the filter about vm's policy (nothing without one).
func (m *Manager) setFilter(vm VM) error {
	if m.cfg.Domains == nil || vm.Mode != ModeEgress {
		return nil
	}
	return m.cfg.Domains.Set(vm.ID, vm.Address.Addr(), vm.Policy.AllowDomains, m.reachable(vm))
}
