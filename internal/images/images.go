// Package images resolves image ids through the operator's image source: a
// directory of manifests (one JSON file per image) or an HTTP index of
// them, behind one interface. Without a source, whatever needs an image
// answers INVALID_CONFIG.
package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"computeplane/gen/api"
	"computeplane/internal/config"
)

// Formats of images.
const (
	FormatRaw          = "raw"
	FormatQcow2        = "qcow2"
	FormatKernelInitrd = "kernel+initrd"
)

// Image is one manifest: what a runtime needs to boot the image.
type Image struct {
	ID          string `json:"id"`
	Format      string `json:"format"`
	SizeBytes   int64  `json:"sizeBytes"`
	SHA256      string `json:"sha256"`
	Location    string `json:"location"` // the disk, or the kernel of kernel+initrd
	Initrd      string `json:"initrd,omitempty"`
	Cmdline     string `json:"cmdline,omitempty"`
	Description string `json:"description,omitempty"`
}

var (
	idRe     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:/-]{0,199}$`)
	sha256Re = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Check names the first problem of a manifest.
func (im *Image) Check() error {
	switch {
	case !idRe.MatchString(im.ID):
		return fmt.Errorf("id %q is not an ImageId", im.ID)
	case !slices.Contains([]string{FormatRaw, FormatQcow2, FormatKernelInitrd}, im.Format):
		return fmt.Errorf("format %q is not raw, qcow2 or kernel+initrd", im.Format)
	case im.SizeBytes < 0:
		return errors.New("sizeBytes is negative")
	case !sha256Re.MatchString(im.SHA256):
		return errors.New("sha256 is not 64 lowercase hex digits")
	case im.Location == "":
		return errors.New("location is empty")
	case (im.Format == FormatKernelInitrd) != (im.Initrd != ""):
		return errors.New("initrd is given exactly for the kernel+initrd format")
	}
	return nil
}

// Source lists and resolves images.
type Source interface {
	List(ctx context.Context) ([]Image, error)
	// Get returns the image, or an error wrapping ErrNotFound.
	Get(ctx context.Context, id string) (*Image, error)
}

// ErrNotFound is returned when no image has the id.
var ErrNotFound = errors.New("images: not found")

// ErrNoSource is the answer of NoSource.
var ErrNoSource = api.Errorf(api.CodeInvalidConfig, "no image source is configured (images.dir or images.url)")

// FromConfig returns the configured source; NoSource when none is.
func FromConfig(c *config.Images) Source {
	switch {
	case c == nil:
		return NoSource{}
	case c.Dir != "":
		return &Dir{Path: c.Dir}
	default:
		return &Index{URL: c.URL}
	}
}

// NoSource answers INVALID_CONFIG to everything.
type NoSource struct{}

func (NoSource) List(context.Context) ([]Image, error)       { return nil, ErrNoSource }
func (NoSource) Get(context.Context, string) (*Image, error) { return nil, ErrNoSource }

// Dir reads one manifest per *.json file of a directory at each call; a
// relative location is relative to the directory. Manifests that do not
// parse or check are left out (and named by Problems).
type Dir struct{ Path string }

func (d *Dir) read() ([]Image, []error, error) {
	names, err := filepath.Glob(filepath.Join(d.Path, "*.json"))
	if err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(d.Path); err != nil {
		return nil, nil, fmt.Errorf("images: the image directory: %w", err)
	}
	slices.Sort(names)
	var out []Image
	var problems []error
	for _, n := range names {
		raw, err := os.ReadFile(n)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		var im Image
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&im); err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", filepath.Base(n), err))
			continue
		}
		if err := im.Check(); err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", filepath.Base(n), err))
			continue
		}
		im.Location = d.resolve(im.Location)
		if im.Initrd != "" {
			im.Initrd = d.resolve(im.Initrd)
		}
		out = append(out, im)
	}
	return out, problems, nil
}

func (d *Dir) resolve(loc string) string {
	if strings.Contains(loc, "://") || filepath.IsAbs(loc) {
		return loc
	}
	return filepath.Join(d.Path, loc)
}

// List returns the directory's images by id.
func (d *Dir) List(context.Context) ([]Image, error) {
	ims, _, err := d.read()
	slices.SortFunc(ims, func(a, b Image) int { return strings.Compare(a.ID, b.ID) })
	return ims, err
}

// Problems names the manifests left out, for the self check.
func (d *Dir) Problems() []error {
	_, problems, err := d.read()
	if err != nil {
		return []error{err}
	}
	return problems
}

// Get returns one image.
func (d *Dir) Get(ctx context.Context, id string) (*Image, error) {
	return find(d.List(ctx))(id)
}

func find(ims []Image, err error) func(string) (*Image, error) {
	return func(id string) (*Image, error) {
		if err != nil {
			return nil, err
		}
		for i := range ims {
			if ims[i].ID == id {
				return &ims[i], nil
			}
		}
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
}

// Index reads {"images": [manifest...]} from an HTTP URL, kept for
// IndexTTL; a failure answers UNAVAILABLE.
type Index struct {
	URL    string
	Client *http.Client // nil: a client with IndexTimeout

	mu      sync.Mutex
	fetched time.Time
	images  []Image
}

// Timing of the HTTP index.
const (
	IndexTTL     = time.Minute
	IndexTimeout = 5 * time.Second
	maxIndex     = 8 << 20
)

// List returns the index's images by id.
func (x *Index) List(ctx context.Context) ([]Image, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.images != nil && time.Since(x.fetched) < IndexTTL {
		return x.images, nil
	}
	ims, err := x.fetch(ctx)
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "the image index could not be read: %v", err).
			WithDetails(map[string]any{"retryAfterMs": 5000})
	}
	x.images, x.fetched = ims, time.Now()
	return ims, nil
}

func (x *Index) fetch(ctx context.Context) ([]Image, error) {
	ctx, cancel := context.WithTimeout(ctx, IndexTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, x.URL, nil)
	if err != nil {
		return nil, err
	}
	c := x.Client
	if c == nil {
		c = &http.Client{Timeout: IndexTimeout}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var body struct {
		Images []Image `json:"images"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxIndex)).Decode(&body); err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(body.Images))
	for _, im := range body.Images {
		if im.Check() == nil {
			out = append(out, im)
		}
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Get returns one image.
func (x *Index) Get(ctx context.Context, id string) (*Image, error) {
	return find(x.List(ctx))(id)
}

// Runtimes and what they boot: the formats each VM runtime starts, and
// whether it passes GPUs through (the qemu runtime of this build does not).
var (
	runtimeFormats = map[string][]string{"qemu": {FormatKernelInitrd, FormatRaw, FormatQcow2}}
	gpuPassthrough = map[string]bool{}
)

// Boots reports whether runtime starts images of format.
func Boots(runtime, format string) bool { return slices.Contains(runtimeFormats[runtime], format) }

// PassesGPUs reports whether runtime passes a flavor's GPUs through.
func PassesGPUs(runtime string) bool { return gpuPassthrough[runtime] }
