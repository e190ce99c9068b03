// Package qemutest gives tests the minimal guest image, built once per
// machine by images/build.sh into .service/images at the module root.
package qemutest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/images"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/vmowner"
)

// Image builds the minimal guest image if its manifest is missing or was
// built from other sources (images/, compute-guest's packages, go.sum:
// their hash is kept beside the manifests) and returns the manifest. A
// test that boots VMs calls it first.
func Image(t testing.TB) *images.Image {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86; .ci/run installs it)")
	}
	root := moduleRoot(t)
	dir := filepath.Join(root, ".service", "images")
	// Once per test process: the image does not change under a run.
	if !checked.Load() {
		require.NoError(t, Ensure(root, dir, nil))
		checked.Store(true)
	}
	return get(t, dir)
}

// Ensure builds the minimal guest image into dir with images/build.sh
// when a manifest is missing or the image was built from other sources.
// make test runs it (tools/guestimage) before go test, so that a build
// from an empty kernel cache is not charged to one test's timeout.
// build.sh's output goes to progress, or into the error when it is nil.
func Ensure(root, dir string, progress io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// One build at a time across processes.
	lock, err := os.OpenFile(filepath.Join(dir, ".build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	sources, err := sourcesHash(root)
	if err != nil {
		return err
	}
	stamp := filepath.Join(dir, "minimal.sources")
	built, _ := os.ReadFile(stamp)
	stale := string(built) != sources
	for _, manifest := range manifests {
		if _, err := os.Stat(filepath.Join(dir, manifest)); err != nil {
			stale = true
		}
	}
	if !stale {
		return nil
	}
	// build.sh keeps a manifest that is there: a stale image goes first.
	for _, manifest := range manifests {
		_ = os.Remove(filepath.Join(dir, manifest))
	}
	cmd := exec.Command(filepath.Join(root, "images", "build.sh"), dir)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if progress != nil {
		cmd.Stdout, cmd.Stderr = progress, progress
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("images/build.sh: %w: %s", err, out.Bytes())
	}
	return os.WriteFile(stamp, []byte(sources), 0o644)
}

var manifests = []string{"minimal.json", "minimal-raw.json", "minimal-qcow2.json"}

// checked is set once this process saw the image up to date.
var checked atomic.Bool

func get(t testing.TB, dir string) *images.Image {
	t.Helper()
	src := images.Dir{Path: dir}
	im, err := src.Get(t.Context(), "computeplane/minimal")
	require.NoError(t, err)
	return im
}

// DiskImage returns the minimal guest as a disk image of format (raw or
// qcow2), booted by firmware, from the same image source as Image.
func DiskImage(t testing.TB, format string) *images.Image {
	t.Helper()
	im := Image(t)
	src := images.Dir{Path: filepath.Dir(filepath.Dir(im.Location))}
	disk, err := src.Get(t.Context(), im.ID+"-"+format)
	require.NoError(t, err)
	return disk
}

// sourcesHash is a hash of what the image is built from: the files under
// images/, go.sum, and the Go files of the module's packages compute-guest
// is made of.
func sourcesHash(root string) (string, error) {
	h := sha256.New()
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "images"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	files = append(files, filepath.Join(root, "go.sum"))
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{range .GoFiles}}{{$.Dir}}/{{.}}
{{end}}{{end}}{{end}}`, "./cmd/compute-guest")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list compute-guest's packages: %w", err)
	}
	files = append(files, strings.Fields(string(out))...)
	slices.Sort(files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %x\n", strings.TrimPrefix(f, root), sha256.Sum256(data))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func moduleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// Main runs a package's tests that boot VMs and fails the package when a
// qemu process one of them started is still running after them (each test
// deletes, or its cleanup kills, what it booted). Use it as
// `func TestMain(m *testing.M) { qemutest.Main(m) }`.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain that does more: it returns the exit code.
func Run(m *testing.M) int {
	token := vmowner.Mark()
	code := m.Run()
	proctest.RemoveBuilds()
	// A deleted VM is removed in the background: give it a moment.
	if left := vmowner.WaitGone(token, 15*time.Second); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "qemutest: %d qemu process(es) of this package's tests still running after them (killed now):\n  %s\n",
			len(left), vmowner.Describe(left))
		vmowner.Kill(left)
		code = 1
	}
	return code
}
