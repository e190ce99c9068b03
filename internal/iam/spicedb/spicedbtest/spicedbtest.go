// Package spicedbtest runs a real SpiceDB server for tests
// (github.com/authzed/spicedb, Apache 2.0) with the in-memory datastore on
// loopback ports, stopped at the test's end. The binary is built once per
// machine from the Go module proxy into .service/bin at the module root
// (`make tools` does the same ahead; .ci/run calls it).
package spicedbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"computeplane/internal/config"
	"computeplane/internal/iam/spicedb"
)

// Module and Version pin the server (the Makefile's SPICEDB names the same).
const (
	Module  = "github.com/authzed/spicedb/cmd/spicedb"
	Version = "v1.56.2"
)

// KeyEnv is the environment variable the service reads the key from.
const KeyEnv = config.DefaultSpiceDBKeyEnv

// Server is one running SpiceDB.
type Server struct {
	Endpoint string // 127.0.0.1:<port> (gRPC, plaintext)
	Key      string // its preshared key

	bin  string
	args []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the spicedb binary, building it into .service/bin when it
// is missing (minutes, once per machine; one build at a time).
func Binary(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	dir := filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), ".service", "bin")
	bin := filepath.Join(dir, "spicedb")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	lock, err := os.OpenFile(filepath.Join(dir, ".spicedb.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", Module+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go install %s@%s: %s", Module, Version, b)
	return bin
}

// Start runs a SpiceDB with an empty in-memory datastore; the test's
// cleanup stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{bin: Binary(t), Key: token(16), Endpoint: freeAddr(t), log: filepath.Join(t.TempDir(), "spicedb.log")}
	s.args = []string{"serve",
		"--datastore-engine", "memory",
		"--grpc-addr", s.Endpoint,
		"--http-enabled=false",
		"--metrics-enabled=false",
		"--dispatch-cluster-enabled=false",
		"--telemetry-endpoint=",
		"--skip-release-check",
		"--log-level", "warn",
	}
	t.Cleanup(s.Stop)
	s.start(t)
	return s
}

// Config is the service's configuration of this server (plaintext to
// loopback) and the environment holding its key.
func (s *Server) Config() (yaml string, env map[string]string) {
	return fmt.Sprintf("iam: {decisions: {spicedb: {endpoint: '%s', plaintext: true}}}\n", s.Endpoint),
		map[string]string{KeyEnv: s.Key}
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	cmd := exec.Command(s.bin, s.args...)
	// The key through its environment, never on a command line others can
	// read.
	cmd.Env = append(os.Environ(), "SPICEDB_GRPC_PRESHARED_KEY="+s.Key)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	client, err := spicedb.Dial(&config.SpiceDB{Endpoint: s.Endpoint, PresharedKey: s.Key, Plaintext: true})
	require.NoError(t, err)
	defer client.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = client.ReadSchema(ctx, &v1.ReadSchemaRequest{})
		cancel()
		// An empty datastore answers NotFound (no schema): it is serving.
		if err == nil || status.Code(err) == codes.NotFound {
			return
		}
		select {
		case <-done:
			b, _ := os.ReadFile(s.log)
			t.Fatalf("spicedb exited at start: %s", b)
		default:
		}
		require.True(t, time.Now().Before(deadline), "spicedb did not serve within 60 s: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the server (an outage); nothing it held survives.
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
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Logs returns what the server logged.
func (s *Server) Logs() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
