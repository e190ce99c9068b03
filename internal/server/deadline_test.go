package server_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/server"
)

type upPinger struct{}

func (upPinger) Ping(context.Context) (time.Time, time.Duration, error) { return time.Now(), 0, nil }

// TestSlowReaderIsCutOff: a client that pipelines requests and never reads
// the answers is disconnected once a response cannot be written within the
// write timeout, instead of holding the connection's goroutine forever.
func TestSlowReaderIsCutOff(t *testing.T) {
	t.Parallel()
	big := []byte(strings.Repeat("x", 1<<20)) // a 1 MiB document fills the socket buffers
	srv := httptest.NewServer(server.New(server.Options{
		BasePath: "/api/compute", Store: upPinger{}, OpenAPI: big, RPC: http.NotFoundHandler(),
		WriteTimeout: 300 * time.Millisecond,
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	w := bufio.NewWriter(conn)
	for range 64 {
		_, err := w.WriteString("GET /api/compute/openapi.yaml HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
	}
	require.NoError(t, w.Flush())
	time.Sleep(time.Second) // not reading: the server's write times out

	// The server gave up on the connection: what it managed to send, then
	// the end, well before 64 MiB.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := io.Copy(io.Discard, conn)
	require.NoError(t, err, "the server closed the connection (a read timeout here means it still holds it)")
	require.Less(t, n, int64(64<<20))
}
