package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"computeplane/internal/agent"
	"computeplane/internal/agent/network"
)

// netFlags are compute-agent run's network flags (docs/agent-install.md,
// docs/networking.md): --network none keeps VMs without a network card.
type netFlags struct {
	mode                          string
	uplink                        string
	egressPool, privatePool       string
	allowPrivate, deny, resolvers string
	bandwidthMbps, mtu            int
	netns                         string
	underlay                      string
	vxlanPort                     int
	domainFilter                  bool
}

func (f *netFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "network", "none", "VM networks: none (no network card) or nftables (taps on bridges, netlink and nftables; needs root)")
	fs.StringVar(&f.uplink, "net-uplink", "", "the interface egress leaves by, with source NAT (default: the default route's)")
	fs.StringVar(&f.egressPool, "net-egress-pool", "10.200.0.0/16", "the IPv4 prefix egress VMs' addresses come from")
	fs.StringVar(&f.privatePool, "net-private-pool", "10.201.0.0/16", "the IPv4 prefix private-network VMs' addresses come from")
	fs.StringVar(&f.allowPrivate, "net-allow-private", "", "private ranges (CIDRs, comma-separated) egress VMs may reach")
	fs.StringVar(&f.deny, "net-deny", "", "further addresses (CIDRs, comma-separated) no VM reaches, on top of the API's and gateways'")
	fs.StringVar(&f.resolvers, "net-resolvers", "", "DNS servers (addresses, comma-separated) VMs may reach on port 53 even inside the deny set")
	fs.IntVar(&f.bandwidthMbps, "net-bandwidth-mbps", 0, "each VM's bandwidth cap each way, megabits per second (0: none)")
	fs.IntVar(&f.mtu, "net-mtu", 0, "the MTU of VMs that name none (0: 1500); private VMs get at most the underlay's MTU less 50 (VXLAN)")
	fs.StringVar(&f.underlay, "net-underlay", "", "this node's IPv4 address on the pool's own connection, where the other nodes reach its private networks (VXLAN); none: no overlay and no private networks (default: the uplink's first global address, none without one)")
	fs.IntVar(&f.vxlanPort, "net-vxlan-port", network.DefaultVXLANPort, "the UDP port of the private networks' overlay (VXLAN); the node drops packets to it from anything but the pool's nodes")
	fs.BoolVar(&f.domainFilter, "net-domain-filter", true, "enforce domain entries of egress policies (TLS SNI, HTTP Host) with a transparent proxy on the node; false refuses policies that name domains")
	// A test hook (end-to-end tests put the node in a namespace of their
	// own while the daemon talks to the control plane on the host's).
	fs.StringVar(&f.netns, "net-netns", "", "testing: wire VMs in the network namespace at this path (e.g. /var/run/netns/x) and start qemu inside it through nsenter; the uplink is looked up there")
}

// config checks the network flags (set: the names given on the command
// line) against the node's state and returns the manager's configuration,
// nil for --network none. Every refusal names its flag.
func (f *netFlags) config(set map[string]bool, st *agent.State, log *slog.Logger) (*network.Config, error) {
	switch f.mode {
	case "none":
		for name := range set {
			if strings.HasPrefix(name, "net-") {
				return nil, fmt.Errorf("--%s needs --network nftables", name)
			}
		}
		return nil, nil
	case "nftables":
	default:
		return nil, fmt.Errorf("--network %q: use none or nftables", f.mode)
	}
	cfg := &network.Config{ID: network.AgentID(st.NodeID), BandwidthMbps: f.bandwidthMbps, MTU: f.mtu}
	var err error
	if cfg.EgressPool, err = pool("net-egress-pool", f.egressPool); err != nil {
		return nil, err
	}
	if cfg.PrivatePool, err = pool("net-private-pool", f.privatePool); err != nil {
		return nil, err
	}
	if cfg.EgressPool.Overlaps(cfg.PrivatePool) {
		return nil, fmt.Errorf("--net-egress-pool %v and --net-private-pool %v overlap", cfg.EgressPool, cfg.PrivatePool)
	}
	if cfg.AllowPrivate, err = prefixes("net-allow-private", f.allowPrivate); err != nil {
		return nil, err
	}
	for _, p := range cfg.AllowPrivate {
		if !isPrivate(p) {
			return nil, fmt.Errorf("--net-allow-private %v is not inside a private range (10/8, 172.16/12, 192.168/16, 100.64/10)", p)
		}
	}
	if cfg.Deny, err = prefixes("net-deny", f.deny); err != nil {
		return nil, err
	}
	for _, s := range list(f.resolvers) {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("--net-resolvers %q is not an IPv4 address", s)
		}
		cfg.Resolvers = append(cfg.Resolvers, a)
	}
	if f.bandwidthMbps < 0 {
		return nil, fmt.Errorf("--net-bandwidth-mbps %d is negative", f.bandwidthMbps)
	}
	if f.mtu != 0 && (f.mtu < 576 || f.mtu > 9000) {
		return nil, fmt.Errorf("--net-mtu %d is outside 576..9000", f.mtu)
	}
	if f.netns != "" {
		if _, err := exec.LookPath("nsenter"); err != nil {
			return nil, fmt.Errorf("--net-netns needs nsenter (util-linux): %w", err)
		}
		cfg.NetNS = f.netns
	}
	if cfg.Uplink, err = uplink(f.uplink, f.netns); err != nil {
		return nil, err
	}
	if f.vxlanPort < 1 && set["net-vxlan-port"] || f.vxlanPort < 0 || f.vxlanPort > 65535 {
		return nil, fmt.Errorf("--net-vxlan-port %d is outside 1..65535", f.vxlanPort)
	}
	if f.vxlanPort != network.DefaultVXLANPort {
		cfg.VXLANPort = f.vxlanPort
	}
	if cfg.Underlay, err = underlay(f.underlay, cfg.Uplink, f.netns); err != nil {
		return nil, err
	}
	if !cfg.Underlay.IsValid() {
		log.Warn("no underlay address: this node offers no private networks (name one with --net-underlay)")
	}
	// The platform's services: no VM reaches the API or a gateway of the
	// node's region (the node's own addresses are denied by the manager).
	cfg.Deny = append(cfg.Deny, serviceAddrs(st, log)...)
	if _, err := network.New(*cfg); err != nil {
		return nil, fmt.Errorf("--network nftables: %w", err)
	}
	return cfg, nil
}

func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func pool(flag, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil || !p.Addr().Is4() || p != p.Masked() || p.Bits() > 28 {
		return netip.Prefix{}, fmt.Errorf("--%s %q is not an IPv4 prefix of /28 or larger (e.g. 10.200.0.0/16)", flag, s)
	}
	return p, nil
}

func prefixes(flag, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range list(s) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return nil, fmt.Errorf("--%s %q is not an IPv4 CIDR", flag, f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("--%s %q: VMs have IPv4 only", flag, f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

var privateRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10")}

func isPrivate(p netip.Prefix) bool {
	for _, r := range privateRanges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// uplink is the named interface, which must exist, or the default
// route's, in the namespace at nsPath (empty: the agent's own).
func uplink(name, nsPath string) (string, error) {
	h := &netlink.Handle{} // the agent's own namespace
	if nsPath != "" {
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			return "", fmt.Errorf("--net-netns %q: %w", nsPath, err)
		}
		defer ns.Close()
		if h, err = netlink.NewHandleAt(ns); err != nil {
			return "", fmt.Errorf("--net-netns %q is not a network namespace: %w", nsPath, err)
		}
		defer h.Close()
	}
	if name != "" {
		if _, err := h.LinkByName(name); err != nil {
			return "", fmt.Errorf("--net-uplink %q: %w", name, err)
		}
		return name, nil
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("--net-uplink: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
				return l.Attrs().Name, nil
			}
		}
	}
	return "", errors.New("--net-uplink: this host has no default route; name the uplink interface")
}

// Networks are the modes a node with cfg offers besides none: egress,
// and private with an underlay (a private network must reach the pool's
// other nodes, or a tenant's VMs placed apart would not reach each
// other).
func Networks(cfg *network.Config) []string {
	if cfg == nil {
		return nil
	}
	if !cfg.Underlay.IsValid() {
		return []string{network.ModeEgress}
	}
	return []string{network.ModeEgress, network.ModePrivate}
}

// underlay is the address --net-underlay names, which an interface must
// hold, none for "none", or by default the uplink's first global unicast
// IPv4 address (none without one), in the namespace at nsPath.
func underlay(flagValue, uplinkName, nsPath string) (netip.Addr, error) {
	if flagValue == "none" {
		return netip.Addr{}, nil
	}
	h := &netlink.Handle{}
	if nsPath != "" {
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("--net-netns %q: %w", nsPath, err)
		}
		defer ns.Close()
		if h, err = netlink.NewHandleAt(ns); err != nil {
			return netip.Addr{}, err
		}
		defer h.Close()
	}
	var link netlink.Link // nil: every interface
	var want netip.Addr
	if flagValue != "" {
		a, err := netip.ParseAddr(flagValue)
		if err != nil || !a.Is4() || !a.IsGlobalUnicast() {
			return netip.Addr{}, fmt.Errorf("--net-underlay %q is not a unicast IPv4 address (or none)", flagValue)
		}
		want = a
	} else {
		l, err := h.LinkByName(uplinkName)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("--net-uplink %q: %w", uplinkName, err)
		}
		link = l
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--net-underlay: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		switch {
		case !ok:
		case want.IsValid() && ip == want:
			return want, nil
		case !want.IsValid() && ip.IsGlobalUnicast():
			return ip, nil
		}
	}
	if want.IsValid() {
		return netip.Addr{}, fmt.Errorf("--net-underlay %v: no interface of the node holds it", want)
	}
	return netip.Addr{}, nil
}

// serviceAddrs are the IPv4 addresses of the control plane's API and of
// the region's gateways as the node's state names them, each a /32. A name
// that does not resolve now is logged and left out (the daemon cannot
// reach it either).
func serviceAddrs(st *agent.State, log *slog.Logger) []netip.Prefix {
	urls := []string{st.APIURL, st.FallbackURL}
	for _, g := range st.Gateways {
		urls = append(urls, g.URL)
	}
	seen := map[netip.Addr]bool{}
	var out []netip.Prefix
	for _, u := range urls {
		pu, err := url.Parse(u)
		if err != nil || pu.Hostname() == "" {
			continue
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(pu.Hostname()); err == nil {
			addrs = []netip.Addr{a}
		} else if ips, err := net.LookupIP(pu.Hostname()); err == nil {
			for _, ip := range ips {
				if a, ok := netip.AddrFromSlice(ip); ok {
					addrs = append(addrs, a.Unmap())
				}
			}
		} else {
			log.Warn("a service of the platform does not resolve: VMs are not denied its addresses", "url", u, "error", err.Error())
		}
		for _, a := range addrs {
			if a.Is4() && !seen[a] {
				seen[a] = true
				out = append(out, netip.PrefixFrom(a, 32))
			}
		}
	}
	return out
}
