package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"computeplane/internal/agentproto"
)

// The volume store: one sparse raw file per volume, <serial>.raw in the
// volume directory, created and grown (never shrunk) to the size the spec
// asks as soon as the spec arrives, even under a running guest; a file of
// a volume the spec no longer holds is deleted.

var serialRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,20}$`)

const volumeSuffix = ".raw"

// applyVolumes converges the volume directory on the spec's volumes. A
// spec without a volumes key leaves the store as it is.
func applyVolumes(dir string, body json.RawMessage) error {
	var spec struct {
		Volumes *[]agentproto.VolumeSpec `json:"volumes"`
	}
	if err := json.Unmarshal(body, &spec); err != nil || spec.Volumes == nil {
		return nil // the runtime reports a malformed spec
	}
	want := map[string]int64{}
	var errs []error
	for _, v := range *spec.Volumes {
		if !serialRe.MatchString(v.Serial) || v.SizeGiB < 1 {
			errs = append(errs, fmt.Errorf("volume %q: a serial of 1 to 20 letters, digits, _ or - and a size of at least 1 GiB", v.Serial))
			continue
		}
		want[v.Serial] = v.SizeGiB << 30
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for serial, size := range want {
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

// volumeFiles lists the volumes the store holds.
func volumeFiles(dir string) []agentproto.VolumeStatus {
	out := []agentproto.VolumeStatus{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		serial, ok := strings.CutSuffix(e.Name(), volumeSuffix)
		if !ok || !e.Type().IsRegular() || !serialRe.MatchString(serial) {
			continue
		}
		if info, err := e.Info(); err == nil {
			out = append(out, agentproto.VolumeStatus{Serial: serial, SizeBytes: info.Size()})
		}
	}
	return out
}
