package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"computeplane/internal/qemu"
)

// InstallHint says how the qemu runtime's binaries get onto a Debian or
// Ubuntu host (qemu-system-x86 has qemu-system-x86_64, qemu-utils has
// qemu-img).
const InstallHint = "apt-get install qemu-system-x86 qemu-utils"

// PreflightTimeout bounds each probe of CheckQEMU.
const PreflightTimeout = 10 * time.Second

// CheckQEMU is the qemu runtime's check before the daemon starts: both
// binaries on PATH and each answering --version. A daemon that skipped it
// would take specs and fail every instance ("executable file not found")
// while its node looks ready. The error names the binary and how to
// install it.
func CheckQEMU(ctx context.Context) (version string, err error) {
	for _, bin := range []string{qemu.Binary, qemu.ImgBinary} {
		path, err := exec.LookPath(bin)
		if err != nil {
			return "", fmt.Errorf("the qemu runtime needs %s, which is not on PATH: install it (%s)", bin, InstallHint)
		}
		pctx, cancel := context.WithTimeout(ctx, PreflightTimeout)
		out, err := exec.CommandContext(pctx, path, "--version").CombinedOutput()
		cancel()
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if err != nil {
			if errors.Is(pctx.Err(), context.DeadlineExceeded) {
				err = fmt.Errorf("no answer within %s", PreflightTimeout)
			}
			return "", fmt.Errorf("the qemu runtime's %s (%s) does not run: `%s --version`: %v %s; reinstall it (%s)", bin, path, bin, err, first, InstallHint)
		}
		if bin == qemu.Binary {
			version = first
		}
	}
	return version, nil
}
