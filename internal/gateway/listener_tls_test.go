package gateway

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent"
	"computeplane/internal/config"
	"computeplane/internal/pki"
)

// writeCounter counts the writes on the gateway's socket.
type writeCounter struct {
	net.Conn
	writes atomic.Int32
}

func (c *writeCounter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// ticketCounter counts the session tickets a client took.
type ticketCounter struct {
	tls.ClientSessionCache
	puts atomic.Int32
}

func (c *ticketCounter) Put(key string, cs *tls.ClientSessionState) {
	if cs != nil {
		c.puts.Add(1)
	}
	c.ClientSessionCache.Put(key, cs)
}

// handshakeWorld is a gateway's listener (no database: only its
// handshake runs) and a node's client certificate.
type handshakeWorld struct {
	l      *listener
	bundle *pki.Bundle
	cert   tls.Certificate
}

func newHandshakeWorld(t *testing.T, ca *pki.Bundle) *handshakeWorld {
	t.Helper()
	b, err := pki.Generate("test.local")
	require.NoError(t, err)
	if ca == nil {
		ca = b
	}
	g, err := New(Options{
		Config: &config.Gateway{URL: "https://127.0.0.1:1", Region: "eu", SessionTicketDays: 7},
		Bundle: func() (*pki.Bundle, error) { return b, nil }, Log: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	g.ctx = t.Context()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	c := nodeCert(t, ca.NodeCA, key, "spiffe://test.local/node/node_1", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	return &handshakeWorld{l: &listener{g: g, tls: g.tlsConfig()}, bundle: b,
		cert: tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key, Leaf: c}}
}

// serve accepts one connection, runs the listener's handshake on it and,
// when it succeeds, answers the upgrade request with a 101; it answers
// the writes made on the socket.
func (w *handshakeWorld) serve(t *testing.T, ln net.Listener) <-chan int32 {
	done := make(chan int32, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			done <- -1
			return
		}
		defer raw.Close()
		wc := &writeCounter{Conn: raw}
		tc, _, err := w.l.handshake(wc)
		if err == nil {
			if _, err = http.ReadRequest(bufio.NewReader(tc)); err == nil {
				_, err = io.WriteString(tc, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			}
		}
		done <- wc.writes.Load()
	}()
	return done
}

func (w *handshakeWorld) dial(t *testing.T, addr string, tickets tls.ClientSessionCache) (*tls.Conn, error) {
	roots := x509.NewCertPool()
	roots.AddCert(w.bundle.ServingCA.Cert)
	return tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{w.cert}, ClientSessionCache: tickets})
}

// The session ticket crypto/tls writes once the client's certificate is
// in goes out with the upgrade's answer, in one write: the server's
// flight, then the ticket and the 101. The daemon still gets its ticket.
func TestTheSessionTicketGoesOutWithTheUpgradesAnswer(t *testing.T) {
	w := newHandshakeWorld(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	writes := w.serve(t, ln)
	tickets := &ticketCounter{ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	c, err := w.dial(t, ln.Addr().String(), tickets)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, "GET /v1/session HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	assert.Equal(t, int32(1), tickets.puts.Load(), "the daemon got its session ticket")
	assert.Equal(t, int32(2), <-writes, "the flight, then the ticket with the 101")
}

// A handshake the gateway refuses after its flight (a certificate of
// another CA) still sends its alert, which was held like a ticket.
func TestARefusedHandshakeStillSendsItsAlert(t *testing.T) {
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	w := newHandshakeWorld(t, other)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	writes := w.serve(t, ln)
	c, err := w.dial(t, ln.Addr().String(), nil)
	require.NoError(t, err) // TLS 1.3: the client's side ends before the server checks its certificate
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "remote error: tls: bad certificate", "the alert, not the bare close")
	assert.Equal(t, int32(2), <-writes, "the flight, then the alert")
}

// A session keeps its recordConn for its life: holding the handshake's
// writes adds a pointer, and the struct stays in the 64-byte size class.
func TestARecordConnStaysInItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(recordConn{}), uintptr(64))
}

// gateway.tls may hold an Ed25519 serving key (PKCS#8): the gateway signs
// its handshakes with it and a daemon's TLS configuration accepts it
// (docs/gateway.md; what it saves: BenchmarkServingSignature).
func TestAnEd25519ServingCertificateFromGatewayTLS(t *testing.T) {
	w := newHandshakeWorld(t, nil)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, w.bundle.ServingCA.Cert, pub, w.bundle.ServingCA.Key)
	require.NoError(t, err)
	pk8, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	kp := &config.KeyPair{Cert: config.PEM{Inline: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))},
		Key: config.PEM{Inline: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk8}))}}
	cert, err := newReloading("gateway.tls", keyPairReader(kp), time.Now, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	w.l.g.cert = cert

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := w.serve(t, ln)
	roots := x509.NewCertPool()
	roots.AddCert(w.bundle.ServingCA.Cert)
	tc, err := tls.Dial("tcp", ln.Addr().String(), agent.MTLSConfig(roots, "127.0.0.1", func() *tls.Certificate { return &w.cert }, nil))
	require.NoError(t, err)
	defer tc.Close()
	_, err = io.WriteString(tc, "GET /v1/session HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.Positive(t, <-done, "the handshake and the upgrade")
	st := tc.ConnectionState()
	assert.Equal(t, x509.Ed25519, st.PeerCertificates[0].PublicKeyAlgorithm)
	assert.Equal(t, tls.X25519MLKEM768, st.CurveID)
}
