package webhooks

// The SSRF table: every forbidden address form is refused as a literal in
// the URL (create and update), as what a DNS name resolves to (at connect
// time, through the resolver hook and the dialer's Control function), and
// as the target of a redirect (never followed).

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

// forbidden lists one address of each range the guard refuses.
var forbidden = []struct{ addr, reason string }{
	{"0.0.0.0", "unspecified or this network"},
	{"0.1.2.3", "unspecified or this network"},
	{"10.1.2.3", "private"},
	{"100.64.0.1", "shared address space (CGNAT)"},
	{"100.127.255.254", "shared address space (CGNAT)"},
	{"127.0.0.1", "loopback"},
	{"127.255.0.9", "loopback"},
	{"169.254.169.254", "link-local"},
	{"172.16.0.1", "private"},
	{"172.31.255.255", "private"},
	{"192.0.0.8", "IETF protocol assignments"},
	{"192.0.2.10", "documentation"},
	{"192.88.99.1", "6to4 relay anycast"},
	{"192.168.1.1", "private"},
	{"198.18.0.1", "benchmarking"},
	{"198.51.100.7", "documentation"},
	{"203.0.113.9", "documentation"},
	{"224.0.0.251", "multicast"},
	{"239.255.255.250", "multicast"},
	{"240.0.0.1", "reserved or broadcast"},
	{"255.255.255.255", "reserved or broadcast"},
	{"::", "unspecified"},
	{"::1", "loopback"},
	{"::ffff:127.0.0.1", "IPv4-mapped IPv6"},
	{"::ffff:10.0.0.1", "IPv4-mapped IPv6"},
	{"::ffff:8.8.8.8", "IPv4-mapped IPv6"},
	{"::127.0.0.1", "not global unicast"}, // IPv4-compatible
	{"64:ff9b::a00:1", "not global unicast"},
	{"100::1", "not global unicast"},
	{"fe80::1", "link-local"},
	{"fec0::1", "not global unicast"},
	{"fc00::1", "unique-local"},
	{"fd12:3456::1", "unique-local"},
	{"ff02::1", "multicast"},
	{"2001::1", "Teredo (embeds IPv4)"},
	{"2001:2::1", "IETF protocol assignments"},
	{"2001:db8::1", "documentation"},
	{"2002:a00:1::1", "6to4 (embeds IPv4)"},
	{"3fff::1", "documentation"},
}

var public = []string{"8.8.8.8", "1.1.1.1", "93.184.216.34", "100.63.255.255", "100.128.0.1", "172.32.0.1", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"}

func TestForbiddenAddresses(t *testing.T) {
	t.Parallel()
	for _, f := range forbidden {
		reason, bad := Forbidden(netip.MustParseAddr(f.addr))
		assert.True(t, bad, f.addr)
		assert.Equal(t, f.reason, reason, f.addr)
	}
	for _, p := range public {
		_, bad := Forbidden(netip.MustParseAddr(p))
		assert.False(t, bad, p)
	}
	_, bad := Forbidden(netip.MustParseAddr("fe80::1%eth0"))
	assert.True(t, bad, "scoped addresses")
}

func urlHost(addr string) string {
	if strings.Contains(addr, ":") {
		return "[" + addr + "]"
	}
	return addr
}

func TestCheckURLRefusesLiteralForbiddenAddresses(t *testing.T) {
	t.Parallel()
	for _, f := range forbidden {
		err := CheckURL("https://"+urlHost(f.addr)+"/hook", false)
		require.Error(t, err, f.addr)
		var e *api.Error
		require.True(t, errors.As(err, &e))
		assert.Equal(t, api.CodeInvalidInput, e.Code, f.addr)
		assert.Contains(t, e.Message, "non-public", f.addr)
		// The deployment switch lets them through.
		assert.NoError(t, CheckURL("https://"+urlHost(f.addr)+"/hook", true), f.addr)
	}
	for _, p := range public {
		assert.NoError(t, CheckURL("https://"+urlHost(p)+":8443/hook?x=1", false), p)
	}
}

func TestCheckURLShape(t *testing.T) {
	t.Parallel()
	ok := []string{
		"https://hooks.example.com/in", "https://HOOKS.example.com", "https://hooks.example.com:8443/a?b=c",
		"https://example.com./x", "https://xn--bcher-kva.example/", "https://a-b.c0m/",
	}
	for _, u := range ok {
		assert.NoError(t, CheckURL(u, false), u)
	}
	bad := map[string]string{
		"http://hooks.example.com/":                    "https",
		"ftp://hooks.example.com/":                     "https",
		"/relative":                                    "absolute",
		"hooks.example.com/x":                          "absolute",
		"https:opaque":                                 "absolute",
		"https://user:pw@hooks.example.com/":           "credentials",
		"https://user@hooks.example.com/":              "credentials",
		"https:///path":                                "host",
		"https://hooks.example.com/#frag":              "fragment",
		"https://hooks.example.com/#":                  "fragment",
		"https://hooks.example.com:0/":                 "port",
		"https://hooks.example.com:70000/":             "port",
		"https://localhost/":                           "non-public",
		"https://LOCALHOST.:8443/":                     "non-public",
		"https://api.localhost/":                       "non-public",
		"https://2130706433/":                          "DNS name",
		"https://0x7f000001/":                          "DNS name",
		"https://127.1/":                               "DNS name",
		"https://0177.0.0.1/":                          "DNS name",
		"https://hooks_1.example.com/":                 "DNS name",
		"https://-bad.example.com/":                    "DNS name",
		"https://[fe80::1%25eth0]/":                    "zone",
		"https://bücher.example/":                      "DNS name",
		"https://%31%32%37.0.0.1/":                     "",
		"https://example.com:443:443/":                 "",
		"https://[::1/":                                "",
		"https://" + strings.Repeat("a", 64) + ".com/": "DNS name",
	}
	for u, want := range bad {
		err := CheckURL(u, false)
		require.Error(t, err, u)
		var e *api.Error
		require.True(t, errors.As(err, &e), u)
		assert.Equal(t, api.CodeInvalidInput, e.Code, u)
		assert.Contains(t, e.Message, want, u)
	}
	// The switch lifts address checks, not the shape.
	assert.NoError(t, CheckURL("https://localhost:8443/", true))
	assert.Error(t, CheckURL("http://localhost:8443/", true))
	assert.Error(t, CheckURL("https://u:p@localhost/", true))
}

// post sends one POST through a delivery client and returns the error.
func post(t *testing.T, c *http.Client, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader("{}"))
	require.NoError(t, err)
	resp, err := c.Do(req)
	if resp != nil {
		_ = resp.Body.Close()
	}
	return resp, err
}

func requireForbidden(t *testing.T, err error, addr string) {
	t.Helper()
	require.Error(t, err, addr)
	f, ok := isForbiddenDial(err)
	require.Truef(t, ok, "%s: not refused by the guard: %v", addr, err)
	assert.Equal(t, netip.MustParseAddr(addr), f.Addr)
}

func TestConnectRefusesLiteralForbiddenAddresses(t *testing.T) {
	t.Parallel()
	c := newClient(guard{}, nil, nil)
	for _, f := range forbidden {
		_, err := post(t, c, "https://"+urlHost(f.addr)+":1/hook")
		requireForbidden(t, err, f.addr)
	}
}

// A name resolving to a forbidden address is refused when connecting,
// whatever it resolved to when the webhook was made (DNS rebinding).
func TestConnectRefusesNamesResolvingToForbiddenAddresses(t *testing.T) {
	t.Parallel()
	for _, f := range forbidden {
		resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
			require.Equal(t, "rebind.example.com", host)
			return []netip.Addr{netip.MustParseAddr(f.addr)}, nil
		}
		require.NoError(t, CheckURL("https://rebind.example.com/hook", false), "the name passes the URL check")
		c := newClient(guard{}, resolve, nil)
		_, err := post(t, c, "https://rebind.example.com:1/hook")
		requireForbidden(t, err, f.addr)
	}
	// One forbidden address among public ones refuses the name.
	mixed := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("10.0.0.1")}, nil
	}
	_, err := post(t, newClient(guard{}, mixed, nil), "https://mixed.example.com:1/")
	requireForbidden(t, err, "10.0.0.1")

	// The system resolver: localhost is loopback.
	_, err = post(t, newClient(guard{}, nil, nil), "https://localhost:1/hook")
	require.Error(t, err)
	_, ok := isForbiddenDial(err)
	assert.True(t, ok, "localhost refused: %v", err)
}

// The dialer's Control function checks the address actually dialed, after
// any resolution, so even a resolver the guard did not see is covered.
func TestControlChecksTheDialedAddress(t *testing.T) {
	t.Parallel()
	g := guard{}
	for _, f := range forbidden {
		err := g.control("tcp", net.JoinHostPort(f.addr, "443"), nil)
		var fe *ForbiddenAddressError
		require.ErrorAs(t, err, &fe, f.addr)
	}
	for _, p := range public {
		assert.NoError(t, g.control("tcp", net.JoinHostPort(p, "443"), nil), p)
	}
	assert.Error(t, g.control("tcp", "not-an-address:443", nil))
	assert.NoError(t, guard{allowPrivate: true}.control("tcp", "127.0.0.1:443", nil))
	// A real dial through a dialer with only the Control function.
	d := &net.Dialer{Control: g.control}
	_, err := d.DialContext(t.Context(), "tcp", "127.0.0.1:1")
	var fe *ForbiddenAddressError
	require.ErrorAs(t, err, &fe)
}

// Redirects are answered as they are: a receiver that redirects to a
// forbidden address (or anywhere) gets no request there, and the 3xx is a
// failed attempt.
func TestRedirectsAreNeverFollowed(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	target := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer target.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		for _, to := range []string{"https://169.254.169.254/latest/meta-data/", "https://10.0.0.1/", "https://[::1]/", target.URL + "/x"} {
			redirector := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, to, code)
			}))
			// The redirector is on loopback: the guard admits it (and, as
			// loopback, the local target too; hits shows it was not asked).
			addr := netip.MustParseAddrPort(redirector.Listener.Addr().String()).Addr()
			g := guard{allow: func(a netip.Addr) bool { return a == addr }}
			c := newClient(g, nil, redirector.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
			resp, err := post(t, c, redirector.URL+"/hook")
			require.NoError(t, err, to)
			assert.Equal(t, code, resp.StatusCode, "the 3xx itself is the answer")
			assert.Equal(t, OutcomeRetry, decide(result{status: resp.StatusCode}, 1, time.Now(), 0.5).outcome, "a 3xx is a failure")
			redirector.Close()
		}
	}
	assert.Zero(t, hits.Load(), "no redirect was followed")
}
