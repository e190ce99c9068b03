package deploytest

// The balancers of the deployment, as small as they can be and still
// behave as the real ones do in what the test checks: an L7 balancer in
// front of the api processes (it forwards the client's address, tries the
// next backend when one refuses the connection: a process that is
// restarting) and an L4 balancer in front of the gateways (TLS
// passthrough: it copies bytes, so that the daemon's client certificate
// reaches the gateway).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// l7 balances HTTP over backends (host:port), round robin.
type l7 struct {
	srv      *http.Server
	addr     string
	backends []string
	next     atomic.Uint64
	resent   atomic.Int64 // calls sent again to another backend
	// unready holds the backends whose /readyz failed at the last check
	// (a process shutting down: shutdown.unreadyMs); new calls go to the
	// others while any is ready.
	unready sync.Map
	skipped atomic.Int64 // dials that passed over an unready backend
}

// resend sends a call to the next backend when the connection failed
// before any byte of an answer: refused (a process restarting), or reset
// (a connection the kernel had queued for a process that closed its
// listener before accepting it: it never read the call). That is nginx's
// proxy_next_upstream error non_idempotent, Envoy's retry_on
// connect-failure,reset (docs/deploy.md says when it is safe).
type resend struct {
	rt    http.RoundTripper
	n     int
	count *atomic.Int64
}

func (r *resend) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		body = b
	}
	var err error
	for attempt := range r.n + 1 {
		out := req.Clone(req.Context())
		out.Body = io.NopCloser(bytes.NewReader(body))
		var resp *http.Response
		resp, err = r.rt.RoundTrip(out)
		if err == nil {
			return resp, nil
		}
		if req.Context().Err() != nil {
			break
		}
		if attempt < r.n {
			r.count.Add(1)
		}
	}
	return nil, err
}

func startL7(t *testing.T, backends ...string) *l7 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &l7{addr: ln.Addr().String(), backends: backends}
	// A connection per request, so that a backend's listener closing is a
	// refused dial here (retried on the next backend), never a request
	// lost on a kept-alive connection.
	tr := &http.Transport{DisableKeepAlives: true, DialContext: b.dial, ResponseHeaderTimeout: 90 * time.Second}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: "http", Host: "backend"})
			r.SetXForwarded()
			r.Out.Host = r.In.Host
		},
		Transport: &resend{rt: tr, n: len(backends), count: &b.resent},
	}
	b.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	// Health checks, as a balancer makes them: GET /readyz every 100 ms.
	ctx, cancel := context.WithCancel(context.Background())
	go b.check(ctx, 100*time.Millisecond)
	t.Cleanup(func() { cancel(); _ = b.srv.Close() })
	return b
}

func (b *l7) check(ctx context.Context, every time.Duration) {
	c := &http.Client{Timeout: every, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		for _, addr := range b.backends {
			resp, err := c.Get("http://" + addr + "/readyz")
			if err == nil {
				_ = resp.Body.Close()
			}
			if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
				b.unready.Store(addr, true)
			} else {
				// Refused or ready: a refused dial is resent anyway.
				b.unready.Delete(addr)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// dial connects to the next ready backend that takes the connection, or
// to any when none is ready.
func (b *l7) dial(_ context.Context, _, _ string) (net.Conn, error) {
	ready := make([]string, 0, len(b.backends))
	for _, addr := range b.backends {
		if _, out := b.unready.Load(addr); !out {
			ready = append(ready, addr)
		}
	}
	if len(ready) == 0 || len(ready) == len(b.backends) {
		return dialAny(b.backends, &b.next)
	}
	b.skipped.Add(1)
	return dialAny(ready, &b.next)
}

func dialAny(backends []string, next *atomic.Uint64) (net.Conn, error) {
	start := next.Add(1)
	var errs []error
	for i := range backends {
		addr := backends[(int(start)+i)%len(backends)]
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// l4 balances TCP over backends, round robin, copying bytes.
type l4 struct {
	ln       net.Listener
	addr     string
	backends []string
	next     atomic.Uint64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func startL4(t *testing.T, backends ...string) *l4 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &l4{ln: ln, addr: ln.Addr().String(), backends: backends, conns: map[net.Conn]bool{}}
	go b.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		for c := range b.conns {
			_ = c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *l4) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer c.Close()
			up, err := dialAny(b.backends, &b.next)
			if err != nil {
				return
			}
			defer up.Close()
			b.track(c, up)
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
			<-done
			<-done
			b.untrack(c, up)
		}()
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

func (b *l4) track(cs ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		b.conns[c] = true
	}
}

func (b *l4) untrack(cs ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		delete(b.conns, c)
	}
}
