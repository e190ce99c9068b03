package release

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MaxArtifactBytes refuses a download larger than any daemon binary.
const MaxArtifactBytes = 512 << 20

// Download is the answer of the downloads route for one artifact, its
// body not yet read: the version it names (X-Release-Version), its
// published SHA-256 (Repr-Digest) and its signature (X-Release-Signature).
type Download struct {
	URL       string
	Version   string
	Digest    [sha256.Size]byte
	Signature []byte
	body      io.ReadCloser
}

// Get asks the downloads route for an artifact (url is
// {basePath}/downloads/<agent>/<version>/<os>-<arch>); the answer must
// name a version and carry a checksum and a signature. The caller
// closes the Download. hc bounds the call (its Timeout, and ctx).
func Get(ctx context.Context, hc *http.Client, url string) (*Download, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			resp.Body.Close()
		}
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, answerError(resp))
	}
	d := &Download{URL: url, Version: resp.Header.Get("X-Release-Version"), body: resp.Body}
	if CheckVersion(d.Version) != nil {
		return nil, fmt.Errorf("%s: the answer names no version (X-Release-Version %q)", url, d.Version)
	}
	want, err := headerBytes(resp.Header.Get("Repr-Digest"), "sha-256")
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("%s: the answer carries no SHA-256 (Repr-Digest)", url)
	}
	d.Digest = [sha256.Size]byte(want)
	if d.Signature, err = headerBytes(resp.Header.Get("X-Release-Signature"), "ed25519"); err != nil {
		return nil, fmt.Errorf("%s: the answer carries no signature (X-Release-Signature)", url)
	}
	ok = true
	return d, nil
}

// Close ends the download's body.
func (d *Download) Close() error { return d.body.Close() }

// Install writes the artifact, executable, to dest: it is written beside
// dest (the same file system, so that the rename is atomic: a crash
// leaves the old file or the new one, never half of one), hashed as it
// is written, verified against the published checksum and the signature
// by one of keys (Verify, for agent on platform), and only then renamed
// over dest. Nothing unverified is ever left at dest.
func (d *Download) Install(dest string, keys []ed25519.PublicKey, agent, platform string) ([sha256.Size]byte, error) {
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".download-*")
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removed on any failure
	hr := NewHashReader(io.LimitReader(d.body, MaxArtifactBytes+1))
	n, err := io.Copy(tmp, hr)
	if err == nil && n > MaxArtifactBytes {
		err = fmt.Errorf("the artifact is larger than %d bytes", MaxArtifactBytes)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("download: %w", err)
	}
	sum := hr.Sum()
	if err := Verify(keys, agent, d.Version, platform, sum, d.Digest, d.Signature); err != nil {
		return sum, fmt.Errorf("%s %s refused: %w", agent, d.Version, err)
	}
	if err := os.Chmod(tmp.Name(), 0o755); err != nil {
		return sum, err
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return sum, err
	}
	if dir, err := os.Open(filepath.Dir(dest)); err == nil {
		_ = dir.Sync() // the rename survives a power loss
		dir.Close()
	}
	return sum, nil
}

// headerBytes reads an RFC 8941 dictionary member key=:base64: from h.
func headerBytes(h, key string) ([]byte, error) {
	for _, member := range strings.Split(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(member), "=")
		if !ok || k != key || len(v) < 2 || v[0] != ':' || v[len(v)-1] != ':' {
			continue
		}
		return base64.StdEncoding.DecodeString(v[1 : len(v)-1])
	}
	return nil, errors.New("no " + key)
}

// answerError is an error answer's message, or its status.
func answerError(resp *http.Response) string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if json.Unmarshal(raw, &e) == nil && e.Error.Code != "" {
		return e.Error.Code + ": " + e.Error.Message
	}
	return "HTTP " + strconv.Itoa(resp.StatusCode)
}
