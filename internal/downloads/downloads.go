// Package downloads serves release artifacts (daemon binaries, plugin
// archives) at GET {basePath}/downloads/<agent>/<version>/<os>-<arch>
// from a Source: a directory laid out as internal/release describes
// (DirSource), or a blob store (another Source, added beside it).
//
// An answer carries its checksum and signature in headers, so that one
// request gives the client everything it verifies, even for `latest`,
// which could move between requests:
//
//	Repr-Digest: sha-256=:<base64>:              (RFC 9530)
//	X-Release-Signature: ed25519=:<base64>:      signature of release.Statement
//	X-Release-Version: v1.2.3                    the version served (latest resolved)
//	Content-Location: {basePath}/downloads/<agent>/v1.2.3/<os>-<arch>
//
// The sibling files are served too, for scripts and people:
// .../<os>-<arch>.sha256 and .../<os>-<arch>.sig.
//
// Downloads are public, like the well-known document: a machine being
// bootstrapped has no credential yet, and binaries are no secret. What
// protects an installation is the signature, checked against a key the
// daemon pinned when it joined (or its operator gave it).
package downloads

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"time"
)

// ErrNotFound is a Source's answer for an artifact it does not hold.
var ErrNotFound = errors.New("downloads: no such artifact")

// Artifact is one opened artifact and what verifies it.
type Artifact struct {
	// Content is the artifact's bytes; the caller closes it.
	Content io.ReadSeekCloser
	Size    int64
	ModTime time.Time
	// SHA256 is the published checksum; Signature the raw Ed25519
	// signature of release.Statement.
	SHA256    [32]byte
	Signature []byte
}

// Source holds release artifacts. Implementations answer ErrNotFound (or
// an error wrapping it) for what they do not hold and bound their calls by
// ctx.
type Source interface {
	// Versions lists the versions of agent published for platform.
	Versions(ctx context.Context, agent, platform string) ([]string, error)
	// Open opens one artifact with its checksum and signature; the three
	// must all exist or the artifact is not found.
	Open(ctx context.Context, agent, version, platform string) (*Artifact, error)
}

// b64 is the encoding of header values (RFC 8941 byte sequences).
var b64 = base64.StdEncoding
