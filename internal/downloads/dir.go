package downloads

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	"computeplane/internal/release"
)

// DirSource serves a release directory (downloads.dir). Each call opens
// the directory anew through os.Root, so a release copied in (or a
// symbolic link swapped to a new tree) is served at once, and nothing
// outside the directory is ever reached.
type DirSource struct {
	Dir string
}

// CheckDir refuses a directory that is not there: a start with a
// misspelt downloads.dir fails instead of answering 404 to every daemon.
func (d DirSource) CheckDir() error {
	st, err := os.Stat(d.Dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", d.Dir)
	}
	return nil
}

func (d DirSource) root() (*os.Root, error) {
	r, err := os.OpenRoot(d.Dir)
	if err != nil {
		return nil, fmt.Errorf("downloads: the directory %s: %w", d.Dir, err)
	}
	return r, nil
}

// Versions lists the versions under <agent>/ that hold platform with its
// checksum and signature.
func (d DirSource) Versions(ctx context.Context, agent, platform string) ([]string, error) {
	r, err := d.root()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(agent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		v := e.Name()
		if release.CheckVersion(v) != nil {
			continue
		}
		if complete(r, path.Join(agent, v, platform)) {
			out = append(out, v)
		}
	}
	return out, nil
}

// complete reports whether an artifact and both its siblings are there.
func complete(r *os.Root, p string) bool {
	for _, name := range []string{p, p + release.ChecksumSuffix, p + release.SignatureSuffix} {
		st, err := r.Stat(name)
		if err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// Open opens <agent>/<version>/<platform> with its siblings.
func (d DirSource) Open(ctx context.Context, agent, version, platform string) (*Artifact, error) {
	r, err := d.root()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	p := release.Path(agent, version, platform)
	sumFile, err := readSmall(r, p+release.ChecksumSuffix)
	if err != nil {
		return nil, err
	}
	sum, err := release.ParseChecksum(sumFile)
	if err != nil {
		return nil, fmt.Errorf("downloads: %s%s: %w", p, release.ChecksumSuffix, err)
	}
	sig, err := readSmall(r, p+release.SignatureSuffix)
	if err != nil {
		return nil, err
	}
	f, err := r.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, ErrNotFound
	}
	return &Artifact{Content: f, Size: st.Size(), ModTime: st.ModTime(), SHA256: sum, Signature: sig}, nil
}

// readSmall reads a sibling file (a checksum or a signature: bytes, not
// megabytes).
func readSmall(r *os.Root, name string) ([]byte, error) {
	f, err := r.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4096))
}
