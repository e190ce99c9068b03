package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/server"
)

// TestPipeliningClientsThatNeverReadAreLetGo: 30 connections each
// pipeline 40 requests and never read an answer. Whether the answers fit
// in the socket buffers (the connection goes idle with them unread) or not
// (a write blocks), the server lets every connection go within a few stall
// periods instead of holding it until an idle or response timeout.
func TestPipeliningClientsThatNeverReadAreLetGo(t *testing.T) {
	t.Parallel()
	const stall = 400 * time.Millisecond
	for _, tc := range []struct {
		name   string
		answer int
	}{
		{"answers that fit the buffers", 4 << 10},
		{"answers that do not", 256 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := []byte(strings.Repeat("x", tc.answer))
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write(body)
			}))
			var closed atomic.Int32
			ln, hook := server.BoundConns(srv.Listener, server.ConnLimits{Stall: stall}, func(_ net.Conn, s http.ConnState) {
				if s == http.StateClosed {
					closed.Add(1)
				}
			})
			srv.Listener = ln
			srv.Config.ConnState = hook
			srv.Config.IdleTimeout = time.Minute // what used to hold them
			srv.Start()
			defer srv.Close()

			const conns, pipelined = 30, 40
			for range conns {
				c, err := net.Dial("tcp", srv.Listener.Addr().String())
				require.NoError(t, err)
				defer c.Close()
				w := bufio.NewWriter(c)
				for range pipelined {
					_, err := fmt.Fprintf(w, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
					require.NoError(t, err)
				}
				require.NoError(t, w.Flush())
			}
			start := time.Now()
			require.Eventually(t, func() bool { return closed.Load() == conns }, 5*time.Second, 50*time.Millisecond,
				"connections let go: %d of %d", closed.Load(), conns)
			t.Logf("all %d connections let go %v after the requests", conns, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestAReaderThatKeepsUpIsNotCut: a slow but steady reader of a large
// answer keeps its connection: the stall bound counts time without
// progress, not the length of the response.
func TestAReaderThatKeepsUpIsNotCut(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	body := []byte(strings.Repeat("y", 4<<20))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(body)
	}))
	ln, hook := server.BoundConns(srv.Listener, server.ConnLimits{Stall: stall, SendBuffer: 64 << 10}, nil)
	srv.Listener = ln
	srv.Config.ConnState = hook
	srv.Start()
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	total := 0
	for {
		n, err := resp.Body.Read(buf)
		total += n
		if err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // about 3 MiB/s at most: the whole answer takes well over the stall bound
	}
	require.Equal(t, len(body), total)
}

// capped serves h on a listener capped at maxConns and returns its URL
// and the listener.
func capped(t *testing.T, maxConns int, h http.Handler) (*httptest.Server, *server.Bounded) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	ln, hook := server.BoundConns(srv.Listener, server.ConnLimits{MaxConns: maxConns}, nil)
	srv.Listener = ln
	srv.Config.Handler = ln.Handler(h)
	srv.Config.ConnState = hook
	srv.Config.IdleTimeout = time.Minute
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, ln
}

// TestCapHoldsWhileClientsRace: 40 clients race 25 calls each through a
// server capped at 4 connections. Every call is answered, and no handler
// ever sees more than 4 connections served: the others waited in the
// kernel's accept queue, and connections were let go (idle ones, and
// answers with Connection: close) while some waited.
func TestCapHoldsWhileClientsRace(t *testing.T) {
	t.Parallel()
	const maxConns, clients, calls = 4, 40, 25
	var most atomic.Int32
	var ln *server.Bounded
	srv, ln := capped(t, maxConns, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int32(ln.Served())
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(time.Millisecond)
		_, _ = w.Write([]byte("ok"))
	}))
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range clients {
		wg.Go(func() {
			// Each client its own keep-alive pool, as separate processes.
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 20 * time.Second}
			defer c.CloseIdleConnections()
			for range calls {
				resp, err := c.Get(srv.URL)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "calls that failed")
	require.LessOrEqual(t, most.Load(), int32(maxConns))
	require.Positive(t, most.Load())
}

// TestIdleConnectionsDoNotLockOthersOut: the cap's connections are all
// held idle by keep-alive clients; a new client is still served, since
// the idle ones are let go for it.
func TestIdleConnectionsDoNotLockOthersOut(t *testing.T) {
	t.Parallel()
	const maxConns = 3
	srv, ln := capped(t, maxConns, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok"))
	}))
	addr := srv.Listener.Addr().String()
	for range maxConns {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_, err = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		require.Empty(t, resp.Header.Get("Connection"), "no one waited: keep-alive")
	}
	require.Equal(t, maxConns, ln.Served())

	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.LessOrEqual(t, ln.Served(), maxConns)
}

// TestHijackedConnectionsLeaveTheCap: a hijacked connection (a WebSocket
// session) is its handler's: it does not keep others out.
func TestHijackedConnectionsLeaveTheCap(t *testing.T) {
	t.Parallel()
	hijacked := make(chan net.Conn, 4)
	srv, ln := capped(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hijack" {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				hijacked <- c
			}
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	select {
	case hc := <-hijacked:
		defer hc.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("not hijacked")
	}
	require.Eventually(t, func() bool { return ln.Served() == 0 }, 5*time.Second, 10*time.Millisecond)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestCloseEndsAnAcceptWaitingAtTheCap: the server shuts down although
// its listener waits for a slot.
func TestCloseEndsAnAcceptWaitingAtTheCap(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv, ln := capped(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	go func() { _, _ = (&http.Client{Timeout: 5 * time.Second}).Get(srv.URL) }()
	require.Eventually(t, func() bool { return ln.Served() == 1 }, 5*time.Second, 10*time.Millisecond)
	// The next Accept waits for the slot; a second client is in the
	// kernel's queue.
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, ln.Waiting, 5*time.Second, 10*time.Millisecond)
	close(release)
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not close")
	}
}
