package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ticketWorld is a daemon's TLS configuration and three servers to dial
// with it: a gateway that issues tickets, one that takes the ClientHello
// and resets the connection (a gateway going down), and one that answers
// with an alert.
type ticketWorld struct {
	tc                  *tls.Config
	gateway, cut, alert string
}

func newTicketWorld(t *testing.T) *ticketWorld {
	serving, nodeCA := newCA(t, "serving"), newCA(t, "nodes")
	now := time.Now()
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srv := tls.Certificate{Certificate: [][]byte{serving.issue(t, &srvKey.PublicKey, true, now.Add(-time.Minute), now.Add(time.Hour)).Raw}, PrivateKey: srvKey}
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	node := nodeCA.issue(t, &nodeKey.PublicKey, false, now.Add(-time.Minute), now.Add(time.Hour))
	roots := x509.NewCertPool()
	roots.AddCert(serving.cert)
	w := &ticketWorld{tc: MTLSConfig(roots, "127.0.0.1", func() *tls.Certificate {
		return &tls.Certificate{Certificate: [][]byte{node.Raw}, PrivateKey: nodeKey, Leaf: node}
	}, tls.NewLRUClientSessionCache(TicketCacheSize))}

	listen := func(serve func(net.Conn)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go serve(c)
			}
		}()
		return ln.Addr().String()
	}
	gw := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srv}, ClientAuth: tls.RequireAnyClientCert}
	w.gateway = listen(func(c net.Conn) {
		defer c.Close()
		tc := tls.Server(c, gw)
		if tc.Handshake() == nil {
			_, _ = tc.Write([]byte{1}) // after the ticket
		}
	})
	w.cut = listen(func(c net.Conn) {
		_, _ = c.Read(make([]byte, 1024)) // the ClientHello, with the ticket
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close() // a reset
	})
	old := &tls.Config{MaxVersion: tls.VersionTLS12, Certificates: []tls.Certificate{srv}}
	w.alert = listen(func(c net.Conn) {
		defer c.Close()
		_ = tls.Server(c, old).Handshake() // protocol_version alert
	})
	return w
}

// dial handshakes with addr and reads the first byte; it says whether the
// session resumed.
func (w *ticketWorld) dial(t *testing.T, addr string) (resumed bool, err error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, w.tc)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_, err = io.ReadFull(c, make([]byte, 1))
	require.NoError(t, err)
	return c.ConnectionState().DidResume, nil
}

func (w *ticketWorld) ticket() *tls.ClientSessionState {
	s, _ := w.tc.ClientSessionCache.Get(w.tc.ServerName)
	return s
}

// A gateway going down resets the handshakes it accepted: crypto/tls
// drops the ticket the daemon offered, and KeepTicket puts it back, so
// the daemon resumes on the restarted gateway. A gateway's alert still
// costs the ticket.
func TestATicketOutlivesAHandshakeTheConnectionCut(t *testing.T) {
	w := newTicketWorld(t)
	resumed, err := w.dial(t, w.gateway)
	require.NoError(t, err)
	require.False(t, resumed)
	saved := w.ticket()
	require.NotNil(t, saved, "the gateway issued a ticket")

	_, err = w.dial(t, w.cut)
	require.Error(t, err)
	require.Nil(t, w.ticket(), "crypto/tls drops the ticket of a failed resumption")
	assert.True(t, transportFailure(err), "a reset: %v", err)
	KeepTicket(w.tc.ClientSessionCache, w.tc.ServerName, saved, err)
	require.NotNil(t, w.ticket(), "the ticket is back")
	resumed, err = w.dial(t, w.gateway)
	require.NoError(t, err)
	assert.True(t, resumed, "the next dial resumes")

	saved = w.ticket()
	_, err = w.dial(t, w.alert)
	require.Error(t, err)
	assert.False(t, transportFailure(err), "an alert: %v", err)
	KeepTicket(w.tc.ClientSessionCache, w.tc.ServerName, saved, err)
	assert.Nil(t, w.ticket(), "an alert drops the ticket")

	// A ticket issued meanwhile is not replaced by the saved one.
	_, err = w.dial(t, w.gateway)
	require.NoError(t, err)
	fresh := w.ticket()
	KeepTicket(w.tc.ClientSessionCache, w.tc.ServerName, saved, io.EOF)
	assert.Same(t, fresh, w.ticket())
}
