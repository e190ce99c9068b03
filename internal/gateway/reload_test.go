package gateway

import (
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/pki"
)

func writeCA(t *testing.T, path string, c *x509.Certificate) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), 0o600))
}

// Roots given as a file are read again once ReloadEvery has passed; a
// file that no longer parses keeps the last good roots.
func TestRootsFileIsReloadedEverySixtySeconds(t *testing.T) {
	a, err := pki.Generate("")
	require.NoError(t, err)
	b, err := pki.Generate("")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "roots.pem")
	writeCA(t, path, a.NodeCA.Cert)
	now := time.Unix(1_800_000_000, 0)
	r, err := newReloading("roots", rootsReader(config.PEM{File: path}), func() time.Time { return now }, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	trusts := func(ca *x509.Certificate) bool {
		_, err := ca.Verify(x509.VerifyOptions{Roots: r.get().pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}
	require.True(t, trusts(a.NodeCA.Cert))

	writeCA(t, path, b.NodeCA.Cert)
	now = now.Add(ReloadEvery - time.Second)
	assert.True(t, trusts(a.NodeCA.Cert), "not yet read again")
	now = now.Add(2 * time.Second)
	assert.True(t, trusts(b.NodeCA.Cert), "read again after 60 s")
	assert.False(t, trusts(a.NodeCA.Cert))

	require.NoError(t, os.WriteFile(path, []byte("half a file"), 0o600))
	now = now.Add(ReloadEvery)
	assert.True(t, trusts(b.NodeCA.Cert), "a bad file keeps the last good roots")
}
