package metrics

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MinTokenLen is the shortest metrics bearer token (in chars) with which
// GET /metrics is mounted.
const MinTokenLen = 16

// DefaultPath is the default path of the metrics route.
const DefaultPath = "/metrics"

// Enabled reports whether the metrics route is to be mounted for token: only
// when a token of at least MinTokenLen chars is configured.
func Enabled(token string) bool {
	return utf8.RuneCountInString(token) >= MinTokenLen
}

const (
	bodyUnauthorized     = `{"error":{"code":"UNAUTHENTICATED","message":"A valid metrics bearer token is required"}}` + "\n"
	bodyMethodNotAllowed = `{"error":{"code":"METHOD_NOT_ALLOWED","message":"Method not allowed; use GET"}}` + "\n"
	bodyNotFound         = `{"error":{"code":"NOT_FOUND","message":"Not found"}}` + "\n"
)

// Handler serves the metrics of reg (Prometheus text or negotiated format)
// for GET /metrics (Authentication rule 12):
//
//   - a method other than GET gets 405 with Allow: GET;
//   - a request without Authorization: Bearer <token>, or with another
//     token, gets 401 with WWW-Authenticate: Bearer and a small JSON error
//     body; tokens are compared in constant time on their SHA-256 digests;
//   - otherwise the registry's metrics.
//
// The route is meant to be mounted only when [Enabled](token) is true. If it
// is mounted anyway with a shorter token, the handler fails closed: every
// request gets 404, as if the route were absent.
func Handler(token string, reg *Registry) http.Handler {
	if !Enabled(token) || reg == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusNotFound, bodyNotFound)
		})
	}
	want := sha256.Sum256([]byte(token))
	metrics := promhttp.HandlerFor(reg.reg, promhttp.HandlerOpts{
		// A failing collector leaves the others' metrics readable.
		ErrorHandling: promhttp.ContinueOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeJSON(w, http.StatusMethodNotAllowed, bodyMethodNotAllowed)
			return
		}
		presented, _ := bearerToken(r.Header.Get("Authorization"))
		got := sha256.Sum256([]byte(presented))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeJSON(w, http.StatusUnauthorized, bodyUnauthorized)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		metrics.ServeHTTP(w, r)
	})
}

// bearerToken extracts the credential of an "Authorization: Bearer <token>"
// header. The scheme is matched case-insensitively (RFC 9110 section 11.1).
func bearerToken(h string) (string, bool) {
	const scheme = "bearer "
	if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	tok := strings.TrimLeft(h[len(scheme):], " ")
	if tok == "" {
		return "", false
	}
	return tok, true
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
