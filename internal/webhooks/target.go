package webhooks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"computeplane/gen/api"
)

// Webhook targets must be public: a webhook URL is chosen by a tenant, and
// the service's own network (metadata endpoints, the database, internal
// APIs) must not become reachable through it. The check runs twice: on the
// URL when a webhook is created or updated (literal addresses and names
// that are local by definition), and on every address a delivery connects
// to (a net.Dialer Control function), so a DNS name that resolves, or
// starts resolving, to a forbidden address (DNS rebinding) is refused at
// connect time. Redirects are never followed, so a receiver cannot send a
// delivery on to a forbidden address either.

// ForbiddenAddressError is a connection refused because its address is
// not public.
type ForbiddenAddressError struct {
	Addr   netip.Addr
	Reason string
}

func (e *ForbiddenAddressError) Error() string {
	return fmt.Sprintf("target address %s is not public (%s)", e.Addr, e.Reason)
}

// special lists the address ranges no webhook may reach, each with the
// reason a refusal names. IPv6 addresses outside 2000::/3 (global unicast)
// are refused as well (see Forbidden).
var special = func() []struct {
	prefix netip.Prefix
	reason string
} {
	rows := []struct{ prefix, reason string }{
		// IPv4 (RFC 6890 and its updates).
		{"0.0.0.0/8", "unspecified or this network"},
		{"10.0.0.0/8", "private"},
		{"100.64.0.0/10", "shared address space (CGNAT)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local"},
		{"172.16.0.0/12", "private"},
		{"192.0.0.0/24", "IETF protocol assignments"},
		{"192.0.2.0/24", "documentation"},
		{"192.31.196.0/24", "AS112"},
		{"192.52.193.0/24", "AMT"},
		{"192.88.99.0/24", "6to4 relay anycast"},
		{"192.168.0.0/16", "private"},
		{"192.175.48.0/24", "AS112"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation"},
		{"203.0.113.0/24", "documentation"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved or broadcast"},
		// IPv6 inside 2000::/3 that is not globally reachable, or that
		// embeds an IPv4 address a relay would turn into any IPv4 target.
		{"2001::/32", "Teredo (embeds IPv4)"},
		{"2001::/23", "IETF protocol assignments"},
		{"2001:db8::/32", "documentation"},
		{"2002::/16", "6to4 (embeds IPv4)"},
		{"3fff::/20", "documentation"},
	}
	out := make([]struct {
		prefix netip.Prefix
		reason string
	}, len(rows))
	for i, r := range rows {
		out[i].prefix, out[i].reason = netip.MustParsePrefix(r.prefix), r.reason
	}
	return out
}()

var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// Forbidden reports whether a webhook may not reach a, and why: loopback,
// private, link-local, multicast, CGNAT, unspecified, IPv4-mapped IPv6,
// unique-local, documentation and every other range that is not public.
func Forbidden(a netip.Addr) (reason string, forbidden bool) {
	switch {
	case !a.IsValid():
		return "invalid", true
	case a.Zone() != "":
		return "scoped (zone)", true
	case a.Is4In6():
		return "IPv4-mapped IPv6", true
	case a.Is6() && a.IsLoopback():
		return "loopback", true
	case a.Is6() && a.IsUnspecified():
		return "unspecified", true
	case a.Is6() && a.IsLinkLocalUnicast():
		return "link-local", true
	case a.Is6() && a.IsMulticast():
		return "multicast", true
	case a.Is6() && a.IsPrivate():
		return "unique-local", true
	}
	for _, s := range special {
		if s.prefix.Contains(a) {
			return s.reason, true
		}
	}
	if a.Is6() && !globalUnicast6.Contains(a) {
		// ::/96 (IPv4-compatible), 64:ff9b::/96 (NAT64), 100::/64
		// (discard), fec0::/10 (site-local) and everything unassigned.
		return "not global unicast", true
	}
	return "", false
}

// guard decides which addresses deliveries may connect to.
type guard struct {
	allowPrivate bool
	// allow, when set, admits addresses Forbidden refuses (tests reach
	// their own receivers on loopback while checking the others).
	allow func(netip.Addr) bool
}

func (g guard) check(a netip.Addr) error {
	if g.allowPrivate || (g.allow != nil && g.allow(a)) {
		return nil
	}
	if reason, bad := Forbidden(a); bad {
		return &ForbiddenAddressError{Addr: a, Reason: reason}
	}
	return nil
}

// control is the net.Dialer Control function: it sees the address each
// connection is about to be made to, after any name resolution.
func (g guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhooks: cannot check the address %q", address)
	}
	return g.check(ap.Addr())
}

// Resolver looks a host name up; the default is net.DefaultResolver.
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

func defaultResolve(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// newClient returns the HTTP client of deliveries: no proxy, names
// resolved by resolve, every resolved address checked by g before dialing
// and again by the dialer's Control function on the address actually
// dialed, and redirects answered as they are (never followed).
func newClient(g guard, resolve Resolver, roots *x509.CertPool) *http.Client {
	if resolve == nil {
		resolve = defaultResolve
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: g.control}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else if addrs, err = resolve(ctx, host); err != nil {
			return nil, err
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("webhooks: %s has no address", host)
		}
		// One forbidden address refuses the name: a public name has none.
		for _, a := range addrs {
			if err := g.check(a); err != nil {
				return nil, err
			}
		}
		var first error
		for _, a := range addrs {
			conn, err := dialer.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
			if err == nil {
				return conn, nil
			}
			if first == nil {
				first = err
			}
		}
		return nil, first
	}
	transport := &http.Transport{
		Proxy:                  nil, // a proxy would resolve and connect where the guard cannot see
		DialContext:            dial,
		TLSClientConfig:        &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// CheckURL is rule 2: an absolute https URL without credentials (or a
// fragment, which is never sent), whose host is a DNS name or a public
// address. A name that is local by definition (localhost, *.localhost) or
// that only looks like a DNS name (an address in another notation, such as
// 2130706433 or 0x7f.1) is refused as well; every other name is checked
// when a delivery connects. allowPrivate lifts the address checks.
func CheckURL(raw string, allowPrivate bool) error {
	bad := func(format string, args ...any) error {
		return api.Errorf(api.CodeInvalidInput, "url: "+format, args...).WithDetails(map[string]any{"path": "url"})
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return bad("not a valid URL")
	case !u.IsAbs() || u.Opaque != "":
		return bad("must be an absolute https URL")
	case u.Scheme != "https":
		return bad("must use https, not %s", u.Scheme)
	case u.User != nil:
		return bad("must not carry credentials")
	case u.Host == "" || u.Hostname() == "":
		return bad("must name a host")
	case u.Fragment != "" || strings.HasSuffix(raw, "#"):
		return bad("must not have a fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("port must be from 1 to 65535")
		}
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return bad("must not name a scoped (zone) address")
		}
		if allowPrivate {
			return nil
		}
		if reason, forbidden := Forbidden(a); forbidden {
			return bad("must not point to a non-public address (%s is %s)", a, reason)
		}
		return nil
	}
	if !isDNSName(host) {
		return bad("host must be a DNS name or an IP address")
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if allowPrivate {
		return nil
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return bad("must not point to a non-public address (%s is loopback)", host)
	}
	return nil
}

// isDNSName accepts letters, digits and hyphens in labels of 1 to 63
// characters, at most 253 in all, an optional final dot, and a last label
// that is not all digits (nor 0x-hex): those are addresses in disguise.
func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := strings.ToLower(labels[len(labels)-1])
	numeric := true
	for i := 0; i < len(last); i++ {
		if last[i] < '0' || last[i] > '9' {
			numeric = false
			break
		}
	}
	if numeric {
		return false
	}
	if strings.HasPrefix(last, "0x") {
		if _, err := strconv.ParseUint(last[2:], 16, 64); err == nil || last == "0x" {
			return false
		}
	}
	return true
}

// isForbiddenDial tells a refusal by the guard from other dial errors.
func isForbiddenDial(err error) (*ForbiddenAddressError, bool) {
	var f *ForbiddenAddressError
	ok := errors.As(err, &f)
	return f, ok
}
