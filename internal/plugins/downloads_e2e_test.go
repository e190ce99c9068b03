package plugins_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/plugins"
	"computeplane/internal/testenv"
)

// A release carries the example plugin as plugin-example (tools/release);
// the downloads route serves it with its checksum, and what an operator
// downloads passes the plugins option's start checks.
func TestPluginArchiveIsServedByDownloads(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	cmd := exec.Command("go", "run", "./tools/release", "-version", "v0.1.0", "-out", out, "-platforms", platform, "-agents", "plugin-example")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "SERVICE_PKI="+filepath.Join(t.TempDir(), "pki.json"), "SERVICE_SECRET="+testenv.TestSecret)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)

	env := testenv.Start(t, testenv.WithEnv("SERVICE_DOWNLOADS_DIR", out))
	file := strings.ReplaceAll(platform, "/", "-")
	resp, err := http.Get(env.APIURL + "/downloads/plugin-example/latest/" + file)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, "v0.1.0", resp.Header.Get("X-Release-Version"))
	resp, err = http.Get(env.APIURL + "/downloads/plugin-example/v0.1.0/" + file + ".sha256")
	require.NoError(t, err)
	sumFile, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	sum := sha256.Sum256(body)
	assert.True(t, strings.HasPrefix(string(sumFile), hex.EncodeToString(sum[:])), "%s", sumFile)

	bin := filepath.Join(t.TempDir(), "example")
	require.NoError(t, os.WriteFile(bin, body, 0o755))
	require.NoError(t, plugins.Check([]config.Plugin{{ID: "example", Path: bin, SHA256: hex.EncodeToString(sum[:])}}))
}
