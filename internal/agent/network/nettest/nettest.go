// Package nettest gives tests outside internal/agent/network a node and
// an internet of their own, as network namespaces: a "node" joined to an
// "internet" by a veth pair, the internet holding an HTTP and an HTTPS
// server (self-signed) on every address (the test's upstream, and
// addresses a VM must not reach, such as the metadata address) and a DNS
// server that answers the upstream's names. Nothing touches the host's own
// namespace; the namespaces are deleted when the test ends. Root only.
package nettest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// The world's addresses.
const (
	NodeAddr  = "203.0.113.1" // the node's uplink (Uplink), where egress is masqueraded to
	InetAddr  = "203.0.113.2" // the internet's end of the veth pair
	Upstream  = "198.51.100.10"
	Metadata  = "169.254.169.254"
	DNS       = "198.51.100.53" // answers Names with Upstream (compute-agent --net-resolvers)
	Uplink    = "up0"
	VMNetwork = "10.200.0.0/15" // routed back to the node from the internet
)

// Names resolve to Upstream in the internet's DNS; the HTTPS server's
// certificate names them too.
var Names = []string{"upstream.test", "other.test", "api.example.test"}

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
	var ln, tlsLn net.Listener
	var dns net.PacketConn
	must(t, w.Inet.Do(func() error {
		wan, err := addr("wan0", InetAddr+"/24")
		if err != nil {
			return err
		}
		for _, a := range []string{Upstream, Metadata, DNS} {
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
		if ln, err = net.Listen("tcp", "0.0.0.0:80"); err != nil {
			return err
		}
		if tlsLn, err = net.Listen("tcp", "0.0.0.0:443"); err != nil {
			return err
		}
		dns, err = net.ListenPacket("udp", DNS+":53")
		return err
	}))
	// Both servers answer with the client's address as they saw it and
	// the name it asked for (the Host; over TLS, the SNI too).
	// /bytes?n=N answers N zero bytes (throughput benchmarks).
	hello := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bytes" {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			rw.Header().Set("Content-Length", strconv.Itoa(n))
			buf := make([]byte, 64<<10)
			for n > 0 {
				k, err := rw.Write(buf[:min(n, len(buf))])
				if err != nil {
					return
				}
				n -= k
			}
			return
		}
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if r.TLS != nil {
			fmt.Fprintf(rw, "hello %s from %s over tls to %s\n", host, r.Host, r.TLS.ServerName)
			return
		}
		fmt.Fprintf(rw, "hello %s from %s\n", host, r.Host)
	})
	// RSA key exchange: busybox's TLS client (the minimal image's wget)
	// sends no signature_algorithms, without which Go's server refuses
	// every ECDHE suite of TLS 1.2.
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, CipherSuites: []uint16{
		tls.TLS_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_RSA_WITH_AES_128_CBC_SHA256, tls.TLS_RSA_WITH_AES_128_CBC_SHA}}
	for _, l := range []net.Listener{ln, tls.NewListener(tlsLn, tlsCfg)} {
		srv := &http.Server{Handler: hello}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	t.Cleanup(func() { _ = dns.Close() })
	go serveDNS(dns, netip.MustParseAddr(Upstream))
	return w
}

// selfSigned is the HTTPS server's certificate, for Names.
func selfSigned(t testing.TB) tls.Certificate {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: Names[0]}, DNSNames: Names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serveDNS answers A queries for Names with addr, others with no answer.
func serveDNS(pc net.PacketConn, addr netip.Addr) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true})
		b.EnableCompression()
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		if q.Type == dnsmessage.TypeA && slices.Contains(Names, strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")) {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: addr.As4()})
		}
		if out, err := b.Finish(); err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
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
