// Package proctest runs the project's binaries as real child processes in
// tests: build once, start with an environment of their own, wait for
// health, stop with SIGTERM or kill with SIGKILL, read their output.
package proctest

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Build compiles pkg (an import path such as computeplane/cmd/computed)
// into a temporary directory and returns the binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	return BuildVersion(t, pkg, "")
}

// BuildVersion is Build with the release version stamped as make release
// stamps it (internal/buildinfo); "" stamps none.
func BuildVersion(t testing.TB, pkg, version string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	args := []string{"build", "-o", bin}
	if version != "" {
		args = append(args, "-ldflags", "-X computeplane/internal/buildinfo.version="+version)
	}
	cmd := exec.Command("go", append(args, pkg)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build %s: %s", pkg, out)
	return bin
}

// ChildEnv is the test's environment without the service's variables,
// plus set.
func ChildEnv(set map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SERVICE_") || strings.HasPrefix(k, "SSL_CERT_") || k == "HOST" || k == "PORT" {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range set {
		out = append(out, k+"="+v)
	}
	return out
}

// Run runs bin to completion and returns its stdout, failing the test
// with its stderr when it fails.
func Run(t testing.TB, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %s: %s", filepath.Base(bin), strings.Join(args, " "), stderr.String())
	return string(out)
}

// CreateKey runs `computed iam create-key` and returns the key, the last
// line of its output.
func CreateKey(t testing.TB, computed string, env []string, tenant, identity, role string) string {
	t.Helper()
	out := Run(t, computed, env, "iam", "create-key", "--tenant", tenant, "--identity", identity, "--role", role)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// Buffer is a bytes.Buffer safe for a writer and readers at once.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Process is one child process.
type Process struct {
	Name           string
	Cmd            *exec.Cmd
	Stdout, Stderr *Buffer
	done           chan struct{}
}

// Start starts bin; the test's cleanup stops it (SIGTERM, then SIGKILL
// after 30 s) if it still runs.
func Start(t testing.TB, name, bin string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{Name: name, Stdout: &Buffer{}, Stderr: &Buffer{}, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = env
	p.Cmd.Stdout, p.Cmd.Stderr = p.Stdout, p.Stderr
	require.NoError(t, p.Cmd.Start())
	go func() {
		_ = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.Exited() {
			return
		}
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.Cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// RequireRunning fails the test, with the tail of the process's stderr,
// when it has exited.
func (p *Process) RequireRunning(t testing.TB) {
	t.Helper()
	if p.Exited() {
		t.Fatalf("process %s exited (%v):\n%s", p.Name, p.Cmd.ProcessState, Tail(p.Stderr.String(), 40))
	}
}

// WaitHealthy waits until the process answers GET /healthz at addr.
func (p *Process) WaitHealthy(t testing.TB, addr string) {
	t.Helper()
	hc := &http.Client{Timeout: time.Second}
	require.Eventually(t, func() bool {
		p.RequireRunning(t)
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "process %s answers /healthz", p.Name)
}

// WaitExit waits up to d for the process to end.
func (p *Process) WaitExit(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("process %s did not exit within %s", p.Name, d)
	}
}

// Stop sends SIGTERM and returns the exit code.
func (p *Process) Stop(t testing.TB, d time.Duration) int {
	t.Helper()
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGTERM))
	p.WaitExit(t, d)
	return p.Cmd.ProcessState.ExitCode()
}

// Kill sends SIGKILL and waits for the end.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	require.NoError(t, p.Cmd.Process.Kill())
	p.WaitExit(t, 10*time.Second)
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
