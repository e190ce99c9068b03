package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"computeplane/internal/agentproto"
)

// The volume store: one sparse raw file per volume, <serial>.raw in the
// volume directory, created and grown (never shrunk) to the size the spec
// asks as soon as the spec arrives, even under a running guest; a file of
// a volume the spec no longer holds is deleted.

var serialRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,20}$`)

const volumeSuffix = ".raw"

// MaxVolumeGiB bounds one volume (64 TiB): a larger size is a spec's
// mistake, and a shift past it would overflow.
const MaxVolumeGiB = 64 << 10

// wantVolumes reads the volumes of a spec (untrusted: it comes from the
// gateway): the size in bytes per serial (0: keep the file as it is), and
// what was refused.
func wantVolumes(volumes []agentproto.VolumeSpec) (want map[string]int64, errs []error) {
	want = make(map[string]int64, len(volumes))
	for _, v := range volumes {
		if !serialRe.MatchString(v.Serial) || v.SizeGiB < 1 || v.SizeGiB > MaxVolumeGiB {
			errs = append(errs, fmt.Errorf("volume %q: a serial of 1 to 20 letters, digits, _ or - and a size of 1 GiB to %d GiB", v.Serial, MaxVolumeGiB))
			if _, dup := want[v.Serial]; !dup && serialRe.MatchString(v.Serial) {
				want[v.Serial] = 0 // a bad size: the file is kept as it is, not deleted
			}
			continue
		}
		want[v.Serial] = v.SizeGiB << 30
	}
	return want, errs
}

// applyVolumes converges the volume directory on the spec's volumes. A
// spec without volumes (nil: a control plane that does not speak of them)
// leaves the store as it is.
func applyVolumes(dir string, volumes []agentproto.VolumeSpec) error {
	if volumes == nil {
		return nil
	}
	want, errs := wantVolumes(volumes)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for serial, size := range want {
		if size <= 0 {
			continue
		}
		path := filepath.Join(dir, serial+volumeSuffix)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if info, err := f.Stat(); err == nil && info.Size() < size {
			err = f.Truncate(size) // sparse: grows without writing
			errs = append(errs, err)
		}
		errs = append(errs, f.Close())
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		serial, ok := strings.CutSuffix(e.Name(), volumeSuffix)
		if ok && e.Type().IsRegular() && serialRe.MatchString(serial) {
			if _, keep := want[serial]; !keep {
				errs = append(errs, os.Remove(filepath.Join(dir, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}

// scanVolumes reads the volume directory once: the store as the control
// plane books against it (available bytes from statfs; reserved = the
// apparent size of its files, volumes being sparse raw files; outstanding
// = what they may still write, apparent minus allocated) and the volumes
// it holds.
func scanVolumes(dir string) (agentproto.VolumeStore, []agentproto.VolumeStatus) {
	var vs agentproto.VolumeStore
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil {
		vs.AvailableBytes = int64(st.Bavail) * int64(st.Bsize)
	}
	files := []agentproto.VolumeStatus{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		vs.ReservedBytes += info.Size()
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			vs.OutstandingBytes += max(0, info.Size()-sys.Blocks*512)
		}
		if serial, ok := strings.CutSuffix(e.Name(), volumeSuffix); ok && serialRe.MatchString(serial) {
			files = append(files, agentproto.VolumeStatus{Serial: serial, SizeBytes: info.Size()})
		}
	}
	return vs, files
}
