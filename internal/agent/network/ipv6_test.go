package network

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 addresses of the test's world: the node's (global and unique
// local, on its uplink), the internet's upstream (global and unique
// local), and the address a VM gives itself.
const (
	nodeV6     = "2001:db8:ff::1"
	nodeULA    = "fd00:ff::1"
	inetV6     = "2001:db8:ff::2"
	upstreamV6 = "2001:db8:100::10"
	ulaV6      = "fd12:3456::10"
	vmV6       = "2001:db8:200::2"
	vmV6Net    = "2001:db8:200::/64"
)

func addAddr6(name, cidr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD // usable at once: no duplicate detection to wait for
	return netlink.AddrAdd(l, a)
}

// TestIPv6NeverBypassesTheDenySet: VMs have IPv4 only, and no IPv6 path
// leads anywhere. The world is the worst case: the node forwards IPv6 and
// has global and unique local IPv6 addresses and a service on all of them,
// the internet has an IPv6 upstream (global and in fc00::/7) and a route
// back to the VMs' IPv6 prefix through the node. A VM that configures
// IPv6 itself (an address, a route, the gateway's MAC as its next hop,
// link-local neighbours) reaches none of the node, the internet, another
// tenant's VM or its own tenant's VMs over IPv6, while IPv4 works; nothing
// reaches a VM over IPv6 either; and the node holds no IPv6 address (not
// even link-local) on any interface the manager made.
func TestIPv6NeverBypassesTheDenySet(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("this kernel has no IPv6")
	}
	w := newWorld(t)
	w.node.run(t, func() error {
		for _, s := range []string{"net/ipv6/conf/all/forwarding", "net/ipv6/conf/default/forwarding"} {
			if err := sysctl(s, "1"); err != nil {
				return err
			}
		}
		for _, a := range []string{nodeV6 + "/64", nodeULA + "/64"} {
			if err := addAddr6("up0", a); err != nil {
				return err
			}
		}
		_, dflt, _ := net.ParseCIDR("::/0")
		return netlink.RouteAdd(&netlink.Route{Dst: dflt, Gw: net.ParseIP(inetV6)})
	})
	w.inet.run(t, func() error {
		if err := addAddr6("wan0", inetV6+"/64"); err != nil {
			return err
		}
		for _, a := range []string{upstreamV6 + "/128", ulaV6 + "/128"} {
			if err := addAddr6("lo", a); err != nil {
				return err
			}
		}
		_, vms, _ := net.ParseCIDR(vmV6Net)
		return netlink.RouteAdd(&netlink.Route{Dst: vms, Gw: net.ParseIP(nodeV6)})
	})
	// (The internet's HTTP server on 0.0.0.0:80 is Go's dual-stack
	// socket: it answers on IPv6 too.)
	accept6(t, w.node, "[::]:8082")
	// The world works over IPv6 without VMs: the internet reaches the node.
	// (Neighbour discovery on fresh links takes a moment.)
	require.Eventually(t, func() bool { return w.inet.dial("["+nodeV6+"]:8082") == nil }, 10*time.Second, 100*time.Millisecond,
		"the test's own IPv6 path")

	m := newManager(t, testConfig(w))
	a := w.startVM(t, m, egressVM("vm-a", "acme", "10.200.1.2/24", "10.200.1.1", "52:54:00:00:01:02"))
	b := w.startVM(t, m, egressVM("vm-b", "other", "10.200.2.2/24", "10.200.2.1", "52:54:00:00:02:02"))
	p := w.startVM(t, m, privateVM("vm-p", "acme", "10.201.1.2/24", "52:54:00:00:11:02"))
	q := w.startVM(t, m, privateVM("vm-q", "acme", "10.201.1.3/24", "52:54:00:00:11:03"))
	accept6(t, b.ns, "[::]:9000")
	accept6(t, q.ns, "[::]:9000")
	q.accept(t, "0.0.0.0:9001")
	reaches(t, a, upstream+":80")
	reaches(t, p, "10.201.1.3:9001") // IPv4 between private VMs works

	// The MAC of each VM's bridge on the node: a VM that names it as its
	// IPv6 next hop sends its frames to the node itself.
	bridgeMAC := func(v *fakeVM) net.HardwareAddr {
		var mac net.HardwareAddr
		w.node.run(t, func() error {
			l, err := netlink.LinkByName(m.names.bridge(v.spec.Mode, v.spec.Tenant))
			mac = l.Attrs().HardwareAddr
			return err
		})
		return mac
	}
	// Each VM's link-local address, its own (no duplicate detection to
	// wait for, unlike the one the kernel makes).
	linkLocal := func(v *fakeVM, i int) string {
		ll := fmt.Sprintf("fe80::a:%d", i+2)
		v.run(t, func() error { return addAddr6("eth0", ll+"/64") })
		return ll
	}
	// Each VM gives itself IPv6: a global address, a default route through
	// fe80::1 and fe80::1 pinned to its bridge's MAC (no neighbour
	// discovery needed), the other VMs' link-local addresses pinned too.
	vms := []*fakeVM{a, b, p, q}
	lls := map[*fakeVM]string{}
	for i, v := range vms {
		lls[v] = linkLocal(v, i)
	}
	for i, v := range vms {
		mac := bridgeMAC(v)
		v.run(t, func() error {
			if err := addAddr6("eth0", fmt.Sprintf("%s%d/64", strings.TrimSuffix(vmV6, "2"), i+2)); err != nil {
				return err
			}
			eth := must(netlink.LinkByName("eth0"))
			if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP("fe80::1"), HardwareAddr: mac}); err != nil {
				return err
			}
			for _, o := range vms {
				if o != v {
					if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
						IP: net.ParseIP(lls[o]), HardwareAddr: must(net.ParseMAC(o.spec.MAC))}); err != nil {
						return err
					}
				}
			}
			_, dflt, _ := net.ParseCIDR("::/0")
			return netlink.RouteAdd(&netlink.Route{Dst: dflt, Gw: net.ParseIP("fe80::1"), LinkIndex: eth.Attrs().Index})
		})
	}

	t.Run("no VM reaches anything over IPv6", func(t *testing.T) {
		for _, v := range vms {
			for _, addr := range []string{
				"[" + upstreamV6 + "]:80", // the internet
				"[" + ulaV6 + "]:80",      // fc00::/7 beyond the node
				"[" + nodeV6 + "]:8082",   // the node's addresses
				"[" + nodeULA + "]:8082",
				"[fe80::1%eth0]:8082", // the node's link-local next hop (the bridge's MAC)
			} {
				blocked(t, v, addr)
			}
		}
		blocked(t, a, "["+lls[b]+"%eth0]:9000") // another tenant's VM, link-local
		blocked(t, p, "["+lls[q]+"%eth0]:9000") // its own tenant's private VM: IPv4 only
		blocked(t, p, "[2001:db8:200::5]:9000") // q's global address
		reaches(t, a, upstream+":80")           // IPv4 still works
		reaches(t, p, "10.201.1.3:9001")
	})

	t.Run("no IPv6 datagram of a VM leaves it (no answer needed to leak)", func(t *testing.T) {
		// A datagram needs no way back: a node that forwarded a VM's IPv6
		// would leak it even though the internet cannot answer.
		inet, node := listenUDP6(t, w.inet), listenUDP6(t, w.node)
		for _, v := range vms {
			v.run(t, func() error {
				for _, to := range []string{upstreamV6, ulaV6, nodeV6, nodeULA, "fe80::1%eth0"} {
					c, err := net.Dial("udp6", "["+to+"]:5353")
					if err != nil {
						continue // no route: nothing sent
					}
					for range 3 {
						_, _ = c.Write([]byte("leak"))
					}
					_ = c.Close()
				}
				return nil
			})
		}
		time.Sleep(time.Second)
		assert.Zero(t, inet.Load(), "datagrams reached the internet over IPv6")
		assert.Zero(t, node.Load(), "datagrams reached the node over IPv6")
	})

	t.Run("nothing reaches a VM over IPv6", func(t *testing.T) {
		assert.Error(t, w.inet.dial("[2001:db8:200::3]:9000"), "the internet must not reach b over IPv6")
		assert.Error(t, w.node.dial("[2001:db8:200::3]:9000"), "nor the node")
	})

	t.Run("the node has no IPv6 where VMs are", func(t *testing.T) {
		w.node.run(t, func() error {
			links, err := netlink.LinkList()
			if err != nil {
				return err
			}
			n := 0
			for _, l := range links {
				name := l.Attrs().Name
				if !strings.HasPrefix(name, m.names.ifPrefix()) {
					continue
				}
				n++
				addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
				if err != nil {
					return err
				}
				assert.Empty(t, addrs, "%s holds IPv6 addresses", name)
				v, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + name + "/disable_ipv6")
				if err != nil {
					return err
				}
				assert.Equal(t, "1", strings.TrimSpace(string(v)), "IPv6 is off on %s", name)
			}
			assert.Equal(t, 7, n, "four taps and three bridges")
			return nil
		})
	})
	// Give the kernel a moment: a late router solicitation or DAD probe of
	// a VM must not change anything either.
	time.Sleep(200 * time.Millisecond)
	blocked(t, a, "["+upstreamV6+"]:80")
}

// accept6 listens on IPv6 only inside n and answers every connection.
func accept6(t *testing.T, n ns, addr string) {
	t.Helper()
	var ln net.Listener
	n.run(t, func() (err error) { ln, err = net.Listen("tcp6", addr); return err })
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello"))
			_ = c.Close()
		}
	}()
}

// listenUDP6 counts the datagrams that reach port 5353 of n over IPv6.
func listenUDP6(t *testing.T, n ns) *atomic.Int64 {
	t.Helper()
	var pc net.PacketConn
	n.run(t, func() (err error) { pc, err = net.ListenPacket("udp6", "[::]:5353"); return err })
	t.Cleanup(func() { _ = pc.Close() })
	var got atomic.Int64
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	return &got
}
