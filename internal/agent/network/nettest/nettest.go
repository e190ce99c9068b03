// Package nettest gives tests outside internal/agent/network a node and
// an internet of their own, as network namespaces: a "node" joined to an
// "internet" by a veth pair, the internet holding an HTTP server on
// every address (the test's upstream, and addresses a VM must not reach,
// such as the metadata address). Nothing touches the host's own
// namespace; the namespaces are deleted when the test ends. Root only.
package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The world's addresses.
const (
	NodeAddr  = "203.0.113.1" // the node's uplink (Uplink), where egress is masqueraded to
	InetAddr  = "203.0.113.2" // the internet's end of the veth pair
	Upstream  = "198.51.100.10"
	Metadata  = "169.254.169.254"
	Uplink    = "up0"
	VMNetwork = "10.200.0.0/15" // routed back to the node from the internet
)

// RequireRoot skips the test, loudly, without root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("!!! SKIPPED: this test needs root (network namespaces, taps, nftables); run it as root !!!")
	}
}

// NS is a named network namespace.
type NS struct {
	Name string
	h    netns.NsHandle
}

// Path is the namespace's file (network.Config.NetNS, nsenter --net=).
func (n NS) Path() string { return "/var/run/netns/" + n.Name }

// Do runs f on a thread of its own inside n.
func (n NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(n.h); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// NewNS makes a namespace with its loopback up, deleted when the test
// ends.
func NewNS(t testing.TB, role string) NS {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "cptest-" + hex.EncodeToString(b) + "-" + role
	errc := make(chan error, 1)
	var h netns.NsHandle
	go func() {
		runtime.LockOSThread() // left in the new namespace: the thread dies with the goroutine
		var err error
		h, err = netns.NewNamed(name)
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("nettest: namespace %s: %v", name, err)
	}
	t.Cleanup(func() { _ = h.Close(); _ = netns.DeleteNamed(name) })
	n := NS{name, h}
	must(t, n.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}))
	return n
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("nettest: %v", err)
	}
}

// World is a node joined to an internet.
type World struct{ Node, Inet NS }

// NewWorld makes the node (uplink up0, NodeAddr, default route to the
// internet) and the internet (Upstream and Metadata on its loopback, a
// route back to VMNetwork through the node, so that what a VM cannot
// reach is the node's filtering and not a missing route), and serves HTTP
// on port 80 of every internet address: the answer is the client's
// address as the server saw it.
func NewWorld(t testing.TB) *World {
	t.Helper()
	w := &World{Node: NewNS(t, "node"), Inet: NewNS(t, "inet")}
	must(t, w.Node.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: Uplink}, PeerName: "wan0"}); err != nil {
			return err
		}
		wan, err := netlink.LinkByName("wan0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(wan, int(w.Inet.h)); err != nil {
			return err
		}
		up, err := addr(Uplink, NodeAddr+"/24")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(up); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP(InetAddr)})
	}))
	var ln net.Listener
	must(t, w.Inet.Do(func() error {
		wan, err := addr("wan0", InetAddr+"/24")
		if err != nil {
			return err
		}
		for _, a := range []string{Upstream, Metadata} {
			if _, err := addr("lo", a+"/32"); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(wan); err != nil {
			return err
		}
		_, vms, _ := net.ParseCIDR(VMNetwork)
		if err := netlink.RouteAdd(&netlink.Route{Dst: vms, Gw: net.ParseIP(NodeAddr)}); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", "0.0.0.0:80")
		return err
	}))
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(rw, "hello %s from %s\n", host, r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return w
}

func addr(link, cidr string) (netlink.Link, error) {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return nil, err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, err
	}
	return l, netlink.AddrAdd(l, a)
}

// Links are the names of the node's interfaces.
func (n NS) Links(t testing.TB) []string {
	t.Helper()
	var out []string
	must(t, n.Do(func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			out = append(out, l.Attrs().Name)
		}
		return err
	}))
	return out
}

// Two nodes' underlay: UnderlayLink on each, UnderlayA and UnderlayB.
const (
	UnderlayLink = "ul0"
	UnderlayA    = "192.0.2.1"
	UnderlayB    = "192.0.2.2"
)

// NewNodes makes two node namespaces joined by a veth pair, the pool's
// own connection (UnderlayLink, UnderlayA on a and UnderlayB on b): each
// agent's uplink and underlay in a test of the private overlay.
func NewNodes(t testing.TB) (a, b NS) {
	t.Helper()
	a, b = NewNS(t, "nodea"), NewNS(t, "nodeb")
	must(t, a.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: UnderlayLink}, PeerName: "ulb"}); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("ulb")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(b.h)); err != nil {
			return err
		}
		l, err := addr(UnderlayLink, UnderlayA+"/24")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}))
	must(t, b.Do(func() error {
		l, err := netlink.LinkByName("ulb")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(l, UnderlayLink); err != nil {
			return err
		}
		if l, err = addr(UnderlayLink, UnderlayB+"/24"); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}))
	return a, b
}
