package server_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
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
