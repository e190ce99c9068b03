// Package proctest runs the project's binaries as real child processes in
// tests: build once, start with an environment of their own, wait for
// health, stop with SIGTERM or kill with SIGKILL, read their output.
package proctest

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Build compiles pkg (an import path such as computeplane/cmd/computed)
// and returns the path of the binary, in a temporary directory of the
// test's own.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	return BuildVersion(t, pkg, "")
}

// BuildVersion is Build with the release version stamped as make release
// stamps it (internal/buildinfo); "" stamps none.
//
// Each package and version is built once per test process (go build links
// again every time: about 9 CPU seconds for computed, 4 for the agent, on
// every fleet a test started) and each call gets its own hard link to
// that binary: a test that replaces its binary (an upgrade renames over
// it) changes no other test's.
func BuildVersion(t testing.TB, pkg, version string) string {
	t.Helper()
	built, err := builds.get(pkg, version)
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	// Both directories are under os.TempDir: one file system.
	require.NoError(t, os.Link(built, bin))
	return bin
}

// builds holds the binaries this process built, in a directory named
// after its pid under the system's temporary directory; a later process
// removes those of processes that are gone (qemutest.Run removes its own).
var builds = &buildCache{byKey: map[string]*build{}}

type buildCache struct {
	mu    sync.Mutex
	dir   string
	byKey map[string]*build
}

type build struct {
	once sync.Once
	bin  string
	err  error
}

const buildDirPrefix = "proctest-bin-"

func (c *buildCache) get(pkg, version string) (string, error) {
	c.mu.Lock()
	if c.dir == "" {
		removeGoneBuildDirs()
		dir := filepath.Join(os.TempDir(), buildDirPrefix+strconv.Itoa(os.Getpid()))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			c.mu.Unlock()
			return "", err
		}
		c.dir = dir
	}
	key := pkg + "@" + version
	b := c.byKey[key]
	if b == nil {
		b = &build{bin: filepath.Join(c.dir, strconv.Itoa(len(c.byKey)), filepath.Base(pkg))}
		c.byKey[key] = b
	}
	c.mu.Unlock()
	// Tests asking for the same binary at once wait for one build.
	b.once.Do(func() {
		args := []string{"build", "-o", b.bin}
		if version != "" {
			args = append(args, "-ldflags", "-X computeplane/internal/buildinfo.version="+version)
		}
		out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %w: %s", pkg, err, out)
		}
	})
	return b.bin, b.err
}

// RemoveBuilds removes the binaries this process built; BuildVersion
// builds them again after it. For a TestMain, after m.Run.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir = ""
		builds.byKey = map[string]*build{}
	}
}

// removeGoneBuildDirs removes the build directories of test processes that
// are no longer running (killed, or ended without RemoveBuilds).
func removeGoneBuildDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirPrefix+"*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), buildDirPrefix))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
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
