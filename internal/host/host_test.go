package host_test

// Tests of Host.Serve against a real PostgreSQL (interface specification,
// "Host startup and shutdown"; Limits, "Shutdown": listener grace 2 s): the
// api role listens on HOST:PORT, stops listening when its context ends and
// gives open requests at most ShutdownGrace; a process without the api role
// opens no listener.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/host"
	"computeplane/internal/logging"
	"computeplane/internal/testenv"
)

// specGrace is the listener grace of the specification (Limits, Shutdown).
const specGrace = 2 * time.Second

func TestShutdownGraceIsTheSpecifications(t *testing.T) {
	t.Parallel()
	assert.Equal(t, specGrace, host.ShutdownGrace)
}

type syncBuffer = testenv.SyncBuffer

type served struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuffer
}

// serve builds a host on a fresh migrated database and runs Serve until
// the test ends or cancel is called.
func serve(t *testing.T, roles string, ov host.Overrides, extraEnv ...string) *served {
	t.Helper()
	port := testenv.FreePort(t)
	env := map[string]string{
		"SERVICE_DATABASE_URL": dbtest.URL(t),
		"SERVICE_SECRET":       testenv.TestSecret,
		"HOST":                 "127.0.0.1",
		"PORT":                 strconv.Itoa(port),
		"SERVICE_ROLES":        roles,
	}
	for i := 0; i+1 < len(extraEnv); i += 2 {
		env[extraEnv[i]] = extraEnv[i+1]
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	logs := &syncBuffer{}
	h, err := host.New(t.Context(), cfg, logging.New(logs, slog.LevelDebug), host.Options{Overrides: ov})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	s := &served{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cancel: cancel, done: make(chan error, 1), logs: logs}
	go func() { s.done <- h.Serve(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return s
}

// waitReady polls GET /healthz until it answers 200.
func (s *served) waitReady(t *testing.T) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	require.Eventually(t, func() bool {
		resp, err := c.Get("http://" + s.addr + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "the api role answers /healthz")
}

// stop cancels Serve and returns its result and how long it took.
func (s *served) stop(t *testing.T) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return time.Since(start), err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10 s of cancel")
		return 0, nil
	}
}

func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return true
	}
	_ = c.Close()
	return false
}

func TestServeStopsListeningOnCancel(t *testing.T) {
	t.Parallel()
	s := serve(t, "all", host.Overrides{})
	s.waitReady(t)

	// An idle keep-alive connection does not hold shutdown up.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + s.addr + "/readyz")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	took, err := s.stop(t)
	require.NoError(t, err)
	assert.Less(t, took, specGrace, "nothing was in flight: no need to wait for the grace")
	assert.True(t, refused(s.addr), "the listener is closed once Serve returns")
	assert.Contains(t, s.logs.String(), "shutting down")
}

// With shutdown.unreadyMs, /readyz answers 503 as soon as shutdown begins
// while calls are still served (each answer asking to close its
// connection), and the listener closes only after that moment.
func TestServeIsUnreadyBeforeItStopsListening(t *testing.T) {
	t.Parallel()
	const unready = 1500 * time.Millisecond
	s := serve(t, "api", host.Overrides{}, "SERVICE_CONFIG", testenv.ConfigFile(t, "shutdown: {unreadyMs: 1500}\n"))
	s.waitReady(t)
	get := func(path string) (*http.Response, error) {
		c := &http.Client{Timeout: time.Second, Transport: &http.Transport{}}
		resp, err := c.Get("http://" + s.addr + path)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return resp, err
	}
	resp, err := get("/readyz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	start := time.Now()
	stopped := make(chan time.Duration, 1)
	go func() {
		took, err := s.stop(t)
		assert.NoError(t, err)
		stopped <- took
	}()
	require.Eventually(t, func() bool {
		resp, err := get("/readyz")
		return err == nil && resp.StatusCode == http.StatusServiceUnavailable
	}, time.Second, 10*time.Millisecond, "/readyz fails once shutdown begins")
	resp, err = get("/healthz")
	require.NoError(t, err, "still listening while unready")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, resp.Close, "answers ask the client to close its connection")
	resp, err = postVersion(s.addr)
	require.NoError(t, err, "calls are still served")
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Less(t, time.Since(start), unready, "all of the above within the unready moment")

	took := <-stopped
	assert.GreaterOrEqual(t, took, unready-50*time.Millisecond, "the listener closes after the unready moment")
	assert.True(t, refused(s.addr))
}

// A request that started before the cancel finishes within the grace.
func TestServeLetsOpenRequestsFinish(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	s := serve(t, "api", host.Overrides{Services: func(sv *api.Services) {
		sv.System = &slowSystem{SystemService: sv.System, started: started, delay: 500 * time.Millisecond}
	}})
	s.waitReady(t)

	type result struct {
		status int
		err    error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := postVersion(s.addr)
		if err != nil {
			res <- result{err: err}
			return
		}
		_ = resp.Body.Close()
		res <- result{status: resp.StatusCode}
	}()
	<-started

	took, err := s.stop(t)
	require.NoError(t, err)
	assert.Less(t, took, specGrace, "Serve returns when the request is done, before the grace ends")
	r := <-res
	require.NoError(t, r.err, "the open request was answered")
	assert.Equal(t, http.StatusOK, r.status)
	assert.True(t, refused(s.addr))
}

// A request still running when the grace ends is cut off: Serve does not
// wait longer than ShutdownGrace for it.
func TestServeGraceBoundsShutdown(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	s := serve(t, "api", host.Overrides{Services: func(sv *api.Services) {
		sv.System = &slowSystem{SystemService: sv.System, started: started, delay: 30 * time.Second}
	}})
	s.waitReady(t)

	res := make(chan error, 1)
	go func() {
		resp, err := postVersion(s.addr)
		if err == nil {
			_ = resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		res <- err
	}()
	<-started

	// Besides, a client that sent half a request header and stalled.
	stalled, err := net.Dial("tcp", s.addr)
	require.NoError(t, err)
	defer func() { _ = stalled.Close() }()
	_, err = stalled.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n"))
	require.NoError(t, err)

	took, err := s.stop(t)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, took, specGrace-100*time.Millisecond, "open requests get the grace")
	assert.Less(t, took, specGrace+1500*time.Millisecond, "and no more")
	assert.True(t, refused(s.addr))

	select {
	case err := <-res:
		assert.Error(t, err, "the slow request is cut off")
	case <-time.After(5 * time.Second):
		t.Fatal("the slow request was neither answered nor cut off")
	}
	require.NoError(t, stalled.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = stalled.Read(make([]byte, 1))
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the stalled connection is closed, not left open: %v", err)
}

func TestServeWithoutAPIRoleDoesNotListen(t *testing.T) {
	t.Parallel()
	s := serve(t, "controllers", host.Overrides{})
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(s.logs.String()), []byte("no api role"))
	}, 10*time.Second, 10*time.Millisecond)

	// Nothing answers on the configured address, and the port is free.
	assert.Never(t, func() bool { return !refused(s.addr) }, 300*time.Millisecond, 50*time.Millisecond)
	ln, err := net.Listen("tcp", s.addr)
	require.NoError(t, err, "the port is not taken by the host")
	require.NoError(t, ln.Close())

	select {
	case err := <-s.done:
		t.Fatalf("Serve returned before cancel: %v", err)
	default:
	}
	took, err := s.stop(t)
	require.NoError(t, err)
	assert.Less(t, took, time.Second)
}

func TestServeFailsWhenAddressTaken(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	port := ln.Addr().(*net.TCPAddr).Port
	env := map[string]string{
		"SERVICE_DATABASE_URL": dbtest.URL(t),
		"SERVICE_SECRET":       testenv.TestSecret,
		"HOST":                 "127.0.0.1",
		"PORT":                 strconv.Itoa(port),
		"SERVICE_ROLES":        "api",
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	h, err := host.New(t.Context(), cfg, logging.New(io.Discard, slog.LevelDebug), host.Options{})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- h.Serve(t.Context(), nil) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "address already in use")
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not fail on a taken address")
	}
}

func postVersion(addr string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/api/compute/system/version", bytes.NewReader([]byte("{}")))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Service", "1")
	return (&http.Client{Timeout: 20 * time.Second}).Do(req)
}

// slowSystem delays system.version by delay (or until the call's context
// ends), after closing started.
type slowSystem struct {
	api.SystemService
	started chan struct{}
	once    sync.Once
	delay   time.Duration
}

func (s *slowSystem) Version(ctx context.Context, in *api.SystemVersionInput) (*api.ServerDocument, error) {
	s.once.Do(func() { close(s.started) })
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.SystemService.Version(ctx, in)
}

// With admission.maxConnections, the api serves that many connections at
// once: two clients holding idle keep-alive connections at a cap of 2 do
// not keep a third out (the idle ones are let go for it), and shutdown
// does not wait on the cap.
func TestServeCapsConnections(t *testing.T) {
	t.Parallel()
	s := serve(t, "api", host.Overrides{}, "SERVICE_CONFIG", testenv.ConfigFile(t, "admission: {maxConnections: 2}\n"))
	s.waitReady(t) // its connection closed by its client: the slot is free again
	call := func(c net.Conn, br *bufio.Reader) *http.Response {
		t.Helper()
		_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	// Two clients hold both slots: each answered twice on its connection,
	// so neither was let go for the other (the readiness check's
	// connection may hold a slot for a moment after its client closed it:
	// then the pair is dialled again).
	var held []net.Conn
	require.Eventually(t, func() bool {
		for _, h := range held {
			_ = h.Close()
		}
		held = held[:0]
		var readers []*bufio.Reader
		for range 2 {
			c, err := net.DialTimeout("tcp", s.addr, time.Second)
			require.NoError(t, err)
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			held, readers = append(held, c), append(readers, bufio.NewReader(c))
			require.Equal(t, http.StatusOK, call(c, readers[len(readers)-1]).StatusCode)
		}
		for i, c := range held {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return false
			}
			resp, err := http.ReadResponse(readers[i], nil)
			if err != nil {
				return false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return true
	}, 10*time.Second, 200*time.Millisecond)
	defer func() {
		for _, h := range held {
			_ = h.Close()
		}
	}()
	c, err := net.DialTimeout("tcp", s.addr, time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	require.Equal(t, http.StatusOK, call(c, bufio.NewReader(c)).StatusCode, "the third client is served")
	// An idle one was let go for it (both, unless the second went idle
	// only after the third had taken the first one's slot).
	closed := 0
	for _, h := range held {
		require.NoError(t, h.SetReadDeadline(time.Now().Add(3*time.Second)))
		_, err := h.Read(make([]byte, 1))
		if errors.Is(err, io.EOF) {
			closed++
		}
	}
	assert.Positive(t, closed, "a held connection was closed by the server, not timed out")
	took, err := s.stop(t)
	require.NoError(t, err)
	assert.Less(t, took, specGrace)
}
