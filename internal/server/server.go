// Package server assembles the HTTP surface of the api role: the RPC
// envelope under the base path and the host routes beside it (health,
// readiness, the well-known document, metrics, openapi.yaml, the docs and
// the /watch event stream).
package server

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"computeplane/gen/api"
	gendocs "computeplane/gen/docs"
	"computeplane/internal/metrics"
	"computeplane/internal/wire"
)

// Pinger answers a trivial store query.
type Pinger interface {
	Ping(ctx context.Context) (dbTime time.Time, latency time.Duration, err error)
}

// Options are what the routes need.
type Options struct {
	BasePath string
	RPC      http.Handler
	Store    Pinger
	Document api.ServerDocument
	// MetricsToken mounts GET MetricsPath when at least 16 chars long.
	MetricsToken string
	MetricsPath  string
	Metrics      *metrics.Registry
	OpenAPI      []byte
	DocsHTML     []byte
	// WriteTimeout bounds the writing of one response; 0 means
	// ResponseWriteTimeout.
	WriteTimeout time.Duration
	// Watch serves GET /watch (the events module's stream); nil mounts
	// nothing.
	Watch http.Handler
	// IAMEvents serves POST IAMEventsPath, the identity service's signed
	// event webhook; nil (no secret configured) mounts nothing.
	IAMEvents     http.Handler
	IAMEventsPath string
	// Join serves POST /v1/join (node daemons joining with a token); nil
	// mounts nothing.
	Join http.Handler
	// Session serves the daemons' WebSocket fallback at /v1/session when
	// this process runs a gateway; nil mounts nothing. It is mounted
	// outside the response write deadline: a session lives for hours.
	Session http.Handler
	// Tunnels serves GET {basePath}/tunnels/{ticket} (the tunnels relay);
	// nil when tunnels are not configured.
	Tunnels http.Handler
	// Previews serves {basePath}/previews/ and, when IsPreviewHost says a
	// request's Host is a host-based preview, every path of it (preview
	// URLs, with tunnels); nil mounts nothing.
	Previews      http.Handler
	IsPreviewHost func(host string) bool
	// Downloads serves {basePath}/downloads/ (release artifacts) when
	// downloads are configured; nil mounts nothing. It bounds its own
	// writes by progress: a binary outlasts the response deadline.
	Downloads http.Handler
	Log       *slog.Logger
	// Draining, when it answers true, makes /readyz fail: the process is
	// shutting down and balancers should stop sending it calls.
	Draining func() bool
}

// Daemon paths on the public host.
const (
	JoinPath    = "/v1/join"
	SessionPath = "/v1/session"
)

// WellKnownMaxAge is how long the well-known document may be cached.
const WellKnownMaxAge = 300 * time.Second

// New returns the handler of the api role.
func New(o Options) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", getOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	}))
	mux.HandleFunc("/readyz", getOnly(func(w http.ResponseWriter, r *http.Request) {
		if o.Draining != nil && o.Draining() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "draining": true})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), ProbeTimeout)
		defer cancel()
		if _, _, err := o.Store.Ping(ctx); err != nil {
			o.Log.WarnContext(r.Context(), "readiness probe failed", "error", err.Error())
			writeJSON(w, http.StatusServiceUnavailable, map[string]bool{"ok": false})
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	}))
	wellKnown := getOnly(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age="+strconv.Itoa(int(WellKnownMaxAge.Seconds())))
		writeJSON(w, http.StatusOK, o.Document)
	})
	mux.HandleFunc("/.well-known/service", wellKnown)
	mux.HandleFunc(o.BasePath+"/.well-known/service", wellKnown)
	mux.HandleFunc(o.BasePath+"/health", getOnly(func(w http.ResponseWriter, r *http.Request) {
		health(w, r, o.Store, o.Log)
	}))
	mux.HandleFunc(o.BasePath+"/openapi.yaml", getOnly(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(o.OpenAPI)
	}))
	docs := getOnly(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src "+gendocs.ScriptHash)
		_, _ = w.Write(o.DocsHTML)
	})
	mux.HandleFunc(o.BasePath+"/docs", docs)
	// The API's root is a person arriving at it: show them the reference.
	mux.HandleFunc("/{$}", getOnly(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, o.BasePath+"/docs", http.StatusFound)
	}))
	mux.HandleFunc(o.BasePath+"/docs/", docs)
	if o.Watch != nil {
		mux.Handle("/watch", getOnly(o.Watch.ServeHTTP))
	}
	if o.IAMEvents != nil {
		mux.Handle(o.IAMEventsPath, o.IAMEvents)
	}
	if metrics.Enabled(o.MetricsToken) {
		path := o.MetricsPath
		if path == "" {
			path = metrics.DefaultPath
		}
		mux.Handle(path, metrics.Handler(o.MetricsToken, o.Metrics))
	}
	// Everything else under the base path is the RPC envelope, which answers
	// unknown methods with NOT_FOUND in its own envelope.
	mux.Handle(o.BasePath+"/", o.RPC)
	if o.Join != nil {
		mux.Handle(JoinPath, o.Join)
		mux.Handle(JoinPath+"/tpm-challenge", o.Join) // the TPM attestor's (agentproto.JoinTPMChallengePath)
	}
	h := withWriteDeadline(mux, cmp.Or(o.WriteTimeout, ResponseWriteTimeout))
	if o.Session == nil && o.Tunnels == nil && o.Downloads == nil {
		return h
	}
	// Upgraded connections and downloads live past the write deadline of
	// responses.
	outer := http.NewServeMux()
	if o.Downloads != nil {
		outer.Handle(o.BasePath+"/downloads/", o.Downloads)
	}
	if o.Session != nil {
		outer.Handle(SessionPath, o.Session)
	}
	if o.Tunnels != nil {
		// GET only: POST {basePath}/tunnels/{method} stays the RPC envelope.
		outer.Handle("GET "+o.BasePath+"/tunnels/{ticket}", o.Tunnels)
	}
	if o.Previews != nil {
		// A guest's server answers as slowly as it likes: outside the
		// response deadline, like tunnels.
		outer.Handle(o.BasePath+"/previews/", o.Previews)
	}
	outer.Handle("/", h)
	if o.Previews != nil && o.IsPreviewHost != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if o.IsPreviewHost(r.Host) {
				o.Previews.ServeHTTP(w, r)
				return
			}
			outer.ServeHTTP(w, r)
		})
	}
	return outer
}

// health answers GET {basePath}/health.
func health(w http.ResponseWriter, r *http.Request, s Pinger, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(r.Context(), ProbeTimeout)
	defer cancel()
	dbTime, latency, err := s.Ping(ctx)
	body := map[string]any{
		"status":    "ok",
		"database":  "ok",
		"latencyMs": float64(latency.Microseconds()) / 1000,
		"time":      wire.Time(dbTime),
	}
	status := http.StatusOK
	if err != nil {
		log.WarnContext(r.Context(), "health probe failed", "error", err.Error())
		body["status"], body["database"], body["time"] = "degraded", "unreachable", wire.Time(time.Now())
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, body)
}

// getOnly answers 405 to anything but GET and HEAD.
func getOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"error": map[string]string{
				"code": string(api.CodeMethodNotAllowed), "message": "only GET is allowed here",
			}})
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
