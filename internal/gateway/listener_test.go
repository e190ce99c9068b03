package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// upgradeAnswer reads what an upgradeWriter wrote as an HTTP response.
func upgradeAnswer(t *testing.T, write func(w *upgradeWriter)) (*http.Response, string) {
	t.Helper()
	server, client := net.Pipe()
	defer client.Close()
	go func() {
		defer server.Close()
		w := &upgradeWriter{conn: server, header: http.Header{}}
		write(w)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(client), nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

func TestUpgradeWriterAnswersAreHTTP(t *testing.T) {
	t.Run("refusal", func(t *testing.T) {
		resp, body := upgradeAnswer(t, func(w *upgradeWriter) {
			w.Header().Set("Retry-After", "5")
			http.Error(w, "the gateway is full (maxStreams)", http.StatusServiceUnavailable)
		})
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "503 Service Unavailable", resp.Status)
		assert.Equal(t, "5", resp.Header.Get("Retry-After"))
		assert.True(t, resp.Close, "Connection: close")
		assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
		assert.Equal(t, "the gateway is full (maxStreams)\n", body)
	})
	t.Run("switching protocols", func(t *testing.T) {
		resp, _ := upgradeAnswer(t, func(w *upgradeWriter) {
			w.Header().Set("Upgrade", "websocket")
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Sec-WebSocket-Accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
			w.Header().Add("X-Two", "a")
			w.Header().Add("X-Two", "b\r\nInjected: yes")
			w.WriteHeader(http.StatusSwitchingProtocols)
		})
		assert.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
		assert.Equal(t, "websocket", resp.Header.Get("Upgrade"))
		assert.Equal(t, "Upgrade", resp.Header.Get("Connection"))
		assert.Equal(t, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", resp.Header.Get("Sec-WebSocket-Accept"))
		assert.Equal(t, []string{"a", "b  Injected: yes"}, resp.Header.Values("X-Two"))
		assert.Empty(t, resp.Header.Get("Injected"), "a line break in a value starts no header")
	})
}
