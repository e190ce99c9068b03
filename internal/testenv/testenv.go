// Package testenv starts the whole api role for end-to-end tests: a fresh
// migrated database, the host's real handler on an httptest server, and the
// generated client pointed at it.
package testenv

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/host"
	"computeplane/internal/logging"
	"computeplane/internal/providers"
	"computeplane/internal/store"
)

// Env is one running api role.
type Env struct {
	// URL is the server's origin; APIURL adds the base path.
	URL, APIURL string
	Config      *config.Config
	Store       *store.Store
	// Host is the assembled process; its workers are not started.
	Host *host.Host
	logs *SyncBuffer
}

type settings struct {
	env       map[string]string
	overrides host.Overrides
	store     *store.Store
	plugins   builtin.Plugins
	logLevel  slog.Level
}

// Option changes how Start builds the env.
type Option func(*settings)

// WithEnv sets an environment variable the configuration is loaded from.
func WithEnv(key, value string) Option { return func(s *settings) { s.env[key] = value } }

// All is the options opts as one.
func All(opts ...Option) Option {
	return func(s *settings) {
		for _, o := range opts {
			o(s)
		}
	}
}

// WithStore runs the env on st (a database the test prepared, on a cluster
// of its own) instead of a fresh database of the shared test cluster.
func WithStore(st *store.Store) Option { return func(s *settings) { s.store = st } }

// WithProviders adds provider adapters (a test double) to the built-in ones.
func WithProviders(f ...*providers.Factory) Option {
	return func(s *settings) { s.plugins.Providers = append(s.plugins.Providers, f...) }
}

// WithLogLevel logs at level instead of debug (a benchmark measures the
// production default, warn, where the per-call line is off).
func WithLogLevel(level slog.Level) Option { return func(s *settings) { s.logLevel = level } }

// WithOverrides replaces parts of the host (a gate, a service double).
func WithOverrides(ov host.Overrides) Option { return func(s *settings) { s.overrides = ov } }

// TestSecret is the service secret of test envs.
const TestSecret = "test-secret-0123456789abcdefghijklmnopqrstuvwxyz"

// Start runs the api role on a fresh database until the test ends.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	s := settings{env: map[string]string{
		"SERVICE_DATABASE_URL": "postgres://unused", // the store is already open
		"SERVICE_SECRET":       TestSecret,
	}, plugins: builtin.All(), logLevel: slog.LevelDebug}
	for _, o := range opts {
		o(&s)
	}
	st := s.store
	if st == nil {
		st = dbtest.NewStore(t)
	}
	cfg, err := config.Load(func(k string) string { return s.env[k] })
	require.NoError(t, err)
	logs := &SyncBuffer{}
	log := logging.New(logs, s.logLevel)
	h, err := host.Assemble(cfg, st, log, s.plugins, s.overrides)
	require.NoError(t, err)
	t.Cleanup(h.Close) // before the database is dropped (cleanups run last first)
	// Role bindings reach an external decision service (SpiceDB) from
	// the identity inbox, as in a served api process (polled: no notifier).
	followCtx, stopFollowing := context.WithCancel(context.Background())
	following := make(chan struct{})
	go func() { defer close(following); h.FollowIdentity(followCtx, nil) }()
	t.Cleanup(func() { stopFollowing(); <-following })
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	return &Env{URL: srv.URL, APIURL: srv.URL + cfg.BasePath, Config: cfg, Store: st, Host: h, logs: logs}
}

// Client returns a generated client for the env.
func (e *Env) Client(t testing.TB, opts ...computeclient.Option) *computeclient.Client {
	t.Helper()
	c, err := computeclient.New(e.APIURL, opts...)
	require.NoError(t, err)
	return c
}

// Logs returns what the host logged so far.
func (e *Env) Logs() string { return e.logs.String() }

// LogLines returns the log lines that contain substr.
func (e *Env) LogLines(substr string) []string {
	var out []string
	for _, l := range strings.Split(e.Logs(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// SyncBuffer is a bytes.Buffer safe for a writer and a reader in different
// goroutines (a process's log and the test reading it).
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// APIError requires err to be an error answer of the API and returns it.
func APIError(t testing.TB, err error, msgAndArgs ...any) *computeclient.Error {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	e, ok := computeclient.AsError(err)
	require.Truef(t, ok, "not an API error: %v", err)
	return e
}

// ConfigFile writes a SERVICE_CONFIG file holding yaml and returns its path.
func ConfigFile(t testing.TB, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "service.yaml")
	require.NoError(t, os.WriteFile(p, []byte(yaml), 0o600))
	return p
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}
