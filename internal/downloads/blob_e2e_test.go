package downloads_test

// The downloads route served from a real S3-compatible server
// (versitygw, blobtest) through the real api role over HTTP.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/blob"
	"computeplane/internal/blob/blobtest"
	"computeplane/internal/downloads"
	"computeplane/internal/release"
	"computeplane/internal/testenv"
)

// publishBlob uploads one signed artifact (body of size bytes) and
// returns its bytes; skip names a sibling left out.
func publishBlob(t *testing.T, st *blob.S3, key ed25519.PrivateKey, agent, version, platform string, size int, skip string) []byte {
	t.Helper()
	body := make([]byte, size)
	_, _ = rand.Read(body)
	copy(body, fmt.Sprintf("#!/bin/sh\necho %s %s\n", agent, version))
	sum := sha256.Sum256(body)
	p := release.Path(agent, version, platform)
	for name, b := range map[string][]byte{
		p:                           body,
		p + release.ChecksumSuffix:  release.ChecksumFile(platform, sum),
		p + release.SignatureSuffix: release.Sign(key, agent, version, platform, sum),
	} {
		if skip != "" && strings.HasSuffix(name, skip) {
			continue
		}
		require.NoError(t, st.Put(t.Context(), name, bytes.NewReader(b), int64(len(b))))
	}
	return body
}

// configFile writes a configuration file with the downloads option.
func configFile(t *testing.T, downloadsYAML string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "computed.yaml")
	require.NoError(t, os.WriteFile(p, []byte("downloads: "+downloadsYAML+"\n"), 0o600))
	return p
}

func TestDownloadsFromABlobStore(t *testing.T) {
	srv := blobtest.Start(t)
	for k, v := range srv.Env() {
		t.Setenv(k, v)
	}
	st := srv.Store(t, "releases")
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	publishBlob(t, st, key, "compute-agent", "v1.2.0", "linux-amd64", 100, "")
	publishBlob(t, st, key, "compute-agent", "v1.9.9", "linux-amd64", 100, "")
	newest := publishBlob(t, st, key, "compute-agent", "v1.10.0", "linux-amd64", 300<<10, "")
	arm := publishBlob(t, st, key, "compute-agent", "v1.9.9", "linux-arm64", 100, "")
	publishBlob(t, st, key, "compute-agent", "v2.0.0", "linux-amd64", 100, release.SignatureSuffix) // incomplete
	publishBlob(t, st, key, "compute-agent", "v3.0.0", "linux-amd64", 100, release.ChecksumSuffix)  // incomplete

	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", configFile(t, fmt.Sprintf("{blob: %q}", srv.URL("releases")))))
	base := env.APIURL + "/downloads/"

	// latest: semver order, only complete artifacts, per platform.
	resp, body := get(t, base+"compute-agent/latest/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, newest, body)
	assert.Equal(t, "v1.10.0", resp.Header.Get(downloads.HeaderVersion))
	assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	resp, body = get(t, base+"compute-agent/latest/linux-arm64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, arm, body)

	// Checksum and signature in the headers verify the bytes.
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sum := sha256.Sum256(body)
	assert.Equal(t, "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":", resp.Header.Get(downloads.HeaderDigest))
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSuffix(strings.TrimPrefix(resp.Header.Get(downloads.HeaderSignature), "ed25519=:"), ":"))
	require.NoError(t, err)
	require.NoError(t, release.Verify([]ed25519.PublicKey{pub}, "compute-agent", "v1.10.0", "linux-amd64", sum, sum, sig))
	etag := resp.Header.Get("ETag")
	assert.Equal(t, fmt.Sprintf(`"sha256-%x"`, sum), etag)
	assert.Equal(t, "public, max-age=86400", resp.Header.Get("Cache-Control"))

	// The siblings as files.
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64.sha256")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fmt.Sprintf("%x  linux-amd64\n", sum), string(body))
	resp, body = get(t, base+"compute-agent/latest/linux-amd64.sig")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, sig, body)

	// Range requests read from the store at the offset (a resumed
	// download), one range or several; conditional requests answer 304.
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64", "Range", "bytes=200000-")
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	assert.Equal(t, newest[200000:], body)
	assert.Equal(t, fmt.Sprintf("bytes 200000-%d/%d", len(newest)-1, len(newest)), resp.Header.Get("Content-Range"))
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64", "Range", "bytes=2-5,100000-100009")
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	assert.Contains(t, string(body), string(newest[2:6]))
	assert.Contains(t, string(body), string(newest[100000:100010]))
	resp, body = get(t, base+"compute-agent/v1.10.0/linux-amd64", "Range", "bytes=-10")
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	assert.Equal(t, newest[len(newest)-10:], body)
	resp, _ = get(t, base+"compute-agent/v1.10.0/linux-amd64", "If-None-Match", etag)
	assert.Equal(t, http.StatusNotModified, resp.StatusCode)
	head, err := http.Head(base + "compute-agent/v1.10.0/linux-amd64")
	require.NoError(t, err)
	head.Body.Close()
	assert.Equal(t, fmt.Sprint(len(newest)), head.Header.Get("Content-Length"))

	for _, path := range []string{
		"compute-agent/v1.0.0/linux-amd64",   // no such version
		"compute-agent/v2.0.0/linux-amd64",   // no signature
		"compute-agent/v3.0.0/linux-amd64",   // no checksum
		"compute-agent/latest/linux-riscv64", // no release for the platform
		"compute-guest/latest/linux-amd64",   // no such agent
	} {
		resp, body := get(t, base+path)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		assert.Equal(t, "NOT_FOUND", errorCode(t, body), path)
	}

	// Uploaded later, served at once.
	newer := publishBlob(t, st, key, "compute-agent", "v1.11.0", "linux-amd64", 100, "")
	resp, body = get(t, base+"compute-agent/latest/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, newer, body)
}

// With dir and blob, the directory is asked first and latest is the
// highest of both.
func TestDownloadsFromADirectoryAndABlobStore(t *testing.T) {
	srv := blobtest.Start(t)
	for k, v := range srv.Env() {
		t.Setenv(k, v)
	}
	st := srv.Store(t, "r")
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	dir := t.TempDir()
	fromDir := publish(t, dir, key, "compute-agent", "v1.0.0", "linux-amd64")
	publishBlob(t, st, key, "compute-agent", "v1.0.0", "linux-amd64", 50, "") // shadowed by the directory's
	fromBlob := publishBlob(t, st, key, "compute-agent", "v1.1.0", "linux-amd64", 50, "")
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", configFile(t, fmt.Sprintf("{dir: %q, blob: %q}", dir, srv.URL("r")))))
	base := env.APIURL + "/downloads/"

	resp, body := get(t, base+"compute-agent/latest/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, fromBlob, body)
	resp, body = get(t, base+"compute-agent/v1.0.0/linux-amd64")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fromDir, body)
}

// A store that does not answer is UNAVAILABLE with retryAfterMs, not
// NOT_FOUND (a daemon retries instead of concluding there is no release).
func TestDownloadsBlobStoreDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	t.Setenv(blob.EnvAccessKeyID, "id")
	t.Setenv(blob.EnvSecretAccessKey, "secret")
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", configFile(t, fmt.Sprintf("{blob: %q}", "s3://releases/x?endpoint=http://"+addr))))
	for _, path := range []string{"compute-agent/latest/linux-amd64", "compute-agent/v1.0.0/linux-amd64"} {
		resp, body := get(t, env.APIURL+"/downloads/"+path)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
		assert.Equal(t, "UNAVAILABLE", errorCode(t, body))
		assert.Contains(t, string(body), "retryAfterMs")
	}
}
