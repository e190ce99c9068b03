package agent

// compute-agent upgrade against the real api role serving a release
// directory over HTTP: what is installed, and what is refused before it
// touches the binary.

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/release"
	"computeplane/internal/testenv"
)

type upgradeWorld struct {
	t        *testing.T
	releases string // the downloads directory
	key      ed25519.PrivateKey
	pub      ed25519.PublicKey
	dir      Dir
	exe      string
}

func newUpgradeWorld(t *testing.T) *upgradeWorld {
	w := &upgradeWorld{t: t, releases: t.TempDir(), dir: Dir(t.TempDir())}
	var err error
	w.pub, w.key, err = ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	env := testenv.Start(t, testenv.WithEnv("SERVICE_DOWNLOADS_DIR", w.releases))
	require.NoError(t, w.dir.SaveState(&State{NodeID: "node_a", APIURL: env.URL, ReleaseKeys: [][]byte{w.pub}}))
	w.exe = filepath.Join(t.TempDir(), "compute-agent")
	require.NoError(t, os.WriteFile(w.exe, []byte("old binary"), 0o755))
	return w
}

// publish writes a release signed by key with body.
func (w *upgradeWorld) publish(key ed25519.PrivateKey, version string, body []byte) string {
	p := filepath.Join(w.releases, AgentName, version, "linux-amd64")
	require.NoError(w.t, os.MkdirAll(filepath.Dir(p), 0o755))
	sum := sha256.Sum256(body)
	require.NoError(w.t, os.WriteFile(p, body, 0o755))
	require.NoError(w.t, os.WriteFile(p+release.ChecksumSuffix, release.ChecksumFile("linux-amd64", sum), 0o644))
	require.NoError(w.t, os.WriteFile(p+release.SignatureSuffix, release.Sign(key, AgentName, version, "linux-amd64", sum), 0o644))
	return p
}

func (w *upgradeWorld) upgrade(version, current string) (*UpgradeResult, error) {
	return Upgrade(w.t.Context(), UpgradeOptions{Dir: w.dir, Version: version, Current: current, Exe: w.exe, Platform: "linux-amd64"})
}

// refused checks that the binary is untouched and no download is left.
func (w *upgradeWorld) untouched(want string) {
	b, err := os.ReadFile(w.exe)
	require.NoError(w.t, err)
	assert.Equal(w.t, want, string(b), "the binary is untouched")
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(w.exe), ".*upgrade*"))
	assert.Empty(w.t, left, "no partial download is left beside it")
}

func TestUpgradeInstallsTheLatestSignedRelease(t *testing.T) {
	t.Parallel()
	w := newUpgradeWorld(t)
	w.publish(w.key, "v1.0.0", []byte("binary 1.0.0"))
	w.publish(w.key, "v2.0.0", []byte("binary 2.0.0"))

	res, err := w.upgrade("", "v1.0.0")
	require.NoError(t, err)
	assert.Equal(t, &UpgradeResult{From: "v1.0.0", To: "v2.0.0", Installed: true, Exe: w.exe}, res)
	w.untouched("binary 2.0.0")
	st, err := os.Stat(w.exe)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())

	// The version running is not installed again.
	res, err = w.upgrade("latest", "v2.0.0")
	require.NoError(t, err)
	assert.False(t, res.Installed)

	// A named version, older included (a rollback).
	res, err = w.upgrade("v1.0.0", "v2.0.0")
	require.NoError(t, err)
	assert.True(t, res.Installed)
	w.untouched("binary 1.0.0")

	_, err = w.upgrade("v9.0.0", "v1.0.0")
	require.ErrorContains(t, err, "NOT_FOUND")
	w.untouched("binary 1.0.0")
}

func TestUpgradeRefusesWhatDoesNotVerify(t *testing.T) {
	t.Parallel()
	w := newUpgradeWorld(t)
	good := w.publish(w.key, "v2.0.0", []byte("binary 2.0.0"))

	// Bytes changed after signing: they do not match the checksum.
	p := w.publish(w.key, "v3.0.0", []byte("binary 3.0.0"))
	require.NoError(t, os.WriteFile(p, []byte("binary 3.0.0 with a backdoor"), 0o755))
	_, err := w.upgrade("v3.0.0", "v1.0.0")
	require.ErrorIs(t, err, release.ErrChecksum)
	w.untouched("old binary")

	// Bytes and checksum replaced together: the signature is of the
	// original checksum.
	p = w.publish(w.key, "v3.0.1", []byte("binary 3.0.1"))
	evil := []byte("binary 3.0.1 with a backdoor")
	require.NoError(t, os.WriteFile(p, evil, 0o755))
	require.NoError(t, os.WriteFile(p+release.ChecksumSuffix, release.ChecksumFile("linux-amd64", sha256.Sum256(evil)), 0o644))
	_, err = w.upgrade("v3.0.1", "v1.0.0")
	require.ErrorIs(t, err, release.ErrSignature)
	w.untouched("old binary")

	// Signed, but by a key the node did not pin.
	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	w.publish(other, "v3.0.2", []byte("binary 3.0.2"))
	_, err = w.upgrade("v3.0.2", "v1.0.0")
	require.ErrorIs(t, err, release.ErrSignature)
	w.untouched("old binary")

	// A genuine v2.0.0 put up as v3.0.3: its signature names v2.0.0.
	dst := filepath.Join(w.releases, AgentName, "v3.0.3", "linux-amd64")
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	for _, sfx := range []string{"", release.ChecksumSuffix, release.SignatureSuffix} {
		b, err := os.ReadFile(good + sfx)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst+sfx, b, 0o644))
	}
	_, err = w.upgrade("v3.0.3", "v1.0.0")
	require.ErrorIs(t, err, release.ErrSignature)
	w.untouched("old binary")
	// latest is that replayed v3.0.3 now: refused the same way.
	_, err = w.upgrade("", "v1.0.0")
	require.ErrorIs(t, err, release.ErrSignature)
	w.untouched("old binary")
}

func TestUpgradeNeedsAPinnedKey(t *testing.T) {
	t.Parallel()
	w := newUpgradeWorld(t)
	w.publish(w.key, "v2.0.0", []byte("binary 2.0.0"))
	st, err := w.dir.LoadState()
	require.NoError(t, err)
	st.ReleaseKeys = nil // joined before the control plane had a release key
	require.NoError(t, w.dir.SaveState(st))
	_, err = w.upgrade("", "v1.0.0")
	require.ErrorIs(t, err, release.ErrNoKey)
	assert.ErrorContains(t, err, "--release-key")
	w.untouched("old binary")

	// The operator pins one (--release-key).
	res, err := Upgrade(t.Context(), UpgradeOptions{Dir: w.dir, Current: "v1.0.0", Exe: w.exe, Platform: "linux-amd64",
		ReleaseKeys: []ed25519.PublicKey{w.pub}})
	require.NoError(t, err)
	assert.True(t, res.Installed)
	w.untouched("binary 2.0.0")
}
