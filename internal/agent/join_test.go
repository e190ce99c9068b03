package agent

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

func TestJoinKeepsTheAnswerAndRefusesAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t, time.Minute, time.Hour) // only its CAs
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var req agentproto.JoinRequest
		if r.URL.Path != agentproto.JoinPath || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(rw, "bad", http.StatusBadRequest)
			return
		}
		if req.Token != "good" {
			rw.WriteHeader(http.StatusForbidden)
			_, _ = rw.Write([]byte(`{"error":{"code":"PERMISSION_DENIED","message":"the token was used"}}`))
			return
		}
		csr, err := x509.ParseCertificateRequest(req.CSR)
		if err != nil || csr.Subject.CommonName != "host-a" {
			http.Error(rw, "bad csr", http.StatusBadRequest)
			return
		}
		cert := w.nodeCA.issue(t, csr.PublicKey, false, time.Now(), time.Now().Add(time.Hour))
		_ = json.NewEncoder(rw).Encode(agentproto.JoinResponse{NodeID: "node_new", PoolID: "pool_a", Certificate: cert.Raw,
			NodeCA: w.nodeCA.cert.Raw, ServingCA: w.serving.cert.Raw, Gateways: []agentproto.Gateway{{ID: "gw_1", URL: "https://127.0.0.1:1"}},
			FallbackURL: "ws://127.0.0.1:1/v1/session", ReleaseKeys: [][]byte{[]byte("0123456789abcdef0123456789abcdef")}})
	}))
	t.Cleanup(srv.Close)
	dir := Dir(t.TempDir() + "/agent")

	_, err := Join(t.Context(), JoinOptions{APIURL: srv.URL, Token: "bad", Dir: dir, Hostname: "host-a"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, "the token was used", refused.Message)

	node, err := Join(t.Context(), JoinOptions{APIURL: srv.URL, Token: "good", Dir: dir, Hostname: "host-a"})
	require.NoError(t, err)
	assert.Equal(t, "node_new", node)
	st, err := dir.LoadState()
	require.NoError(t, err)
	assert.Equal(t, "gw_1", st.Gateways[0].ID)
	assert.Equal(t, srv.URL, st.APIURL)
	assert.Len(t, st.ReleasePublicKeys(), 1, "the release key is pinned")
	_, _, err = dir.LoadIdentity()
	require.NoError(t, err)
	for name, mode := range map[string]os.FileMode{"": 0o700, fileKey: 0o600} {
		fi, err := os.Stat(dir.path(name))
		require.NoError(t, err)
		assert.Equal(t, mode, fi.Mode().Perm(), name)
	}
	raw, err := os.ReadFile(dir.path(fileState))
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "good", "the token is not kept")

	_, err = Join(t.Context(), JoinOptions{APIURL: srv.URL, Token: "good", Dir: dir, Hostname: "host-a"})
	assert.ErrorContains(t, err, "already holds", "a second join needs --force")
	_, err = Join(t.Context(), JoinOptions{APIURL: srv.URL, Token: "good", Dir: dir, Hostname: "host-a", Force: true})
	require.NoError(t, err)

	_, err = Join(t.Context(), JoinOptions{APIURL: "http://example.com", Token: "good", Dir: dir, Force: true})
	assert.ErrorContains(t, err, "https", "http only to loopback")
}
