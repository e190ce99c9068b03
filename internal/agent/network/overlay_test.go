package network

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The overlay's test: two "nodes" (namespaces) joined by a veth pair, the
// underlay (ul0: 192.0.2.1 on a, 192.0.2.2 on b, and 192.0.2.3 on b too,
// an address that is no peer), each with its own manager; two tenants
// with a private network each spanning both nodes.
const (
	underlayA, underlayB, intruder = "192.0.2.1", "192.0.2.2", "192.0.2.3"
	vniAcme, vniOther              = 0x0ac900, 0x0ac901
)

type pair struct {
	a, b   *world // node only (no internet)
	ma, mb *Manager
}

func newPair(t *testing.T) *pair {
	t.Helper()
	p := &pair{a: &world{node: newNS(t, "nodea")}, b: &world{node: newNS(t, "nodeb")}}
	p.a.node.run(t, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ulb"}); err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(must(netlink.LinkByName("ulb")), int(p.b.node.h)); err != nil {
			return err
		}
		if err := addAddr("ul0", underlayA+"/24"); err != nil {
			return err
		}
		return netlink.LinkSetUp(must(netlink.LinkByName("ul0")))
	})
	p.b.node.run(t, func() error {
		l := must(netlink.LinkByName("ulb"))
		if err := netlink.LinkSetName(l, "ul0"); err != nil {
			return err
		}
		for _, a := range []string{underlayB, intruder} {
			if err := addAddr("ul0", a+"/24"); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	})
	cfg := func(n ns, underlay string) Config {
		return Config{ID: randHex(4), Uplink: "ul0", EgressPool: netip.MustParsePrefix("10.200.0.0/16"),
			PrivatePool: netip.MustParsePrefix("10.201.0.0/16"), NetNS: n.path(), Underlay: netip.MustParseAddr(underlay)}
	}
	p.ma, p.mb = newManager(t, cfg(p.a.node, underlayA)), newManager(t, cfg(p.b.node, underlayB))
	return p
}

func overlays(peer string) []Overlay {
	peers := []netip.Addr{netip.MustParseAddr(peer)}
	return []Overlay{{ID: "pnet_acme", Tenant: "acme", VNI: vniAcme, Peers: peers}, {ID: "pnet_other", Tenant: "other", VNI: vniOther, Peers: peers}}
}

func privateOn(id, tenant, addr, mac string) VM {
	v := privateVM(id, tenant, addr, mac)
	v.NetworkID = "pnet_" + tenant
	return v
}

// startPrivate starts a fake VM whose card has the private MTU, as the
// guest's does (the runtime gives it in the spec).
func startPrivate(t *testing.T, w *world, m *Manager, spec VM) *fakeVM {
	v := w.startVM(t, m, spec)
	v.run(t, func() error { return netlink.LinkSetMTU(must(netlink.LinkByName("eth0")), m.PrivateMTU()) })
	return v
}

func TestOverlayJoinsATenantsPrivateNetworkAcrossNodes(t *testing.T) {
	requireRoot(t)
	p := newPair(t)
	assert.Equal(t, 1500-VXLANOverhead, p.ma.PrivateMTU(), "the underlay's MTU less VXLAN's overhead")
	require.NoError(t, p.ma.SetOverlays(overlays(underlayB)))
	require.NoError(t, p.mb.SetOverlays(overlays(underlayA)))

	a1 := startPrivate(t, p.a, p.ma, privateOn("a1", "acme", "10.201.0.2/24", "52:54:00:00:05:02"))
	a2 := startPrivate(t, p.b, p.mb, privateOn("a2", "acme", "10.201.0.3/24", "52:54:00:00:05:03"))
	o1 := startPrivate(t, p.a, p.ma, privateOn("o1", "other", "10.201.0.4/24", "52:54:00:00:05:04"))
	o2 := startPrivate(t, p.b, p.mb, privateOn("o2", "other", "10.201.0.5/24", "52:54:00:00:05:05"))
	for _, v := range []*fakeVM{a1, a2, o1, o2} {
		v.accept(t, "0.0.0.0:9000")
		v.serveBytes(t, "0.0.0.0:9001", 300<<10)
	}
	// One tenant's VMs reach each other across the nodes, full-size
	// segments included (the MTU leaves room for VXLAN's header).
	reaches(t, a1, "10.201.0.3:9000")
	reaches(t, a2, "10.201.0.2:9000")
	reaches(t, o1, "10.201.0.5:9000")
	n, err := a1.fetch("10.201.0.3:9001")
	require.NoError(t, err)
	assert.Equal(t, 300<<10, n, "a bulk transfer across the overlay")
	// Another tenant's VMs, on either node, reach neither.
	blocked(t, o2, "10.201.0.2:9000")
	blocked(t, o1, "10.201.0.3:9000")
	blocked(t, a2, "10.201.0.4:9000")
	blocked(t, a1, "10.201.0.5:9000")
	// Nor does anything reach the node's underlay from a VM.
	blocked(t, a1, underlayA+":9000")

	// The ports: one VXLAN port on each private bridge, its VNI the
	// network's, flooding to the peer alone.
	p.a.node.run(t, func() error {
		vx := must(netlink.LinkByName(p.ma.names.vxlan("acme"))).(*netlink.Vxlan)
		assert.Equal(t, vniAcme, vx.VxlanId)
		assert.Equal(t, 1450, vx.MTU)
		assert.Equal(t, must(netlink.LinkByName(p.ma.names.bridge(ModePrivate, "acme"))).Attrs().Index, vx.MasterIndex)
		assert.Equal(t, []string{underlayB}, flood(vx.Index))
		return nil
	})

	// VXLAN packets count only from peers: a frame sent from an address
	// of b that is no peer is dropped before the port learns its sender;
	// the same frame from b's underlay address is taken.
	strangerMAC := net.HardwareAddr{0x52, 0x54, 0x00, 0xee, 0, 1}
	p.b.node.run(t, func() error { return sendVXLAN(intruder, underlayA, vniAcme, strangerMAC) })
	time.Sleep(200 * time.Millisecond)
	assert.False(t, p.a.learned(t, p.ma.names.vxlan("acme"), strangerMAC), "a frame from a non-peer is dropped")
	p.b.node.run(t, func() error { return sendVXLAN(underlayB, underlayA, vniAcme, strangerMAC) })
	assert.Eventually(t, func() bool { return p.a.learned(t, p.ma.names.vxlan("acme"), strangerMAC) }, 2*time.Second, 50*time.Millisecond,
		"the control: the same frame from a peer is taken")

	// A peer leaving a network: no more flooding to it, and what was
	// learned of it is forgotten.
	require.NoError(t, p.ma.SetOverlays([]Overlay{{ID: "pnet_acme", Tenant: "acme", VNI: vniAcme}, overlays(underlayB)[1]}))
	p.a.node.run(t, func() error {
		vx := must(netlink.LinkByName(p.ma.names.vxlan("acme")))
		assert.Empty(t, flood(vx.Attrs().Index))
		return nil
	})
	assert.False(t, p.a.learned(t, p.ma.names.vxlan("acme"), strangerMAC))
	blocked(t, a1, "10.201.0.3:9000")
	reaches(t, o1, "10.201.0.5:9000")
	// A network no longer listed loses its port; listed again, it is back.
	require.NoError(t, p.ma.SetOverlays(overlays(underlayB)[1:]))
	assert.NotContains(t, p.a.links(t, Prefix+p.ma.cfg.ID), p.ma.names.vxlan("acme"))
	require.NoError(t, p.ma.SetOverlays(overlays(underlayB)))
	reaches(t, a1, "10.201.0.3:9000")

	// The port goes with the bridge's last VM, and Cleanup removes any.
	require.NoError(t, p.ma.Remove("a1"))
	links := p.a.links(t, Prefix+p.ma.cfg.ID)
	assert.NotContains(t, links, p.ma.names.vxlan("acme"))
	assert.NotContains(t, links, p.ma.names.bridge(ModePrivate, "acme"))
	assert.Contains(t, links, p.ma.names.vxlan("other"))
	m2, err := New(p.ma.cfg)
	require.NoError(t, err)
	defer m2.Close()
	require.NoError(t, m2.Cleanup(nil))
	assert.Empty(t, p.a.links(t, Prefix+p.ma.cfg.ID))
}

// A private VM's MTU above what the overlay carries is refused.
func TestOverlayRefusesAnMTUAboveTheUnderlays(t *testing.T) {
	requireRoot(t)
	p := newPair(t)
	v := privateOn("big", "acme", "10.201.0.2/24", "52:54:00:00:05:09")
	v.MTU = 1500
	_, err := p.ma.Add(v)
	assert.ErrorContains(t, err, "mtu 1500")
	v.MTU = 1400
	_, err = p.ma.Add(v)
	assert.NoError(t, err)
}

// flood lists the peers a VXLAN port floods to (its all-zero entries).
func flood(index int) []string {
	var out []string
	for _, n := range must(netlink.NeighList(index, unix.AF_BRIDGE)) {
		if n.HardwareAddr.String() == zeroMAC.String() && n.IP != nil {
			out = append(out, n.IP.String())
		}
	}
	slices.Sort(out)
	return out
}

// learned says whether a VXLAN port learned mac (from a packet it took).
func (w *world) learned(t *testing.T, vxlan string, mac net.HardwareAddr) bool {
	t.Helper()
	found := false
	w.node.run(t, func() error {
		l, err := netlink.LinkByName(vxlan)
		if err != nil {
			return err
		}
		ns, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		for _, n := range ns {
			found = found || (n.HardwareAddr.String() == mac.String() && n.IP != nil)
		}
		return err
	})
	return found
}

// sendVXLAN sends one VXLAN packet from src to dst's overlay port: a
// broadcast ARP request from mac.
func sendVXLAN(src, dst string, vni uint32, mac net.HardwareAddr) error {
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(src)}, &net.UDPAddr{IP: net.ParseIP(dst), Port: DefaultVXLANPort})
	if err != nil {
		return err
	}
	defer c.Close()
	pkt := make([]byte, 8, 8+42)
	pkt[0] = 0x08 // the VNI is valid
	binary.BigEndian.PutUint32(pkt[4:], vni<<8)
	pkt = append(pkt, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	pkt = append(pkt, mac...)
	pkt = append(pkt, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1)
	pkt = append(pkt, mac...)
	pkt = append(pkt, 10, 201, 0, 99, 0, 0, 0, 0, 0, 0, 10, 201, 0, 2)
	_, err = c.Write(pkt)
	return err
}

// serveBytes listens inside v and sends n bytes on every connection.
func (v *fakeVM) serveBytes(t *testing.T, addr string, n int) {
	ln := v.listen(t, addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write(make([]byte, n))
			}()
		}
	}()
}

// fetch reads everything a connection from inside v to addr gives.
func (v *fakeVM) fetch(addr string) (int, error) {
	var n int64
	err := v.do(func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		n, err = io.Copy(io.Discard, c)
		return err
	})
	return int(n), err
}
