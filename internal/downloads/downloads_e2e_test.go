package downloads_test

// The downloads route through the real api role over HTTP: a release
// directory laid out as tools/release writes one, served by
// downloads.dir.

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/downloads"
	"computeplane/internal/release"
	"computeplane/internal/testenv"
)

// publish lays out one signed artifact under dir and returns its bytes.
func publish(t *testing.T, dir string, key ed25519.PrivateKey, agent, version, platform string) []byte {
	t.Helper()
	body := []byte(fmt.Sprintf("#!/bin/sh\necho %s %s %s\n", agent, version, platform))
	p := filepath.Join(dir, agent, version, platform)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	sum := sha256.Sum256(body)
	require.NoError(t, os.WriteFile(p, body, 0o755))
	require.NoError(t, os.WriteFile(p+release.ChecksumSuffix, release.ChecksumFile(platform, sum), 0o644))
	require.NoError(t, os.WriteFile(p+release.SignatureSuffix, release.Sign(key, agent, version, platform, sum), 0o644))
	return body
}

func get(t *testing.T, url string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal(body, &e), "%s", body)
	return e.Error.Code
}

func TestDownloadsFromADirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	for _, v := range []string{"v1.2.0", "v1.9.9", "v1.10.0-rc.1"} {
		publish(t, dir, key, "compute-agent", v, "linux-amd64")
	}
	newest := publish(t, dir, key, "compute-agent", "v1.10.0", "linux-amd64")
	arm := publish(t, dir, key, "compute-agent", "v1.9.9", "linux-arm64")
	// An incomplete release (no signature) is neither served nor latest.
	publish(t, dir, key, "compute-agent", "v2.0.0", "linux-amd64")
	require.NoError(t, os.Remove(filepath.Join(dir, "compute-agent", "v2.0.0", "linux-amd64"+release.SignatureSuffix)))

	env := testenv.Start(t, testenv.WithEnv("SERVICE_DOWNLOADS_DIR", dir))
	base := env.APIURL + "/downloads/"

	// latest is the highest version in semver order (v1.10.0 > v1.9.9,
	// a release above its release candidate), per platform.
	resp, body := get(t, base+"compute-agent/latest/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, newest, body)
	assert.Equal(t, "v1.10.0", resp.Header.Get(downloads.HeaderVersion))
	assert.Equal(t, "/api/compute/downloads/compute-agent/v1.10.0/linux-amd64", resp.Header.Get("Content-Location"))
	assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	resp, body = get(t, base+"compute-agent/latest/linux-arm64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, arm, body)
	assert.Equal(t, "v1.9.9", resp.Header.Get(downloads.HeaderVersion))

	// The headers carry what verifies the bytes: checksum and signature.
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sum := sha256.Sum256(body)
	assert.Equal(t, "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":", resp.Header.Get(downloads.HeaderDigest))
	sigHeader := resp.Header.Get(downloads.HeaderSignature)
	require.True(t, strings.HasPrefix(sigHeader, "ed25519=:") && strings.HasSuffix(sigHeader, ":"), sigHeader)
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSuffix(strings.TrimPrefix(sigHeader, "ed25519=:"), ":"))
	require.NoError(t, err)
	require.NoError(t, release.Verify([]ed25519.PublicKey{pub}, "compute-agent", "v1.10.0", "linux-amd64", sum, sum, sig))
	assert.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"))
	etag := resp.Header.Get("ETag")
	assert.Equal(t, fmt.Sprintf(`"sha256-%x"`, sum), etag)

	// The siblings, as files: sha256sum -c reads the first.
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64.sha256")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fmt.Sprintf("%x  linux-amd64\n", sum), string(body))
	resp, body = get(t, base+"compute-agent/latest/linux-amd64.sig")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, sig, body)

	// Range and conditional requests (http.ServeContent).
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64", "Range", "bytes=2-5")
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	assert.Equal(t, newest[2:6], body)
	assert.Equal(t, fmt.Sprintf("bytes 2-5/%d", len(newest)), resp.Header.Get("Content-Range"))
	resp, _ = get(t, base+"compute-agent/v1.10.0/linux-amd64", "If-None-Match", etag)
	assert.Equal(t, http.StatusNotModified, resp.StatusCode)

	// HEAD answers the headers; other methods are refused.
	head, err := http.Head(base + "compute-agent/v1.10.0/linux-amd64")
	require.NoError(t, err)
	head.Body.Close()
	assert.Equal(t, http.StatusOK, head.StatusCode)
	assert.Equal(t, fmt.Sprint(len(newest)), head.Header.Get("Content-Length"))
	post, err := http.Post(base+"compute-agent/v1.10.0/linux-amd64", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	pb, _ := io.ReadAll(post.Body)
	post.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, post.StatusCode)
	assert.Equal(t, "METHOD_NOT_ALLOWED", errorCode(t, pb))
	assert.Equal(t, "GET, HEAD", post.Header.Get("Allow"))

	// Whatever is not there is NOT_FOUND in the API's error shape.
	for _, path := range []string{
		"compute-agent/v1.0.0/linux-amd64",      // no such version
		"compute-agent/v2.0.0/linux-amd64",      // incomplete: no signature
		"compute-agent/latest/linux-riscv64",    // no release for the platform
		"compute-guest/latest/linux-amd64",      // no such agent
		"compute-agent/1.10.0/linux-amd64",      // not a version
		"compute-agent/v1.10.0/linux-amd64.txt", // not a platform
		"compute-agent/v1.10.0",                 // too short
		"..%2f..%2fetc/v1.0.0/passwd",           // never leaves the directory
		"compute-agent/v1.10.0/linux-amd64/x",
	} {
		resp, body := get(t, base+path)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		assert.Equal(t, "NOT_FOUND", errorCode(t, body), path)
	}

	// Public: no credential is asked for (a machine being bootstrapped has
	// none); the signature is what protects an installation.
	resp, _ = get(t, base+"compute-agent/latest/linux-amd64", "Authorization", "Bearer not-a-key")
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// A version copied in later is served at once.
	newer := publish(t, dir, key, "compute-agent", "v1.11.0", "linux-amd64")
	resp, body = get(t, base+"compute-agent/latest/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, newer, body)
}

// Without the option the route is not there: the RPC envelope answers.
func TestNoDownloadsWithoutTheOption(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	resp, body := get(t, env.APIURL+"/downloads/compute-agent/latest/linux-amd64")
	assert.NotEqual(t, http.StatusOK, resp.StatusCode)
	assert.NotContains(t, string(body), "#!/bin/sh")
}
