package rpc

import (
	"log/slog"
	"net/http"
	"strings"

	"computeplane/gen/api"
	"computeplane/internal/admission"
	"computeplane/internal/reqmeta"
)

// RefuseEarly wraps the whole HTTP surface (next) so that, while the
// in-flight limit is reached or when the wait check (queueTargetMs)
// refuses the call for its wait since its arrival, a call to the envelope
// is refused before anything else is done for it: no forwarding-header resolution, routing,
// context values, body read or error formatting. At 150 % of the peak
// rate most calls are refusals, and a refusal that costs about what a
// served call does leaves little for the calls served
// (docs/benchmarks-notes.md, 2026-11-28 afternoon).
//
// The answer is the envelope's, byte for byte: the checks that come
// before admission in the envelope (an unknown method, a method other
// than POST, the X-Service and Content-Type headers) are left to it, the
// refusal is the one EnterAt gives (admission.Controller.Full), encoded
// once (writeShed), with X-Request-Id as reqmeta.Begin sets it; the
// metrics and the info log line record it as the envelope does. A call
// let through here meets EnterAt as before, which still refuses what
// arrives at the limit between the two checks. isPreviewHost (nil: none)
// names the hosts whose every path is a preview, not the envelope.
//
// The write deadline of answers (server.ResponseWriteTimeout) is not set
// on a refusal: it is a few hundred bytes, and the server's connections
// bound every write by progress (server.ConnLimits.Stall) anyway.
func (h *Handler) RefuseEarly(next http.Handler, isPreviewHost func(host string) bool) http.Handler {
	if h.Admission == nil {
		return next
	}
	prefix := h.BasePath + "/"
	checksWait := h.Admission.ChecksWait()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, prefix) {
			se, refused := h.Admission.Full()
			if refused || checksWait {
				if m := api.Lookup(r.URL.Path[len(h.BasePath):]); m != nil && checkHeaders(r) == nil &&
					(isPreviewHost == nil || !isPreviewHost(r.Host)) {
					if !refused { // the wait is judged only for a call the limit lets through
						se, refused = admission.CheckWaitOf(r.Context(), h.Admission, h.now())
					}
					if refused {
						h.refuse(w, r, m, se)
						return
					}
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// refuse answers se, an admission refusal, as ServeHTTP would.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, m *api.Method, se *api.Error) {
	start := h.now()
	id := reqmeta.RequestID(r.Header.Get(reqmeta.HeaderRequestID))
	w.Header()[reqmeta.HeaderRequestID] = []string{id} // canonical already: Set without its work
	status, code := http.StatusTooManyRequests, se.Code
	if !writeShed(w, se) {
		status, code = WriteError(w, h.logger().With("requestId", id), se)
	}
	h.Metrics.Observe(m.FullName, string(code), status, h.now().Sub(start))
	h.Metrics.RoundTrips(m.FullName, 0)
	if log := h.logger(); log.Enabled(r.Context(), slog.LevelInfo) {
		log.Info("rpc", "requestId", id, "method", m.FullName, "status", status, "code", string(code), "ms", h.now().Sub(start).Milliseconds())
	}
}
