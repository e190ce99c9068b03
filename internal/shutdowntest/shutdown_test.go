package shutdowntest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/host"
	"computeplane/internal/proctest"
	"computeplane/internal/testenv"
)

// exitBound is how long the api role may take to exit after SIGTERM: the
// listener's grace (host.ShutdownGrace, the specification's 2 s), the
// bound on closing the database pools (host.CloseGrace) and a margin for
// closing thousands of connections on a loaded machine. Without the
// second bound the exit waited for pgx's cancel requests to a database
// that had stopped answering: 15 s.
const exitBound = host.ShutdownGrace + host.CloseGrace + 3*time.Second

// TestSigtermExitsWithinBoundsWhateverClientsDo starts computed (api role,
// shedding on), opens thousands of connections that each hold the server
// in a different way, sends SIGTERM and requires the process to be gone
// within exitBound.
func TestSigtermExitsWithinBoundsWhateverClientsDo(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: builds computed and opens thousands of connections")
	}
	dbURL := dbtest.URL(t)
	// The process reaches PostgreSQL through a proxy that the test
	// freezes at SIGTERM: a database that stops answering (an overloaded
	// machine, a network partition) must not hold the exit either.
	db := newStallProxy(t, dbURL)
	bin := proctest.Build(t, "computeplane/cmd/computed")
	port := testenv.FreePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	env := proctest.ChildEnv(map[string]string{
		"SERVICE_DATABASE_URL": db.url,
		"SERVICE_SECRET":       testenv.TestSecret,
		"SERVICE_ROLES":        "api",
		"HOST":                 "127.0.0.1",
		"PORT":                 strconv.Itoa(port),
		// Shedding on, as in scripts/bench.sh's overload runs.
		"SERVICE_CONFIG": writeFile(t, "shed.yaml", "admission: {adaptive: true, maxQueueMs: 100}\n"),
	})
	p := proctest.Start(t, "computed", bin, env, "serve")
	p.WaitHealthy(t, addr)
	key := proctest.CreateKey(t, bin, env, "acme", "shutdown", "owner")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var conns sync.WaitGroup
	var opened atomic.Int64
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return nil
		}
		opened.Add(1)
		context.AfterFunc(ctx, func() { _ = c.Close() })
		return c
	}
	call := func(method, path, body string) string {
		return fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nX-Service: 1\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, addr, key, len(body), body)
	}
	getSite := call("POST", config.DefaultBasePath+"/sites/get", `{"tenantId":"acme","siteId":"site_00000000000000000000000000"}`)
	kinds := []struct {
		name string
		n    int
		hold func(c net.Conn)
	}{
		// Idle keep-alive: one answered call, then nothing.
		{"idle", 800, func(c net.Conn) {
			_, _ = io.WriteString(c, getSite)
			_, _ = http.ReadResponse(bufio.NewReader(c), nil)
		}},
		// Half-sent: headers and part of the body, then nothing.
		{"half-sent", 500, func(c net.Conn) {
			_, _ = io.WriteString(c, strings.TrimSuffix(getSite, "}")[:len(getSite)-20])
		}},
		// Connected, nothing sent.
		{"silent", 500, func(net.Conn) {}},
		// Pipelined large answers, never read.
		{"never-read", 100, func(c net.Conn) {
			req := "GET " + config.DefaultBasePath + "/openapi.yaml HTTP/1.1\r\nHost: " + addr + "\r\n\r\n"
			_, _ = io.WriteString(c, strings.Repeat(req, 40))
		}},
		// Event streams, read by nobody after their headers.
		{"watch", 200, func(c net.Conn) {
			_, _ = io.WriteString(c, "GET /watch?tenantId=acme HTTP/1.1\r\nHost: "+addr+"\r\nAuthorization: Bearer "+key+"\r\n\r\n")
		}},
		// Calls in flight: one after the other until the end.
		{"busy", 2000, func(c net.Conn) {
			br := bufio.NewReader(c)
			for ctx.Err() == nil {
				if _, err := io.WriteString(c, getSite); err != nil {
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}},
	}
	total := 0
	for _, k := range kinds {
		total += k.n
		for range k.n {
			conns.Add(1)
			go func() {
				defer conns.Done()
				if c := dial(); c != nil {
					k.hold(c)
				}
			}()
		}
	}
	require.Eventually(t, func() bool { return opened.Load() >= int64(total*9/10) }, 30*time.Second, 50*time.Millisecond,
		"connections opened: %d of %d", opened.Load(), total)
	time.Sleep(time.Second) // the watch streams and pipelines get going
	p.RequireRunning(t)

	db.freeze()
	start := time.Now()
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGTERM))
	exited := make(chan struct{})
	go func() {
		for !p.Exited() {
			time.Sleep(10 * time.Millisecond)
		}
		close(exited)
	}()
	select {
	case <-exited:
		t.Logf("%d connections open; exited %s after SIGTERM", opened.Load(), time.Since(start).Round(time.Millisecond))
	case <-time.After(exitBound):
		// What holds it: the goroutines, printed by the runtime on SIGQUIT.
		_ = p.Cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("computed did not exit within %s of SIGTERM with %d connections open; its main goroutine:\n%s",
			exitBound, opened.Load(), mainGoroutine(p.Stderr.String()))
	}
	cancel()
	conns.Wait()
}

func writeFile(t *testing.T, name, text string) string {
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

// stallProxy forwards TCP connections to a PostgreSQL server until
// frozen: then it forwards nothing more and holds every connection, old
// and new, open without answering.
type stallProxy struct {
	url    string
	frozen chan struct{}
	once   sync.Once
}

func newStallProxy(t *testing.T, dbURL string) *stallProxy {
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	network, target := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port)))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{frozen: make(chan struct{})}
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial(network, target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, up)
			mu.Unlock()
			go p.pipe(up, c)
			go p.pipe(c, up)
		}
	}()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("host", "127.0.0.1")
	q.Set("port", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	u.Host, u.RawQuery = "", q.Encode()
	p.url = u.String()
	return p
}

// pipe copies until frozen; then it stops reading, leaving dst waiting.
func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (p *stallProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

// mainGoroutine is the main goroutine's stack in a SIGQUIT dump (where
// the exit waits), or the dump's tail.
func mainGoroutine(dump string) string {
	i := strings.Index(dump, "\ngoroutine 1 ") // "[state]" or, with GOTRACEBACK=crash, "gp=..."
	if i < 0 {
		return proctest.Tail(dump, 100)
	}
	stack, _, _ := strings.Cut(dump[i:], "\n\n")
	return stack
}
