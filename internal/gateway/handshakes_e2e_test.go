package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/gateway"
	"computeplane/internal/pki"
	"computeplane/internal/testenv"
)

// Handshakes counts every completed mutual-TLS handshake (the process's
// collector target follows them, internal/gctarget), before the
// session's welcome. It reads a process-wide counter, so the test does
// not run in parallel.
func TestHandshakesCountsEachHandshake(t *testing.T) {
	w := setup(t)
	port := testenv.FreePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	g, err := gateway.New(gateway.Options{
		Config: &config.Gateway{URL: url, Region: "eu", Listen: fmt.Sprintf("127.0.0.1:%d", port), MaxStreams: 100, DownAfter: time.Second},
		Bundle: func() (*pki.Bundle, error) { return w.bundle, nil },
		Store:  w.env.Store, Notifier: w.env.Host.Notifier(), Log: discard(),
	})
	require.NoError(t, err)
	require.NoError(t, g.Start(t.Context()))
	t.Cleanup(g.Drain)

	before := gateway.Handshakes()
	for i := range 3 {
		n := w.newNode(t)
		conn, _, err := dialResuming(t.Context(), url, w.bundle, n, nil)
		require.NoError(t, err)
		welcomed(t, conn, n.nodeID)
		assert.Equal(t, int64(i+1), gateway.Handshakes()-before)
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
}
