package server

import (
	"net/http"
	"time"
)

// ResponseWriteTimeout bounds the writing of one response. A client that
// pipelines requests and never reads its answers would otherwise hold a
// goroutine and a descriptor for as long as it likes. It is set per
// response, after the request was read, so a slow upload does not eat into
// it; streams (GET /watch) clear it and bound each of their writes instead.
// It outlasts the longest wait of a mutation (wait { timeoutMs }, 30 s)
// plus the call itself.
const ResponseWriteTimeout = 45 * time.Second

// ProbeTimeout bounds the store query of /readyz and {basePath}/health, so
// a probe answers within it even when the database stalls.
const ProbeTimeout = 2 * time.Second

func withWriteDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout))
		next.ServeHTTP(w, r)
	})
}
