// Package vmowner finds the qemu processes a test binary or a benchmark
// started, however deep in its process tree and after they were reparented:
// VMs outlive their daemon by design, so a test or benchmark that forgets
// to delete what it booted would otherwise leave them running.
//
// The owner marks its environment with a token (Mark); every process it
// starts, the compute-agent and its qemu children included, inherits it;
// Leftovers lists the qemu processes whose environment carries it.
package vmowner

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Env is the environment variable that carries the owner's token.
const Env = "COMPUTEPLANE_VM_OWNER"

// Mark sets a new token in this process's environment (inherited by the
// processes it starts from now on) and returns it.
func Mark() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	_ = os.Setenv(Env, token)
	return token
}

// Leftovers returns the qemu processes whose environment carries token,
// each as "pid: command line".
func Leftovers(token string) []string {
	want := []byte(Env + "=" + token + "\x00")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []string
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.Contains(filepath.Base(string(bytes.SplitN(cmdline, []byte{0}, 2)[0])), "qemu-system") {
			continue
		}
		environ, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append(environ, 0), want) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s", filepath.Base(d), strings.Join(strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"), " ")))
	}
	return out
}

// WaitGone waits up to timeout for the owner's qemu processes to end (a
// deleted VM is removed in the background) and returns those still left.
func WaitGone(token string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		left := Leftovers(token)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends the given leftovers (as Leftovers returned them).
func Kill(left []string) {
	for _, l := range left {
		pidText, _, _ := strings.Cut(l, ":")
		if pid, err := strconv.Atoi(pidText); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
