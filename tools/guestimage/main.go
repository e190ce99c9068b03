// Command guestimage builds the minimal guest image the tests boot into
// .service/images when it is missing or stale, exactly as a test would
// (qemutest.Ensure). make test runs it before go test: a build from an
// empty kernel cache takes longer than go test's per-package timeout.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"computeplane/internal/qemu/qemutest"
)

func main() {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestimage: go env GOMOD:", err)
		os.Exit(1)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	if err := qemutest.Ensure(root, filepath.Join(root, ".service", "images"), os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "guestimage:", err)
		os.Exit(1)
	}
}
