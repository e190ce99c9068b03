package iam

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One row per line of the specification's sourceIp table, plus the
// IPv4-mapped rule.
func TestSourceIPTable(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	cases := []struct {
		name   string
		remote string
		xff    []string
		want   string // "" is none
	}{
		{"peer not a trusted proxy: the peer, headers ignored", "203.0.113.7:5000", []string{"198.51.100.1"}, "203.0.113.7"},
		{"trusted proxy: right to left, first untrusted hop", "10.0.0.1:443", []string{"198.51.100.1, 203.0.113.9, 10.1.1.1"}, "203.0.113.9"},
		{"trusted proxy: several header lines read as one list", "10.0.0.1:443", []string{"198.51.100.1", "203.0.113.9, 10.2.2.2"}, "203.0.113.9"},
		{"trusted proxy and every hop trusted: leftmost", "10.0.0.1:443", []string{"10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"trusted proxy without X-Forwarded-For: none", "10.0.0.1:443", nil, ""},
		{"trusted proxy with a malformed hop: none", "10.0.0.1:443", []string{"198.51.100.1, not-an-ip, 10.1.1.1"}, ""},
		{"trusted proxy with an empty hop: none", "10.0.0.1:443", []string{"198.51.100.1,,10.1.1.1"}, ""},
		{"IPv4-mapped IPv6 peer compared as IPv4 (trusted)", "[::ffff:10.0.0.1]:443", []string{"203.0.113.9"}, "203.0.113.9"},
		{"IPv4-mapped IPv6 hop compared as IPv4", "10.0.0.1:443", []string{"::ffff:203.0.113.9, ::ffff:10.1.1.1"}, "203.0.113.9"},
		{"IPv4-mapped untrusted peer answered as IPv4", "[::ffff:203.0.113.7]:5000", nil, "203.0.113.7"},
		{"IPv6 trusted proxy", "[fd00::1]:443", []string{"2001:db8::5"}, "2001:db8::5"},
		{"no trusted proxies configured: the peer", "10.0.0.1:443", []string{"198.51.100.1"}, "10.0.0.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := trusted
			if c.name == "no trusted proxies configured: the peer" {
				tr = nil
			}
			got := SourceIP(c.remote, c.xff, tr)
			if c.want == "" {
				assert.False(t, got.IsValid(), "got %s", got)
				return
			}
			assert.Equal(t, netip.MustParseAddr(c.want), got)
		})
	}
}

func FuzzSourceIP(f *testing.F) {
	f.Add("10.0.0.1:443", "198.51.100.1, 10.1.1.1")
	f.Add("[::ffff:10.0.0.1]:1", "x")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		got := SourceIP(remote, []string{xff}, trusted)
		if got.IsValid() && got.Is4In6() {
			t.Fatalf("mapped address escaped: %s", got)
		}
	})
}

func TestNormalizeOrigin(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://Compute.Example.com":         "https://compute.example.com",
		"https://compute.example.com:443":     "https://compute.example.com",
		"http://localhost:80":                 "http://localhost",
		"http://localhost:3000":               "http://localhost:3000",
		"https://compute.example.com/app?x=1": "https://compute.example.com",
		"HTTPS://compute.example.com:8443/":   "https://compute.example.com:8443",
		"http://[::1]:3000":                   "http://[::1]:3000",
		"null":                                "",
		"":                                    "",
		"ftp://compute.example.com":           "",
	} {
		got, ok := normalizeOrigin(in)
		assert.Equal(t, want, got, in)
		assert.Equal(t, want != "", ok, in)
	}
}

// TestWithSourceIPStripsClaimsAndLeavesTheRequestAlone: what the handler
// sees has no client-supplied forwarding header, X-Forwarded-For is the
// verified address, every other header is there; the request the server
// passed in is not changed.
func TestWithSourceIPStripsClaimsAndLeavesTheRequestAlone(t *testing.T) {
	raw := httptest.NewRequest(http.MethodPost, "/api/compute/sites/get", nil)
	raw.RemoteAddr = "192.0.2.10:40000"
	raw.Header.Set("X-Forwarded-For", "203.0.113.9")
	raw.Header.Set("X-Real-Ip", "203.0.113.9")
	raw.Header.Set("Forwarded", "for=203.0.113.9")
	raw.Header.Set("Authorization", "Bearer k")
	raw.Header.Set("Content-Type", "application/json")
	before := raw.Header.Clone()
	var seen *http.Request
	h := WithSourceIP(nil, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { seen = r }))
	h.ServeHTTP(httptest.NewRecorder(), raw)
	require.NotNil(t, seen)
	require.Equal(t, []string{"192.0.2.10"}, seen.Header.Values("X-Forwarded-For"))
	require.Empty(t, seen.Header.Values("X-Real-Ip"))
	require.Empty(t, seen.Header.Values("Forwarded"))
	require.Equal(t, "Bearer k", seen.Header.Get("Authorization"))
	require.Equal(t, "application/json", seen.Header.Get("Content-Type"))
	require.Equal(t, netip.MustParseAddr("192.0.2.10"), SourceIPFromContext(seen.Context()))
	require.Equal(t, before, raw.Header, "the server's request is not changed")
	// A handler changing its headers does not change the server's request.
	seen.Header.Set("Content-Type", "text/plain")
	seen.Header.Add("Authorization", "other")
	require.Equal(t, before, raw.Header)

	allocs := testing.AllocsPerRun(100, func() { h.ServeHTTP(nil, raw) })
	t.Logf("allocations per call: %.0f", allocs)
}
