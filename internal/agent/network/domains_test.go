package network

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent/egressproxy"
)

// selfSigned is a certificate for the internet's HTTPS servers.
func selfSigned(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serveHTTPS answers on port 443 of every internet address with the
// client's address and the name it asked for.
func (w *world) serveHTTPS(t *testing.T) {
	ln := tls.NewListener(w.inet.listen(t, "0.0.0.0:443"), &tls.Config{Certificates: []tls.Certificate{selfSigned(t, "upstream.test", "*.example.test")}})
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(rw, "%s %s", host, r.TLS.ServerName)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// httpAs sends one HTTP request to addr naming host, from inside n, and
// returns the body.
func (n ns) httpAs(addr, host string) (string, error) {
	var body string
	err := n.do(func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	return body, err
}

// httpsAs makes one HTTPS request to addr with sni as the server name.
func (n ns) httpsAs(addr, sni string) (string, error) {
	var body string
	err := n.do(func() error {
		d := &net.Dialer{Timeout: time.Second}
		c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	return body, err
}

func TestDomainPolicy(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	w.serveHTTPS(t)
	w.inet.accept(t, "0.0.0.0:8443")
	cfg := testConfig(w)
	proxy, err := egressproxy.New(egressproxy.Config{NetNS: w.node.path()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	cfg.Domains = proxy
	m := newManager(t, cfg)
	spec := egressVM("vm-a", "acme", "10.200.1.2/24", "10.200.1.1", "52:54:00:00:01:02")
	spec.Policy = Policy{AllowDomains: []string{"upstream.test", "*.example.test"}, Allow: []netip.Prefix{netip.MustParsePrefix(upstream2 + "/32")}}
	a := w.startVM(t, m, spec)
	b := w.startVM(t, m, egressVM("vm-b", "other", "10.200.2.2/24", "10.200.2.1", "52:54:00:00:02:02"))

	t.Run("admits exactly its names, by Host and by SNI", func(t *testing.T) {
		body, err := a.httpAs(upstream+":80", "upstream.test")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body, "connected to the original destination, from the node")
		body, err = a.httpsAs(upstream+":443", "upstream.test")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr+" upstream.test", body)
		body, err = a.httpsAs(upstream+":443", "api.example.test")
		require.NoError(t, err, "a subdomain of a *. entry")
		assert.Equal(t, nodeAddr+" api.example.test", body)

		_, err = a.httpAs(upstream+":80", "other.test")
		assert.Error(t, err, "a name not in the list")
		_, err = a.httpsAs(upstream+":443", "other.test")
		assert.Error(t, err)
		_, err = a.httpsAs(upstream+":443", "example.test")
		assert.Error(t, err, "*.example.test is its subdomains only")
		_, err = a.httpAs(upstream+":80", upstream)
		assert.Error(t, err, "an address is no name")
		blocked(t, a, upstream+":8443") // other ports: the allow list holds
	})

	t.Run("its allowed CIDRs pass without the filter", func(t *testing.T) {
		body, err := a.httpAs(upstream2+":80", "other.test")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body)
		reaches(t, a, upstream2+":8443")
	})

	t.Run("the platform deny set stays above the names", func(t *testing.T) {
		for _, addr := range []string{metadata, deniedPriv, serviceAddr, "10.200.1.1", "10.200.2.2", nodeAddr} {
			_, err := a.httpAs(addr+":80", "upstream.test")
			assert.Error(t, err, addr)
		}
		_, err := a.httpAs(upstream+":25", "upstream.test")
		assert.Error(t, err, "SMTP")
	})

	t.Run("a VM without domain entries is not filtered", func(t *testing.T) {
		body, err := b.httpAs(upstream+":80", "other.test")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body)
		reaches(t, b, upstream+":8443")
	})

	t.Run("proxied bytes are counted", func(t *testing.T) {
		before, err := m.Counters()
		require.NoError(t, err)
		var got int
		a.run(t, func() error {
			c, err := net.DialTimeout("tcp", upstream+":80", time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: upstream.test\r\nConnection: close\r\n\r\n")
			n, err := io.Copy(io.Discard, c)
			got = int(n)
			return err
		})
		require.Greater(t, got, bigBodyBytes)
		after, err := m.Counters()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, after["vm-a"].RxBytes-before["vm-a"].RxBytes, uint64(bigBodyBytes))
		assert.Greater(t, after["vm-a"].TxBytes-before["vm-a"].TxBytes, uint64(40))
	})

	t.Run("a policy change holds for open and new connections", func(t *testing.T) {
		var conn net.Conn
		a.run(t, func() (err error) { conn, err = net.DialTimeout("tcp", upstream+":80", time.Second); return err })
		defer conn.Close()
		_, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: upstream.test\r\n\r\n")
		require.NoError(t, err)
		r := bufio.NewReader(conn)
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)

		require.NoError(t, m.SetPolicy("vm-a", Policy{AllowDomains: []string{"other.test"}}))
		_, _ = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: upstream.test\r\n\r\n")
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err = http.ReadResponse(r, nil)
		assert.Error(t, err, "the open connection to a name no longer allowed is cut")
		_, err = a.httpAs(upstream+":80", "upstream.test")
		assert.Error(t, err)
		body, err := a.httpAs(upstream+":80", "other.test")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body)
		blocked(t, a, upstream2+":8443") // its CIDR left the allow list

		// A deny of the address is above a name.
		require.NoError(t, m.SetPolicy("vm-a", Policy{AllowDomains: []string{"upstream.test"}, Deny: []netip.Prefix{netip.MustParsePrefix(upstream + "/32")}}))
		_, err = a.httpAs(upstream+":80", "upstream.test")
		assert.Error(t, err)

		// No domains, no allow list: open again, without the filter.
		require.NoError(t, m.SetPolicy("vm-a", Policy{}))
		body, err = a.httpAs(upstream+":80", "other.test")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body)
		reaches(t, a, upstream+":8443")

		require.NoError(t, m.SetPolicy("vm-a", Policy{AllowDomains: []string{"upstream.test"}}))
		_, err = a.httpAs(upstream+":80", "upstream.test")
		require.NoError(t, err, "filtered again")
		blocked(t, a, upstream+":8443")
	})

	t.Run("a domain entry in deny is refused", func(t *testing.T) {
		assert.ErrorContains(t, m.SetPolicy("vm-a", Policy{DenyDomains: []string{"upstream.test"}}), "allow list only")
	})

	t.Run("removed, re-added: nothing left behind", func(t *testing.T) {
		require.NoError(t, m.Remove("vm-a"))
		for _, ch := range w.chains(t, m.names.table()) {
			assert.False(t, strings.HasSuffix(ch, vmKey("vm-a")), ch)
		}
		_, err := m.Add(spec)
		require.NoError(t, err)
		_, err = m.Add(spec) // again: replaces its rules
		require.NoError(t, err)
	})
}
