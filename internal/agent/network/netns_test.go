package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// Every test works in network namespaces it makes: "node" (where the
// manager works), "inet" (the internet: an HTTP and a DNS server), and
// one per fake VM (a tap pumped to the VM's tap on the node, as qemu
// does). Nothing touches the host's own namespace; deleting a namespace
// removes everything in it.

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("!!! SKIPPED: internal/agent/network tests need root (network namespaces, taps, nftables); run them as root !!!")
	}
}

type ns struct {
	name string
	h    netns.NsHandle
}

func (n ns) path() string { return "/var/run/netns/" + n.name }

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// newNS makes a named namespace, deleted when the test ends.
func newNS(t testing.TB, role string) ns {
	t.Helper()
	name := "cptest-" + randHex(6) + "-" + role
	errc := make(chan error, 1)
	var h netns.NsHandle
	go func() {
		runtime.LockOSThread() // left in the new namespace: the thread dies with the goroutine
		var err error
		h, err = netns.NewNamed(name)
		errc <- err
	}()
	require.NoError(t, <-errc)
	t.Cleanup(func() { _ = h.Close(); _ = netns.DeleteNamed(name) })
	n := ns{name, h}
	n.run(t, func() error { return netlink.LinkSetUp(must(netlink.LinkByName("lo"))) })
	return n
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// do runs f on a thread of its own inside n.
func (n ns) do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(n.h); err != nil {
			errc <- err
			return
		}
		defer func() {
			if r := recover(); r != nil {
				errc <- fmt.Errorf("panic: %v", r)
			}
		}()
		errc <- f()
	}()
	return <-errc
}

func (n ns) run(t testing.TB, f func() error) {
	t.Helper()
	require.NoError(t, n.do(f))
}

func addAddr(name, cidr string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	return netlink.AddrAdd(l, a)
}

func defaultRoute(via string) error {
	return netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP(via)})
}

// world is a node joined to an internet by a veth pair (up0 on the node,
// 203.0.113.1; wan0 in the internet, 203.0.113.2).
type world struct {
	node, inet ns
}

const (
	nodeAddr     = "203.0.113.1"
	upstream     = "198.51.100.10"
	upstream2    = "198.51.100.11"
	dnsAddr      = "198.51.100.53"
	serviceAddr  = "198.51.100.99" // "the API" elsewhere: Config.Deny
	metadata     = "169.254.169.254"
	allowedPriv  = "10.99.0.1" // inside Config.AllowPrivate
	deniedPriv   = "10.98.0.1"
	bigBodyBytes = 200 << 10
)

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{node: newNS(t, "node"), inet: newNS(t, "inet")}
	w.node.run(t, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "wan0"}); err != nil {
			return err
		}
		wan := must(netlink.LinkByName("wan0"))
		if err := netlink.LinkSetNsFd(wan, int(w.inet.h)); err != nil {
			return err
		}
		if err := addAddr("up0", nodeAddr+"/24"); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(must(netlink.LinkByName("up0"))); err != nil {
			return err
		}
		return defaultRoute("203.0.113.2")
	})
	w.inet.run(t, func() error {
		if err := addAddr("wan0", "203.0.113.2/24"); err != nil {
			return err
		}
		for _, a := range []string{upstream, upstream2, dnsAddr, serviceAddr, metadata, allowedPriv, deniedPriv} {
			if err := addAddr("lo", a+"/32"); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(must(netlink.LinkByName("wan0"))); err != nil {
			return err
		}
		// A route back into the VM pools, so that "nothing inbound" is the
		// node's filtering and not a missing route.
		_, pools, _ := net.ParseCIDR("10.200.0.0/15")
		return netlink.RouteAdd(&netlink.Route{Dst: pools, Gw: net.ParseIP(nodeAddr)})
	})
	// The internet's servers: HTTP on port 80 (and 25) of every address,
	// DNS for upstream.test.
	for _, port := range []string{":80", ":25"} {
		ln := w.inet.listen(t, "0.0.0.0"+port)
		srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/big" {
				n := bigBodyBytes
				if v, err := strconv.Atoi(r.URL.Query().Get("n")); err == nil {
					n = v
				}
				_, _ = rw.Write(make([]byte, n))
				return
			}
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprint(rw, host)
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	var pc net.PacketConn
	w.inet.run(t, func() (err error) { pc, err = net.ListenPacket("udp", dnsAddr+":53"); return err })
	t.Cleanup(func() { _ = pc.Close() })
	go serveDNS(pc, "upstream.test.", netip.MustParseAddr(upstream))
	// Services of the node itself.
	for _, a := range []string{nodeAddr + ":8080", "0.0.0.0:8081"} {
		w.node.accept(t, a)
	}
	return w
}

// listen opens a TCP listener inside n.
func (n ns) listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	n.run(t, func() (err error) { ln, err = net.Listen("tcp", addr); return err })
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// accept listens inside n and answers every connection with "hello".
func (n ns) accept(t testing.TB, addr string) {
	ln := n.listen(t, addr)
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

func serveDNS(pc net.PacketConn, name string, addr netip.Addr) {
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
		rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}
		b := dnsmessage.NewBuilder(nil, rh)
		b.EnableCompression()
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		if strings.EqualFold(q.Name.String(), name) && q.Type == dnsmessage.TypeA {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: addr.As4()})
		}
		out, err := b.Finish()
		if err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}

// fakeVM is a namespace whose eth0 is a tap pumped to the VM's tap on the
// node, frame by frame, as qemu's virtio-net does.
type fakeVM struct {
	ns
	spec VM
}

type ifreq struct {
	name  [16]byte
	flags uint16
	_     [22]byte
}

// openTap attaches to (or makes) the tap called name in the calling
// thread's namespace.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var req ifreq
	copy(req.name[:], name)
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); e != 0 {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, e)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

func pump(dst, src *os.File) {
	buf := make([]byte, 65536)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil && errors.Is(err, os.ErrClosed) {
			return
		}
	}
}

// startVM adds spec to m and plugs a fresh namespace into its tap.
func (w *world) startVM(t *testing.T, m *Manager, spec VM) *fakeVM {
	t.Helper()
	port, err := m.Add(spec)
	require.NoError(t, err)
	v := &fakeVM{ns: newNS(t, "vm"), spec: spec}
	var host, guest *os.File
	w.node.run(t, func() (err error) { host, err = openTap(port.Tap); return err })
	v.run(t, func() error {
		var err error
		if guest, err = openTap("eth0"); err != nil {
			return err
		}
		eth := must(netlink.LinkByName("eth0"))
		if err := netlink.LinkSetHardwareAddr(eth, must(net.ParseMAC(spec.MAC))); err != nil {
			return err
		}
		if err := addAddr("eth0", spec.Address.String()); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return err
		}
		if spec.Gateway.IsValid() {
			return defaultRoute(spec.Gateway.String())
		}
		return nil
	})
	go pump(host, guest)
	go pump(guest, host)
	t.Cleanup(func() { _ = host.Close(); _ = guest.Close() })
	return v
}

// dial connects from inside n, with a short timeout (a dropped SYN is a
// timeout).
func (n ns) dial(addr string) error {
	return n.dialFrom("", addr)
}

func (n ns) dialFrom(local, addr string) error {
	return n.do(func() error {
		d := net.Dialer{Timeout: 600 * time.Millisecond}
		if local != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
		}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// get fetches url from inside n, resolving names with the internet's DNS.
func (n ns) get(url string) (string, error) {
	dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.do(func() (err error) {
			d := net.Dialer{Timeout: time.Second}
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dialer(ctx, network, dnsAddr+":53")
	}}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			if net.ParseIP(host) == nil {
				ips, err := res.LookupNetIP(ctx, "ip4", host)
				if err != nil {
					return nil, err
				}
				addr = net.JoinHostPort(ips[0].String(), port)
			}
			return dialer(ctx, network, addr)
		}}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
