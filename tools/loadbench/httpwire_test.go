package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadResponse(t *testing.T) {
	cases := []struct {
		name, raw  string
		status     int
		bodyLen    int64
		retryAfter string
		close      bool
		body       string
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"data\":{}}", 200, 11, "", false, `{"data":{}}`},
		{"shed", "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\nCONTENT-LENGTH: 5\r\n\r\nabcde", 429, 5, "1", false, "abcde"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 200, 5, "", false, "abcde"},
		{"no length", "HTTP/1.1 200 OK\r\n\r\nuntil the end", 200, 13, "", true, "until the end"},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", 204, 0, "", false, ""},
		{"continue first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, 0, "", false, ""},
		{"close", "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno", 503, 2, "", true, "no"},
		{"http/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 200, 0, "", true, ""},
		{"bare LF, no reason", "HTTP/1.1 200\nContent-Length: 1\n\nx", 200, 1, "", false, "x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r response
			keep := make([]byte, 64)
			require.NoError(t, readResponse(bufio.NewReaderSize(strings.NewReader(c.raw), maxLine), &r, keep))
			assert.Equal(t, c.status, r.Status)
			assert.Equal(t, c.bodyLen, r.BodyLen)
			assert.Equal(t, c.retryAfter, r.RetryAfter)
			assert.Equal(t, c.close, r.Close)
			assert.Equal(t, c.body, string(r.Body))
		})
	}
	for _, bad := range []string{
		"", "HTTP/1.1 200 OK\r\n", "HTTP/2 200 OK\r\n\r\n", "HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/1.1 099 x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 200 OK\r\n" + strings.Repeat("x", maxLine) + "\r\n\r\n",
	} {
		var r response
		assert.Error(t, readResponse(bufio.NewReaderSize(strings.NewReader(bad), maxLine), &r, nil), "%q", bad)
	}
}

// Two answers back to back on one connection: the first is read exactly
// to its end, so the second starts where it should.
func TestReadResponseKeepAlive(t *testing.T) {
	raw := "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\nxy"
	br := bufio.NewReaderSize(strings.NewReader(raw), maxLine)
	var r response
	require.NoError(t, readResponse(br, &r, nil))
	assert.Equal(t, 200, r.Status)
	require.NoError(t, readResponse(br, &r, nil))
	assert.Equal(t, 429, r.Status)
	assert.Equal(t, "1", r.RetryAfter)
	assert.ErrorIs(t, readResponse(br, &r, nil), io.ErrUnexpectedEOF)
}

func TestRequestTemplate(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1/api/compute")
	req, err := requestFor("secrets.put", u, "cpk_x", "bench", "")
	require.NoError(t, err)
	// What net/http's server reads from it: the envelope's headers, the
	// counters patched, the length right.
	for _, n := range []int64{1, 65, 12345678901} {
		hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req.encode(nil, n))))
		require.NoError(t, err)
		assert.Equal(t, "/api/compute/secrets/put", hr.URL.Path)
		assert.Equal(t, "1", hr.Header.Get("X-Service"))
		assert.Equal(t, "application/json", hr.Header.Get("Content-Type"))
		assert.Equal(t, "Bearer cpk_x", hr.Header.Get("Authorization"))
		body, err := io.ReadAll(hr.Body)
		require.NoError(t, err)
		assert.Contains(t, string(body), fmt.Sprintf(`"name":"bench-%02d"`, n%64))
		assert.Contains(t, string(body), fmt.Sprintf(`"idempotencyKey":"k-%016d"}`, n))
		assert.Equal(t, hr.ContentLength, int64(len(body)))
	}
}

func TestEnvelopeError(t *testing.T) {
	code, ms := envelopeError([]byte(`{"error":{"code":"RATE_LIMITED","message":"m","retryAfterMs":50},"retryAfterMs":50}`))
	assert.Equal(t, "RATE_LIMITED", code)
	assert.Equal(t, int64(50), ms)
	code, ms = envelopeError([]byte(`{"error":{"code":"NOT_FOUND"}}`))
	assert.Equal(t, "NOT_FOUND", code)
	assert.Equal(t, int64(-1), ms)
}

// The generator against net/http's own server on loopback: a 200 with a
// length, a 429 with its hints, a streamed (chunked) answer, each counted
// as it should be, open and closed loop.
func TestGeneratorAgainstNetHTTP(t *testing.T) {
	u, req := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Header.Get("X-Service") != "1" || string(body) != "{}":
			http.Error(w, "bad request", http.StatusBadRequest)
		case time.Now().UnixNano()%3 == 0:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":{"code":"RATE_LIMITED","retryAfterMs":1},"retryAfterMs":1}`))
		case time.Now().UnixNano()%3 == 1:
			_, _ = w.Write([]byte(`{"data":`))
			w.(http.Flusher).Flush() // chunked
			_, _ = w.Write([]byte(`{}}`))
		default:
			_, _ = w.Write([]byte(`{"data":{}}`))
		}
	})
	g := newGenerator(u.Host, req, 64, 5*time.Second)
	defer g.close()
	res := g.openLoop(500, time.Second, true)
	assert.Zero(t, res.Errors)
	assert.Equal(t, int64(500), res.Calls+res.RateLimited)
	assert.Positive(t, res.RateLimited)
	assert.Positive(t, res.Calls)
	// The timeline holds every answered call, each status as counted.
	require.Len(t, res.timeline, 500)
	byStatus := map[int]int64{}
	for _, c := range res.timeline {
		byStatus[c.status]++
		assert.Positive(t, c.took)
	}
	assert.Equal(t, map[int]int64{200: res.Calls, 429: res.RateLimited}, byStatus)
	path := filepath.Join(t.TempDir(), "timeline")
	require.NoError(t, writeTimeline(path, res.timeline))
	written, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(written)), "\n")
	require.Len(t, lines, 501)
	assert.Equal(t, "dueS tookMs status", lines[0])
	res = g.closedLoop(4, 300*time.Millisecond)
	assert.Zero(t, res.Errors)
	assert.Positive(t, res.Calls)
}

// FuzzReadResponse checks the parser against net/http's on any bytes: it
// never panics, and when both accept an answer framed by Content-Length
// they agree on its status and body length.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"))
	f.Add([]byte("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var r response
		err := readResponse(bufio.NewReaderSize(bytes.NewReader(raw), maxLine), &r, make([]byte, 16))
		if err != nil {
			return
		}
		if r.BodyLen < 0 || int64(len(r.Body)) > r.BodyLen || r.Status < 200 || r.Status > 999 {
			t.Fatalf("accepted %q as %+v", raw, r)
		}
		hr, herr := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if herr != nil || hr.StatusCode < 200 || hr.ContentLength < 0 || len(hr.TransferEncoding) > 0 {
			return
		}
		n, berr := io.Copy(io.Discard, hr.Body)
		if berr != nil {
			return
		}
		if hr.StatusCode != r.Status || n != r.BodyLen {
			t.Fatalf("%q: net/http %d, %d bytes; ours %d, %d bytes", raw, hr.StatusCode, n, r.Status, r.BodyLen)
		}
	})
}

// A search step the server cannot keep up with opens every connection the
// generator may; the steps after it start again from none, so that a
// lower rate is not measured on a server still holding the overload's
// connections.
func TestAnOverloadedStepLeavesNoConnectionsToTheNext(t *testing.T) {
	busy := make(chan struct{}, 4) // four calls at once, 2 ms each: about 1,600/s here
	u, req := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		busy <- struct{}{}
		time.Sleep(2 * time.Millisecond)
		<-busy
		_, _ = w.Write([]byte(`{"data":{}}`))
	})
	const maxConns = 128
	g := newGenerator(u.Host, req, maxConns, 5*time.Second)
	defer g.close()
	const bound = 100 * time.Millisecond
	res := g.searchPeak(200, 4, 400*time.Millisecond, bound)
	search := newPeakSearch(200, 4, 0, bound) // for its verdict on a step
	overloaded, checked := false, 0
	for _, st := range res.Steps {
		if overloaded && search.sustained(st.Rate, st) {
			assert.Less(t, st.Conns, maxConns/2, "a sustained step at %.0f/s after an overload", st.Rate)
			checked++
		}
		overloaded = overloaded || st.Conns == maxConns
	}
	require.True(t, overloaded, "no step opened every connection: %+v", res.Steps)
	require.Positive(t, checked, "no step after the overload was sustained, so the test shows nothing: %+v", res.Steps)
	assert.Positive(t, res.PerSecond)
}

// cannedServer serves handler at the "canned" call on loopback with
// net/http, and answers its URL and the generator's request for it.
func cannedServer(t *testing.T, handler http.HandlerFunc) (*url.URL, *requestTemplate) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/api/compute/canned", handler)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	u, _ := url.Parse("http://" + ln.Addr().String() + "/api/compute")
	req, err := requestFor("canned", u, "", "", "")
	require.NoError(t, err)
	return u, req
}
