package proctest

import (
	"context"
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

// ServerSpec describes an external test server (SpiceDB, an OIDC
// provider, an S3 gateway): a binary run with its output in a log file,
// ready when its probe answers.
type ServerSpec struct {
	// Name is how messages name the server ("spicedb").
	Name string
	Bin  string
	Args []string
	// Env is added to the test's environment (secrets go here, never on
	// a command line others can read).
	Env []string
	// Ready answers nil once the server serves; each try gets ProbeTimeout.
	Ready func(ctx context.Context) error
	// ReadyWithin bounds the wait for Ready (30 s when zero).
	ReadyWithin time.Duration
	// PollEvery spaces the tries (50 ms when zero).
	PollEvery time.Duration
}

// ProbeTimeout bounds one try of a server's readiness probe.
const ProbeTimeout = 2 * time.Second

// StopGrace is how long Stop waits after SIGTERM before it kills.
const StopGrace = 10 * time.Second

// Server is one running test server. Stop and Start again make an outage
// and a recovery; the log file keeps every run's output.
type Server struct {
	spec ServerSpec
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartServer runs the server and waits until it is ready; the test's
// cleanup stops it.
func StartServer(t testing.TB, spec ServerSpec) *Server {
	t.Helper()
	if spec.ReadyWithin == 0 {
		spec.ReadyWithin = 30 * time.Second
	}
	if spec.PollEvery == 0 {
		spec.PollEvery = 50 * time.Millisecond
	}
	s := &Server{spec: spec, log: filepath.Join(t.TempDir(), spec.Name+".log")}
	t.Cleanup(s.Stop)
	s.Start(t)
	return s
}

// Start (re)starts a stopped server and waits until it is ready; a server
// that exits or is not ready in time fails the test with its log.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	cmd := exec.Command(s.spec.Bin, s.spec.Args...)
	cmd.Env = append(os.Environ(), s.spec.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		require.NoError(t, err, "start %s", s.spec.Name)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(s.spec.ReadyWithin)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
		err = s.spec.Ready(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("%s exited at start: %s", s.spec.Name, s.Logs())
		default:
		}
		require.True(t, time.Now().Before(deadline), "%s was not ready within %s: %v", s.spec.Name, s.spec.ReadyWithin, err)
		time.Sleep(s.spec.PollEvery)
	}
}

// Stop stops the server: SIGTERM, then SIGKILL after StopGrace. Stopping
// a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(StopGrace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Logs returns what the server wrote, every run of it.
func (s *Server) Logs() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// ToolBinary returns .service/bin/<name> at the module root, making it
// with build(dir, bin) when it is missing: once per machine, one build at
// a time across test processes (`make tools` does the same ahead).
func ToolBinary(t testing.TB, name string, build func(dir, bin string) error) string {
	t.Helper()
	return ToolBinaryOf(t, name, "", build)
}

// ToolBinaryOf is ToolBinary for a tool built from sources that change:
// a binary built from other sources than key names (a hash of them,
// kept beside it in .<name>.sources) is built again.
func ToolBinaryOf(t testing.TB, name, key string, build func(dir, bin string) error) string {
	t.Helper()
	dir := filepath.Join(ModuleRoot(t), ".service", "bin")
	bin := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	lock, err := os.OpenFile(filepath.Join(dir, "."+name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	keyFile := filepath.Join(dir, "."+name+".sources")
	if _, err := os.Stat(bin); err == nil {
		if held, _ := os.ReadFile(keyFile); key == "" || string(held) == key {
			return bin
		}
	}
	require.NoError(t, build(dir, bin), "build %s", name)
	if key != "" {
		require.NoError(t, os.WriteFile(keyFile, []byte(key), 0o644))
	}
	return bin
}

// ModuleRoot is the directory of the main module's go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// GoInstall is a build for ToolBinary: go install mod@version into dir.
func GoInstall(mod, version string) func(dir, bin string) error {
	return func(dir, _ string) error {
		cmd := exec.Command("go", "install", mod+"@"+version)
		cmd.Env = append(os.Environ(), "GOBIN="+dir)
		cmd.Dir = dir // outside the module: go install of a version ignores it anyway
		if out, err := cmd.CombinedOutput(); err != nil {
			return &buildError{err: err, out: out}
		}
		return nil
	}
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + ": " + string(e.out) }
