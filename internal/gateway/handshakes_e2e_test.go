package gateway_test

import (
	"fmt"
	"sync/atomic"
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

// Options.OnHandshake hears of every completed mutual-TLS handshake (the
// process's collector target follows them, internal/gctarget), before
// the session's welcome.
func TestGatewayCallsOnHandshakeAfterEachHandshake(t *testing.T) {
	t.Parallel()
	w := setup(t)
	var handshakes atomic.Int64
	port := testenv.FreePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	g, err := gateway.New(gateway.Options{
		Config: &config.Gateway{URL: url, Region: "eu", Listen: fmt.Sprintf("127.0.0.1:%d", port), MaxStreams: 100, DownAfter: time.Second},
		Bundle: func() (*pki.Bundle, error) { return w.bundle, nil },
		Store:  w.env.Store, Notifier: w.env.Host.Notifier(), Log: discard(),
		OnHandshake: func() { handshakes.Add(1) },
	})
	require.NoError(t, err)
	require.NoError(t, g.Start(t.Context()))
	t.Cleanup(g.Drain)

	for i := range 3 {
		n := w.newNode(t)
		conn, _, err := dialResuming(t.Context(), url, w.bundle, n, nil)
		require.NoError(t, err)
		welcomed(t, conn, n.nodeID)
		assert.Equal(t, int64(i+1), handshakes.Load())
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
}
