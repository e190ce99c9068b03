// Package release owns the format of a release: where each artifact lies,
// its checksum file, the statement its signature covers and the check a
// daemon makes before it installs one. `make release` (tools/release)
// writes releases, the downloads route serves them, and
// `compute-agent upgrade` verifies them; all three use this package.
//
// Layout, under a release directory (downloads.dir serves one):
//
//	<agent>/<version>/<os>-<arch>         the binary (or a plugin archive)
//	<agent>/<version>/<os>-<arch>.sha256  "<hex>  <os>-<arch>\n" (sha256sum -c reads it)
//	<agent>/<version>/<os>-<arch>.sig     the raw 64-byte Ed25519 signature of Statement
//	release-key.pem                       the release public key (PKIX PEM), for people
//
// The signature covers a statement naming the artifact, not the bytes
// alone: a signed v1.0.0 cannot be served as v1.1.0, nor a compute-guest as
// a compute-agent.
package release

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"
)

// Suffixes of an artifact's sibling files.
const (
	ChecksumSuffix  = ".sha256"
	SignatureSuffix = ".sig"
	// KeyFile is the release public key at the top of a release
	// directory.
	KeyFile = "release-key.pem"
)

// Latest names the highest version of an agent (semver order).
const Latest = "latest"

var (
	agentRe    = regexp.MustCompile(`^[a-z][a-z0-9-]{0,63}$`)
	platformRe = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}-[a-z][a-z0-9_]{0,15}$`)
)

// CheckAgent checks an agent (or plugin) name: 1 to 64 characters of
// a-z, 0-9 and -, starting with a letter.
func CheckAgent(name string) error {
	if !agentRe.MatchString(name) {
		return fmt.Errorf("release: %q is not an agent name (a-z, 0-9 and -, starting with a letter)", name)
	}
	return nil
}

// CheckVersion checks a release version: a semantic version with a
// leading v (v1.2.3, v1.3.0-rc.1).
func CheckVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v { // v1 and v1.2 are shorthands; +build is dropped
		return fmt.Errorf("release: %q is not a version such as v1.2.3 (semantic, with a leading v, no build metadata)", v)
	}
	return nil
}

// CheckPlatform checks <os>-<arch> (linux-amd64).
func CheckPlatform(p string) error {
	if !platformRe.MatchString(p) {
		return fmt.Errorf("release: %q is not a platform such as linux-amd64", p)
	}
	return nil
}

// Compare orders two versions in semver order (-1, 0, +1).
func Compare(a, b string) int { return semver.Compare(a, b) }

// Highest returns the highest valid version of vs, "" when none is.
func Highest(vs []string) string {
	best := ""
	for _, v := range vs {
		if CheckVersion(v) == nil && (best == "" || semver.Compare(v, best) > 0) {
			best = v
		}
	}
	return best
}

// Path is an artifact's path in a release directory, slash-separated.
func Path(agent, version, platform string) string {
	return agent + "/" + version + "/" + platform
}

// Statement is what the signature of an artifact covers.
func Statement(agent, version, platform string, sum [sha256.Size]byte) []byte {
	return fmt.Appendf(nil, "computeplane-release v1\nagent %s\nversion %s\nplatform %s\nsha256 %x\n", agent, version, platform, sum)
}

// Sign signs an artifact's statement.
func Sign(key ed25519.PrivateKey, agent, version, platform string, sum [sha256.Size]byte) []byte {
	return ed25519.Sign(key, Statement(agent, version, platform, sum))
}

// ChecksumFile is the content of <platform>.sha256.
func ChecksumFile(platform string, sum [sha256.Size]byte) []byte {
	return fmt.Appendf(nil, "%x  %s\n", sum, platform)
}

// ParseChecksum reads a checksum file (or a bare hex digest).
func ParseChecksum(b []byte) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	field, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	raw, err := hex.DecodeString(field)
	if err != nil || len(raw) != sha256.Size {
		return sum, errors.New("release: not a SHA-256 checksum")
	}
	copy(sum[:], raw)
	return sum, nil
}

// Errors of Verify.
var (
	ErrChecksum  = errors.New("release: the artifact does not match its checksum")
	ErrSignature = errors.New("release: the signature does not verify with the pinned release key")
	ErrNoKey     = errors.New("release: no release key is pinned")
)

// Verify checks an artifact whose bytes hash to got: got must equal the
// published checksum want, and sig must be a signature of the statement
// by one of the pinned keys.
func Verify(keys []ed25519.PublicKey, agent, version, platform string, got, want [sha256.Size]byte, sig []byte) error {
	if got != want {
		return fmt.Errorf("%w: sha256 %x, published %x", ErrChecksum, got, want)
	}
	if len(keys) == 0 {
		return ErrNoKey
	}
	msg := Statement(agent, version, platform, got)
	for _, k := range keys {
		if len(k) == ed25519.PublicKeySize && len(sig) == ed25519.SignatureSize && ed25519.Verify(k, msg, sig) {
			return nil
		}
	}
	return ErrSignature
}

// HashReader hashes what it reads.
type HashReader struct {
	R io.Reader
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
}

// NewHashReader hashes r with SHA-256 as it is read.
func NewHashReader(r io.Reader) *HashReader { return &HashReader{R: r, h: sha256.New()} }

func (h *HashReader) Read(p []byte) (int, error) {
	n, err := h.R.Read(p)
	h.h.Write(p[:n])
	return n, err
}

// Sum is the SHA-256 of what was read so far.
func (h *HashReader) Sum() [sha256.Size]byte {
	var s [sha256.Size]byte
	copy(s[:], h.h.Sum(nil))
	return s
}

// PublicKeyPEM encodes a release public key as PKIX PEM.
func PublicKeyPEM(k ed25519.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(k) // an Ed25519 key always marshals
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// ParsePublicKey reads a release public key: PKIX PEM, or 64 hex digits.
func ParsePublicKey(b []byte) (ed25519.PublicKey, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("release: the public key: %w", err)
		}
		ek, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, errors.New("release: the public key is not Ed25519")
		}
		return ek, nil
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, errors.New("release: a release key is PKIX PEM or 64 hex digits")
	}
	return ed25519.PublicKey(raw), nil
}
