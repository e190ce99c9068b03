package iam

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// forwardingHeaders are the client-supplied headers that claim an address.
// They are stripped from every request: only the host's verified address
// (SourceIP) travels on.
var forwardingHeaders = []string{
	"X-Forwarded-For", "Forwarded", "X-Real-Ip", "X-Client-Ip", "True-Client-Ip",
	"Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Cluster-Client-Ip", "X-Original-Forwarded-For",
}

// isForwardingHeader reports whether k (canonical) is one of
// forwardingHeaders.
func isForwardingHeader(k string) bool {
	for _, f := range forwardingHeaders {
		if k == f {
			return true
		}
	}
	return false
}

// SourceIP returns the caller's address as the specification's sourceIp
// table defines it, given the socket peer and the trusted proxies:
//
//   - peer not a trusted proxy: the peer; forwarding headers are ignored;
//   - trusted peer: X-Forwarded-For read right to left, skipping trusted
//     hops; the first address that is not a trusted proxy;
//   - trusted peer and every hop trusted: the leftmost hop;
//   - trusted peer without X-Forwarded-For, or with a malformed hop: none.
//
// IPv4-mapped IPv6 addresses are compared as IPv4. The zero Addr is "none".
func SourceIP(remoteAddr string, xff []string, trusted []netip.Prefix) netip.Addr {
	peer, ok := parseAddr(remoteAddr)
	if !ok {
		return netip.Addr{}
	}
	if !isTrusted(peer, trusted) {
		return peer
	}
	var hops []netip.Addr
	for _, h := range xff {
		for _, part := range strings.Split(h, ",") {
			a, ok := parseAddr(strings.TrimSpace(part))
			if !ok {
				return netip.Addr{} // a malformed hop fails closed
			}
			hops = append(hops, a)
		}
	}
	if len(hops) == 0 {
		return netip.Addr{}
	}
	for i := len(hops) - 1; i >= 0; i-- {
		if !isTrusted(hops[i], trusted) {
			return hops[i]
		}
	}
	return hops[0]
}

// parseAddr reads "ip", "ip:port" or "[ipv6]:port", unmapping IPv4-mapped
// IPv6 and dropping zones.
func parseAddr(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

type sourceIPKey struct{}

// SourceIPFromContext returns the verified address of the request, if any.
func SourceIPFromContext(ctx context.Context) netip.Addr {
	a, _ := ctx.Value(sourceIPKey{}).(netip.Addr)
	return a
}

// WithSourceIP is middleware that resolves the caller's address, strips
// every client-supplied forwarding header and replaces X-Forwarded-For with
// the verified address (or none), so nothing further in sees a claim the
// host did not check.
func WithSourceIP(trusted []netip.Prefix, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := SourceIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), trusted)
		// A shallow copy with a header map of its own, not Request.Clone:
		// a deep copy of every header's values and the URL cost 6 % of the
		// server's CPU at an overload (docs/benchmarks-notes.md, "Cheaper
		// refusals"). The values' slices are shared: Header.Set replaces a
		// slice, and what Add appends lies past the server's slice's length.
		h := make(http.Header, len(r.Header)+1)
		for k, v := range r.Header {
			if !isForwardingHeader(k) {
				h[k] = v
			}
		}
		if addr.IsValid() {
			h["X-Forwarded-For"] = []string{addr.String()}
		}
		r = r.WithContext(context.WithValue(r.Context(), sourceIPKey{}, addr))
		r.Header = h
		next.ServeHTTP(w, r)
	})
}
