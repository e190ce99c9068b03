package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent"
	"computeplane/internal/agentproto"
)

// The tool's dial (its own TCP connection, handshake and upgrade request)
// sends the gateway what the daemon's dial through net/http's Transport
// sends: the same request line and headers, TLS 1.3, and resumption from
// the node's ticket cache on the next dial; and the upgraded connection
// carries messages both ways.
func TestTheToolsDialIsTheDaemons(t *testing.T) {
	type seen struct {
		method, uri, proto, host string
		header                   http.Header
		tls                      tls.ConnectionState
	}
	requests := make(chan seen, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests <- seen{r.Method, r.RequestURI, r.Proto, r.Host, r.Header.Clone(), *r.TLS}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if typ, b, err := c.Read(r.Context()); err == nil {
			_ = c.Write(r.Context(), typ, b)
		}
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	config := func() *tls.Config {
		return agent.MTLSConfig(roots, "127.0.0.1", func() *tls.Certificate { return &tls.Certificate{} }, tls.NewLRUClientSessionCache(agent.TicketCacheSize))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	echo := func(conn *websocket.Conn) {
		t.Helper()
		require.NoError(t, conn.Write(ctx, websocket.MessageText, statusFrame))
		_, b, err := conn.Read(ctx)
		require.NoError(t, err)
		assert.Equal(t, statusFrame, b)
	}
	// Without the key, which is random per dial.
	headers := func(h http.Header) http.Header {
		h = h.Clone()
		h.Del("Sec-Websocket-Key")
		return h
	}

	// The daemon's dial (internal/agent, dialMTLS).
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: config(), ForceAttemptHTTP2: false}}
	conn, _, err := websocket.Dial(ctx, "wss://"+addr+agentproto.SessionPath, &websocket.DialOptions{HTTPClient: hc})
	require.NoError(t, err)
	daemon := <-requests
	echo(conn)
	conn.CloseNow()
	require.Equal(t, "websocket", daemon.header.Get("Upgrade"))

	// The tool's, twice with one node's configuration.
	tc := config()
	for _, resumed := range []bool{false, true} {
		conn, raw, err := dial(addr, tc)
		require.NoError(t, err)
		require.NotNil(t, raw)
		got := <-requests
		assert.Equal(t, daemon.method+" "+daemon.uri+" "+daemon.proto+" "+daemon.host, got.method+" "+got.uri+" "+got.proto+" "+got.host)
		assert.Equal(t, headers(daemon.header), headers(got.header))
		assert.Equal(t, uint16(tls.VersionTLS13), got.tls.Version)
		assert.Equal(t, daemon.tls.CurveID, got.tls.CurveID, "the same key exchange")
		assert.Equal(t, resumed, got.tls.DidResume, "the second dial resumes from the node's tickets")
		echo(conn)
		conn.CloseNow()
	}
}

// A gateway killed with handshakes in flight resets them: the tool's
// dial, as the daemon's, keeps the ticket crypto/tls drops on a failed
// resumption, so that the node resumes on the restarted gateway (without
// it, the handshakes in flight at a SIGKILL came back as full ones).
func TestTheToolsDialKeepsItsTicketWhenTheConnectionCutsTheHandshake(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if typ, b, err := c.Read(r.Context()); err == nil {
			_ = c.Write(r.Context(), typ, b)
		}
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	// A gateway going down: it takes the ClientHello and resets.
	cut, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = cut.Close() })
	go func() {
		for {
			c, err := cut.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 4096))
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
		}
	}()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	tc := agent.MTLSConfig(roots, "127.0.0.1", func() *tls.Certificate { return &tls.Certificate{} }, tls.NewLRUClientSessionCache(agent.TicketCacheSize))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	session := func() bool {
		t.Helper()
		conn, raw, err := dial(srv.Listener.Addr().String(), tc)
		require.NoError(t, err)
		defer conn.CloseNow()
		require.NoError(t, conn.Write(ctx, websocket.MessageText, statusFrame))
		_, _, err = conn.Read(ctx) // the ticket came before the answer
		require.NoError(t, err)
		return raw.(*tls.Conn).ConnectionState().DidResume
	}
	require.False(t, session())
	saved, _ := tc.ClientSessionCache.Get(tc.ServerName)
	require.NotNil(t, saved, "the server issued a ticket")

	_, _, err = dial(cut.Addr().String(), tc)
	require.Error(t, err)
	kept, _ := tc.ClientSessionCache.Get(tc.ServerName)
	assert.Same(t, saved, kept, "the ticket outlives the cut handshake")
	assert.True(t, session(), "the next dial resumes")
}
