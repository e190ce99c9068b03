package rpc_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

// The per-call cost of the envelope on a cached read: sites.get of one
// site by its owner, whose allow is cached after the first call, on the
// real host and PostgreSQL, at the production log level (warn). Run with
// `go test -run '^$' -bench SitesGet -benchmem ./internal/rpc` (make bench
// runs it); `make test` runs no benchmark.
//
// BenchmarkSitesGetHandler calls the host's handler directly, so its
// allocs/op are the server's alone (envelope, decision, store, encoding);
// BenchmarkSitesGetHTTP goes over loopback HTTP with a keep-alive client,
// so it adds net/http on both sides.

type sitesGetBench struct {
	env     *testenv.Env
	token   string
	body    []byte
	handler http.Handler
}

func newSitesGetBench(b testing.TB, opts ...testenv.Option) *sitesGetBench {
	b.Helper()
	env := testenv.Start(b, append([]testenv.Option{testenv.WithLogLevel(slog.LevelWarn)}, opts...)...)
	token := env.Key(b, "acme", "olivia", "owner")
	c := env.Client(b, computeclient.WithToken(token))
	res, err := c.SitesCreate(b.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "bench-site",
	})
	require.NoError(b, err)
	body := []byte(`{"tenantId":"acme","siteId":"` + res.Data.SiteId + `"}`)
	return &sitesGetBench{env: env, token: token, body: body, handler: env.Host.Handler()}
}

func (s *sitesGetBench) request(url string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(s.body))
	r.Header.Set("X-Service", "1")
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+s.token)
	return r
}

func BenchmarkSitesGetHandler(b *testing.B) {
	s := newSitesGetBench(b)
	url := s.env.Config.BasePath + "/sites/get"
	req := s.request(url)
	body := bytes.NewReader(s.body)
	w := &discardWriter{h: http.Header{}}
	serve := func() {
		body.Reset(s.body)
		req.Body = io.NopCloser(body)
		clear(w.h)
		w.status = 0
		s.handler.ServeHTTP(w, req)
	}
	serve() // the allow is cached from here on
	require.Equal(b, http.StatusOK, w.status)
	b.ReportAllocs()
	for b.Loop() {
		serve()
	}
	require.Equal(b, http.StatusOK, w.status)
}

// The refused call against the served one (issue 26 item 4): the same
// sites.get while admission refuses it (the process's one in-flight slot
// held), answered RATE_LIMITED. Goodput at 150 % of the peak needs a
// refusal to cost a small fraction of a served call.
func newRefusedBench(b testing.TB) *sitesGetBench {
	b.Helper()
	s := newSitesGetBench(b, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(b, "admission: {maxInFlight: 1}\n")))
	ticket, err := s.env.Host.Admission().Enter()
	require.NoError(b, err)
	b.Cleanup(func() { s.env.Host.Admission().Leave(ticket) })
	return s
}

func BenchmarkSitesGetRefusedHandler(b *testing.B) {
	s := newRefusedBench(b)
	req := s.request(s.env.Config.BasePath + "/sites/get")
	body := bytes.NewReader(s.body)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		body.Reset(s.body)
		req.Body = io.NopCloser(body)
		clear(w.h)
		w.status = 0
		s.handler.ServeHTTP(w, req)
	}
	require.Equal(b, http.StatusTooManyRequests, w.status)
}

func BenchmarkSitesGetRefusedHTTP(b *testing.B) {
	benchHTTP(b, newRefusedBench(b), http.StatusTooManyRequests)
}

func BenchmarkSitesGetHTTP(b *testing.B) {
	benchHTTP(b, newSitesGetBench(b), http.StatusOK)
}

func benchHTTP(b *testing.B, s *sitesGetBench, want int) {
	url := s.env.APIURL + "/sites/get"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	call := func() int {
		resp, err := hc.Do(s.request(url))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(b, want, call())
	b.ReportAllocs()
	b.ResetTimer() // not the env's start
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if st := call(); st != want {
				b.Errorf("status %d", st)
				return
			}
		}
	})
}

// discardWriter is a ResponseWriter that keeps the status and drops the
// body, so the benchmark counts the server's allocations only.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(p), nil
}
func (w *discardWriter) WriteHeader(status int) { w.status = status }
