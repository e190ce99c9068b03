package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ImgBinary is qemu's disk image tool.
var ImgBinary = "qemu-img"

// Overlay makes path a qcow2 disk whose backing file is the image at base
// (raw or qcow2): the VM writes into its own overlay and never into the
// image, which any number of VMs share read-only. An overlay already at
// path is kept (a VM stopped and started again keeps its disk).
func Overlay(ctx context.Context, base, baseFormat, path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if baseFormat != "raw" && baseFormat != "qcow2" {
		return fmt.Errorf("qemu: overlay of a %q image", baseFormat)
	}
	abs, err := filepath.Abs(base)
	if err != nil {
		return err
	}
	if strings.Contains(abs, ",") {
		return fmt.Errorf("qemu: image path %q holds a comma", abs)
	}
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	out, err := exec.CommandContext(ctx, ImgBinary, "create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", abs, tmp).CombinedOutput()
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("qemu: overlay of %s: %v: %s", base, err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, path)
}
