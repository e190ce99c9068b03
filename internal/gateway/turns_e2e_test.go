package gateway_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/gateway"
)

// Many daemons dialling at once (a restart's reconnect storm) against a
// gateway whose bound is 2: never more than 2 handshakes compute at once
// (without the bound, 9 did here with GOMAXPROCS 8),
// and every one completes; peers that connect and send nothing, or stop
// halfway through their ClientHello, hold no slot meanwhile. Not parallel:
// the bound is the package's.
func TestHandshakesComputeWithinTheBoundAndAllComplete(t *testing.T) {
	gateway.SetHandshakeLimit(2)
	t.Cleanup(func() { gateway.SetHandshakeLimit(0) })
	// More Ps than the bound, so that more handshakes could compute at
	// once without it (on a 2-core machine, 2 would by themselves).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	w := setup(t)
	n := w.newNode(t)
	addr := strings.TrimPrefix(w.gwURL, "https://")

	// Stalled peers first: they take no slot, so they hold no one up.
	for i := range 4 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		if i%2 == 1 {
			_, err = c.Write([]byte{22, 3, 1, 2, 0, 1}) // a ClientHello's record header and one byte
			require.NoError(t, err)
		}
	}

	roots := x509.NewCertPool()
	roots.AddCert(w.bundle.ServingCA.Cert)
	tc := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{n.cert.Raw}, PrivateKey: n.key, Leaf: n.cert}}}
	const dials = 40
	hs0 := gatewayStat("handshakes")
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, dials)
	for i := range dials {
		wg.Go(func() {
			d := &net.Dialer{Timeout: 10 * time.Second}
			c, err := tls.DialWithDialer(d, "tcp", addr, tc)
			if err == nil {
				// The server's side ends after the client's Finished: read
				// until it sends its session ticket or nothing.
				_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				_, _ = c.Read(make([]byte, 1))
				_ = c.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "dial %d", i)
	}
	require.Eventually(t, func() bool { return gatewayStat("handshakes")-hs0 == dials }, 10*time.Second, 10*time.Millisecond,
		"every handshake completes on the gateway")
	t.Logf("%d handshakes in %v, at most %d computing at once", dials, time.Since(start), w.gw.HandshakePeak())
	assert.LessOrEqual(t, w.gw.HandshakePeak(), 2, "never more than the bound")
	assert.Equal(t, 2, w.gw.HandshakePeak(), "the storm reached the bound")
	assert.Zero(t, gatewayStat("handshakesWaiting"))
	require.Eventually(t, func() bool { return gatewayStat("handshaking") == 0 }, time.Second, 10*time.Millisecond,
		"the gauge is back to 0: the stalled peers hold no slot")
}
