// Package egressproxy is compute-agent's domain filter for VMs' egress
// policies (network.DomainFilter): a transparent TCP proxy on the node.
// The network manager's nftables rules redirect a filtered VM's TCP 80
// and 443 here (only for destinations the platform deny set and the VM's
// deny list let through, and not in its allowed CIDRs); the proxy finds
// the VM by the connection's source address, reads the TLS ClientHello's
// server name (SNI) or the HTTP Host, and when the VM's allow list admits
// that name it connects to the original destination (SO_ORIGINAL_DST)
// and splices the two connections; otherwise it resets the connection.
// See docs/networking.md.
package egressproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config is a proxy's settings.
type Config struct {
	// NetNS is the path of the network namespace the proxy listens and
	// dials in (the network manager's, tests); "" is the agent's own.
	NetNS string
	// PeekTimeout bounds the wait for a client's first bytes (10 s when
	// zero); DialTimeout the connection to the destination (10 s).
	PeekTimeout, DialTimeout time.Duration
	// MaxConnsPerVM bounds a VM's open proxied connections (1024 when
	// zero); beyond it new ones are reset.
	MaxConnsPerVM int
	Log           *slog.Logger
}

// Proxy is the node's domain filter. Its methods are safe for concurrent
// use.
type Proxy struct {
	cfg  Config
	ns   netns.NsHandle // -1: the agent's own
	ln   *net.TCPListener
	port uint16
	wg   sync.WaitGroup

	mu     sync.Mutex
	byAddr map[netip.Addr]*vm
	byID   map[string]*vm
	closed bool
}

// vm is one filtered VM: its allow list, the check every destination
// must pass, and its open connections.
type vm struct {
	id        string
	addr      netip.Addr
	allow     Allowed
	reachable func(netip.Addr) bool
	conns     map[*flow]struct{}
}

// flow is one proxied connection.
type flow struct {
	name       string
	dst        netip.AddrPort
	client, up *net.TCPConn
}

// New listens on a port of its own on every IPv4 address of the
// namespace and serves until Close.
func New(cfg Config) (*Proxy, error) {
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConnsPerVM <= 0 {
		cfg.MaxConnsPerVM = 1024
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, ns: -1, byAddr: map[netip.Addr]*vm{}, byID: map[string]*vm{}}
	if cfg.NetNS != "" {
		h, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("egressproxy: %w", err)
		}
		p.ns = h
	}
	err := p.inNS(func() error {
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4zero})
		p.ln = ln
		return err
	})
	if err != nil {
		p.closeNS()
		return nil, fmt.Errorf("egressproxy: listen: %w", err)
	}
	p.port = uint16(p.ln.Addr().(*net.TCPAddr).Port)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Port is the TCP port the proxy listens on (network.DomainFilter).
func (p *Proxy) Port() uint16 { return p.port }

// Set filters a VM's redirected connections by allow from now on, and
// resets its open ones whose name allow no longer admits or whose
// destination reachable no longer lets through (a policy change cuts
// open connections, as the manager's rules do for routed ones). An empty
// allow list stops filtering the VM (its connections are no longer
// redirected).
func (p *Proxy) Set(vmID string, addr netip.Addr, allow []string, reachable func(netip.Addr) bool) error {
	a := NewAllowed(allow)
	if a.Empty() {
		return p.Remove(vmID)
	}
	if !addr.Is4() || reachable == nil {
		return fmt.Errorf("egressproxy: VM %s needs an IPv4 address and a reachability check", vmID)
	}
	p.mu.Lock()
	v := p.byID[vmID]
	if v == nil {
		v = &vm{id: vmID, conns: map[*flow]struct{}{}}
		p.byID[vmID] = v
	}
	if v.addr.IsValid() && v.addr != addr && p.byAddr[v.addr] == v {
		delete(p.byAddr, v.addr)
	}
	v.addr, v.allow, v.reachable = addr, a, reachable
	p.byAddr[addr] = v
	var cut []*net.TCPConn
	for f := range v.conns {
		if !a.Admits(f.name) || !reachable(f.dst.Addr()) {
			cut = append(cut, v.cutLocked(f)...)
		}
	}
	p.mu.Unlock()
	resetAll(cut)
	return nil
}

// Remove stops filtering a VM and resets its open connections.
func (p *Proxy) Remove(vmID string) error {
	p.mu.Lock()
	v := p.byID[vmID]
	var cut []*net.TCPConn
	if v != nil {
		delete(p.byID, vmID)
		if p.byAddr[v.addr] == v {
			delete(p.byAddr, v.addr)
		}
		for f := range v.conns {
			cut = append(cut, v.cutLocked(f)...)
		}
	}
	p.mu.Unlock()
	resetAll(cut)
	return nil
}

// Close stops listening, resets every open connection and waits for
// their goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	var cut []*net.TCPConn
	for _, v := range p.byID {
		for f := range v.conns {
			cut = append(cut, v.cutLocked(f)...)
		}
	}
	p.mu.Unlock()
	err := p.ln.Close()
	resetAll(cut)
	p.wg.Wait()
	p.closeNS()
	return err
}

func (p *Proxy) closeNS() {
	if p.ns >= 0 {
		_ = p.ns.Close()
	}
}

// inNS runs f in the proxy's namespace, on a thread thrown away
// afterwards (a socket keeps the namespace it was made in).
func (p *Proxy) inNS(f func() error) error {
	if p.ns < 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(p.ns); err != nil {
			errc <- fmt.Errorf("egressproxy: enter namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.cfg.Log.Warn("egressproxy: accept", "error", err.Error())
			time.Sleep(50 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// handle decides one redirected connection and splices it when admitted.
func (p *Proxy) handle(c *net.TCPConn) {
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	dst, err := originalDst(c)
	if err != nil || dst == c.LocalAddr().(*net.TCPAddr).AddrPort() {
		resetConn(c) // not redirected: no one's to decide
		return
	}
	p.mu.Lock()
	v := p.byAddr[src.Addr().Unmap()]
	p.mu.Unlock()
	if v == nil {
		resetConn(c)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout))
	name, seen, err := peekName(c)
	_ = c.SetReadDeadline(time.Time{})
	f := &flow{name: name, dst: dst, client: c}
	if !p.admit(v, f, err) {
		resetConn(c)
		return
	}
	defer p.forget(v, f)
	var up *net.TCPConn
	err = p.inNS(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
		defer cancel()
		d := net.Dialer{}
		uc, err := d.DialContext(ctx, "tcp4", dst.String())
		if err == nil {
			up = uc.(*net.TCPConn)
		}
		return err
	})
	if err != nil {
		p.cfg.Log.Debug("egressproxy: dial", "vm", v.id, "name", name, "dst", dst.String(), "error", err.Error())
		resetConn(c)
		return
	}
	if !p.attach(v, f, up) { // reset while dialing
		resetConn(up)
		return
	}
	if _, err := up.Write(seen); err != nil {
		resetAll([]*net.TCPConn{c, up})
		return
	}
	splice(c, up)
}

// admit checks a peeked connection against the VM's policy as it is now
// and records it as open.
func (p *Proxy) admit(v *vm, f *flow, peekErr error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed || p.byID[v.id] != v:
		return false
	case peekErr != nil:
		p.cfg.Log.Debug("egressproxy: refused", "vm", v.id, "dst", f.dst.String(), "error", peekErr.Error())
		return false
	case !v.allow.Admits(f.name), !v.reachable(f.dst.Addr()):
		p.cfg.Log.Debug("egressproxy: refused", "vm", v.id, "name", f.name, "dst", f.dst.String())
		return false
	case len(v.conns) >= p.cfg.MaxConnsPerVM:
		p.cfg.Log.Warn("egressproxy: too many connections", "vm", v.id, "max", p.cfg.MaxConnsPerVM)
		return false
	}
	v.conns[f] = struct{}{}
	return true
}

// attach gives an admitted flow its upstream, unless the flow was reset
// meanwhile.
func (p *Proxy) attach(v *vm, f *flow, up *net.TCPConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, open := v.conns[f]; !open {
		return false
	}
	f.up = up
	return true
}

func (p *Proxy) forget(v *vm, f *flow) {
	p.mu.Lock()
	delete(v.conns, f)
	p.mu.Unlock()
}

// cutLocked forgets an open flow and returns its connections, for the
// caller to reset once the proxy's lock is released (a flow cut while
// dialing gets no upstream: attach refuses it).
func (v *vm) cutLocked(f *flow) []*net.TCPConn {
	delete(v.conns, f)
	if f.up != nil {
		return []*net.TCPConn{f.client, f.up}
	}
	return []*net.TCPConn{f.client}
}

func resetAll(cs []*net.TCPConn) {
	for _, c := range cs {
		resetConn(c)
	}
}

// resetConn closes c with a TCP reset (no lingering FIN).
func resetConn(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// splice copies both ways (splice(2) between TCP sockets on Linux), a
// half-close passed on, until both directions end.
func splice(a, b *net.TCPConn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src *net.TCPConn) {
		_, _ = io.Copy(dst, src)
		_ = dst.CloseWrite()
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	_ = a.Close()
	_ = b.Close()
}

// originalDst is where the client meant to connect before the redirect
// (conntrack's SO_ORIGINAL_DST).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// A sockaddr_in in an IPv6Mreq's 20 bytes: the usual way to read
		// SO_ORIGINAL_DST with x/sys/unix.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		port := uint16(b[2])<<8 | uint16(b[3])
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if err == nil {
		err = serr
	}
	return out, err
}
