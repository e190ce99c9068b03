package downloads

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"computeplane/internal/blob"
	"computeplane/internal/release"
)

// BlobStore is what BlobSource needs of a blob store (blob.S3 has it):
// listing, small reads, a size, and reads from an offset for Range
// requests.
type BlobStore interface {
	List(ctx context.Context, prefix string) ([]blob.Object, error)
	Stat(ctx context.Context, key string) (blob.Object, error)
	GetFrom(ctx context.Context, key string, offset int64) (io.ReadCloser, error)
}

// BlobSource serves releases from an S3-compatible store (downloads.blob)
// laid out as a release directory is, under the store's prefix:
// <agent>/<version>/<os>-<arch> with its .sha256 and .sig. Nothing is
// cached: a version uploaded is served at once, as with a directory.
type BlobSource struct {
	Store BlobStore
}

// Versions lists the versions under <agent>/ whose platform artifact has
// its checksum and signature beside it.
func (b BlobSource) Versions(ctx context.Context, agent, platform string) ([]string, error) {
	objs, err := b.Store.List(ctx, agent+"/")
	if err != nil {
		return nil, err
	}
	want := map[string]int{platform: 1, platform + release.ChecksumSuffix: 2, platform + release.SignatureSuffix: 4}
	found := map[string]int{}
	for _, o := range objs {
		parts := strings.Split(o.Key, "/")
		if len(parts) != 3 || release.CheckVersion(parts[1]) != nil {
			continue
		}
		found[parts[1]] |= want[parts[2]]
	}
	var out []string
	for v, bits := range found {
		if bits == 7 {
			out = append(out, v)
		}
	}
	return out, nil
}

// Open opens <agent>/<version>/<platform> with its siblings. The bytes
// are read lazily, from the offset a Range request seeks to.
func (b BlobSource) Open(ctx context.Context, agent, version, platform string) (*Artifact, error) {
	p := release.Path(agent, version, platform)
	sumFile, err := b.small(ctx, p+release.ChecksumSuffix)
	if err != nil {
		return nil, err
	}
	sum, err := release.ParseChecksum(sumFile)
	if err != nil {
		return nil, fmt.Errorf("downloads: %s%s: %w", p, release.ChecksumSuffix, err)
	}
	sig, err := b.small(ctx, p+release.SignatureSuffix)
	if err != nil {
		return nil, err
	}
	st, err := b.Store.Stat(ctx, p)
	if err != nil {
		return nil, notFound(err)
	}
	return &Artifact{Content: newBlobReader(ctx, b.Store, p, st.Size), Size: st.Size, ModTime: st.Modified, SHA256: sum, Signature: sig}, nil
}

// small reads a sibling object (bytes, not megabytes).
func (b BlobSource) small(ctx context.Context, key string) ([]byte, error) {
	r, err := b.Store.GetFrom(ctx, key, 0)
	if err != nil {
		return nil, notFound(err)
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, 4096))
}

func notFound(err error) error {
	if errors.Is(err, blob.ErrNotFound) {
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	return err
}

// blobReader is an object read from the position Seek left: each seek
// that moves drops the open body, and the next Read asks the store for
// the bytes from there. Its reads are bounded by progress, like the
// download they feed: a store that sends nothing for StallTimeout is cut
// off; the request's deadline (SourceTimeout) does not bound them, the
// body of a binary takes longer.
type blobReader struct {
	store BlobStore
	key   string
	size  int64

	ctx    context.Context
	cancel context.CancelFunc
	stall  *time.Timer

	mu   sync.Mutex
	pos  int64
	body io.ReadCloser
}

func newBlobReader(ctx context.Context, s BlobStore, key string, size int64) *blobReader {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &blobReader{store: s, key: key, size: size, ctx: ctx, cancel: cancel}
	r.stall = time.AfterFunc(time.Hour, cancel)
	r.stall.Stop()
	return r
}

func (r *blobReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pos >= r.size {
		return 0, io.EOF
	}
	r.stall.Reset(StallTimeout)
	defer r.stall.Stop()
	if r.body == nil {
		body, err := r.store.GetFrom(r.ctx, r.key, r.pos)
		if err != nil {
			return 0, err
		}
		r.body = body
	}
	n, err := r.body.Read(p)
	r.pos += int64(n)
	if err == io.EOF && r.pos < r.size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (r *blobReader) Seek(offset int64, whence int) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var to int64
	switch whence {
	case io.SeekStart:
		to = offset
	case io.SeekCurrent:
		to = r.pos + offset
	case io.SeekEnd:
		to = r.size + offset
	default:
		return 0, errors.New("downloads: bad whence")
	}
	if to < 0 {
		return 0, errors.New("downloads: seek before the start")
	}
	if to != r.pos && r.body != nil {
		_ = r.body.Close()
		r.body = nil
	}
	r.pos = to
	return to, nil
}

func (r *blobReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stall.Stop()
	r.cancel()
	if r.body != nil {
		err := r.body.Close()
		r.body = nil
		return err
	}
	return nil
}

// Sources serves from each source in turn (downloads with both dir and
// blob: the directory first). latest is the highest version any of them
// holds; a version is opened from the first source that has it.
type Sources []Source

func (s Sources) Versions(ctx context.Context, agent, platform string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, src := range s {
		vs, err := src.Versions(ctx, agent, platform)
		if err != nil {
			// A source that does not answer could hold the latest: no
			// answer rather than a wrong one.
			return nil, err
		}
		for _, v := range vs {
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	return out, nil
}

func (s Sources) Open(ctx context.Context, agent, version, platform string) (*Artifact, error) {
	for _, src := range s {
		a, err := src.Open(ctx, agent, version, platform)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		return a, err
	}
	return nil, ErrNotFound
}
