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

// Process is a qemu process of the owner.
type Process struct {
	PID     int
	Cmdline string
}

func (p Process) String() string { return fmt.Sprintf("%d: %s", p.PID, p.Cmdline) }

// Leftovers returns the qemu processes whose environment carries token.
func Leftovers(token string) []Process {
	want := []byte(Env + "=" + token + "\x00")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []Process
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.Contains(filepath.Base(string(bytes.SplitN(cmdline, []byte{0}, 2)[0])), "qemu-system") {
			continue
		}
		environ, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append(environ, 0), want) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		out = append(out, Process{PID: pid, Cmdline: strings.Join(strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"), " ")})
	}
	return out
}

// WaitGone waits up to timeout for the owner's qemu processes to end (a
// deleted VM is removed in the background) and returns those still left.
func WaitGone(token string, timeout time.Duration) []Process {
	deadline := time.Now().Add(timeout)
	for {
		left := Leftovers(token)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends the given leftovers.
func Kill(left []Process) {
	for _, p := range left {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// Describe lists leftovers one per line, for a failure message.
func Describe(left []Process) string {
	lines := make([]string, len(left))
	for i, p := range left {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n  ")
}
