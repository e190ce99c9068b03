package gateway

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto/tunnel"
)

// echoDaemon is a daemon's side of a tunnel stream: after the open frame
// it answers each stdin frame with a stdout frame of the same bytes, and
// the end of stdin with an exit frame and its end. An empty stdin frame
// asks for a 32 KiB stdout frame (the throughput benchmark).
func echoDaemon(st net.Conn, ended chan<- struct{}) {
	defer st.Close()
	if ended != nil {
		defer close(ended)
	}
	if k, _, err := tunnel.ReadFrame(st); err != nil || k != tunnel.FrameOpen {
		return
	}
	chunk := bytes.Repeat([]byte("c"), 32<<10)
	for {
		k, p, err := tunnel.ReadFrame(st)
		if err != nil {
			return
		}
		switch {
		case k == tunnel.FrameEOF:
			_ = tunnel.WriteFrame(st, tunnel.FrameExit, []byte(`{"exitCode":0}`))
			return
		case len(p) == 0:
			p = chunk
		}
		if tunnel.WriteFrame(st, tunnel.FrameStdout, p) != nil {
			return
		}
	}
}

// h2Gateway serves relayStream over HTTP/2 with TLS, each request's
// stream an echoDaemon; conns counts the connections the server saw.
func h2Gateway(t testing.TB, ended chan struct{}) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gw, daemon := net.Pipe()
		go echoDaemon(daemon, ended)
		relayStream(w, r, gw)
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func TestTunnelStreamRelays(t *testing.T) {
	ended := make(chan struct{})
	srv, _ := h2Gateway(t, ended)
	up, err := dialStream(t.Context(), srv.Client(), srv.URL+InternalTunnels+"n1")
	require.NoError(t, err)
	defer up.Close()
	require.NoError(t, up.WriteFrame(tunnel.FrameOpen, []byte(`{}`)))
	for _, msg := range []string{"hello", "world"} {
		require.NoError(t, up.WriteFrame(tunnel.FrameStdin, []byte(msg)))
		f, err := up.NextFrame()
		require.NoError(t, err)
		require.Equal(t, append([]byte{tunnel.FrameStdout}, msg...), f.B)
		f.Release()
	}
	// The daemon's end: its exit frame, then the end of the response.
	require.NoError(t, up.WriteFrame(tunnel.FrameEOF, nil))
	k, p, err := up.ReadFrame()
	require.NoError(t, err)
	require.Equal(t, tunnel.FrameExit, k)
	require.JSONEq(t, `{"exitCode":0}`, string(p))
	_, _, err = up.ReadFrame()
	require.ErrorIs(t, err, io.EOF)
	<-ended
}

// The api's end (the client gone) ends the daemon's stream; every tunnel
// to a gateway shares one connection.
func TestTunnelStreamClosesAndShares(t *testing.T) {
	srv, conns := h2Gateway(t, nil)
	hc := srv.Client()
	var ups []*tunnel.Upstream
	for range 20 {
		up, err := dialStream(t.Context(), hc, srv.URL+InternalTunnels+"n1")
		require.NoError(t, err)
		require.NoError(t, up.WriteFrame(tunnel.FrameOpen, []byte(`{}`)))
		ups = append(ups, up)
	}
	require.EqualValues(t, 1, conns.Load(), "20 tunnels on one connection")

	ended := make(chan struct{})
	srv2, _ := h2Gateway(t, ended)
	up, err := dialStream(t.Context(), srv2.Client(), srv2.URL+InternalTunnels+"n1")
	require.NoError(t, err)
	require.NoError(t, up.WriteFrame(tunnel.FrameOpen, []byte(`{}`)))
	require.NoError(t, up.Close())
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the daemon's stream outlived the api's end")
	}
	for _, up := range ups {
		require.NoError(t, up.Close())
	}
}

// A refusal (503 with Retry-After) is a tunnel.Busy.
func TestTunnelStreamBusy(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the node has 2 tunnels open", http.StatusServiceUnavailable)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	_, err := dialStream(context.Background(), srv.Client(), srv.URL+InternalTunnels+"n1")
	var busy *tunnel.Busy
	require.ErrorAs(t, err, &busy)
	require.Equal(t, 5*time.Second, busy.RetryAfter)
	require.Contains(t, busy.Why, "2 tunnels open")
}

// BenchmarkTunnelStreamThroughput is the gateway-to-api leg of one
// tunnel (HTTP/2 over TLS on loopback): 32 KiB frames from the daemon's
// side to the api's, 8 asked for ahead.
func BenchmarkTunnelStreamThroughput(b *testing.B) {
	srv, _ := h2Gateway(b, nil)
	up, err := dialStream(b.Context(), srv.Client(), srv.URL+InternalTunnels+"n1")
	require.NoError(b, err)
	defer up.Close()
	require.NoError(b, up.WriteFrame(tunnel.FrameOpen, []byte(`{}`)))
	const ahead = 8
	for range ahead {
		require.NoError(b, up.WriteFrame(tunnel.FrameStdin, nil))
	}
	b.SetBytes(32 << 10)
	b.ReportAllocs()
	start, n := time.Now(), 0
	for b.Loop() {
		f, err := up.NextFrame()
		require.NoError(b, err)
		f.Release()
		require.NoError(b, up.WriteFrame(tunnel.FrameStdin, nil))
		n++
	}
	b.ReportMetric(float64(n*(32<<10))/(1<<20)/time.Since(start).Seconds(), "MiB/s")
}
