package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/cursor"
	"computeplane/internal/iam"
	"computeplane/internal/outbox"
	"computeplane/internal/reqmeta"
	"computeplane/internal/rpc"
	"computeplane/internal/wire"
)

// Stream timing of GET /watch.
const (
	// DefaultPoll is how often an open stream reads the outbox when
	// nothing wakes it earlier.
	DefaultPoll = 500 * time.Millisecond
	// DefaultHeartbeat is how often an idle stream sends an SSE comment, so
	// proxies and clients see it alive.
	DefaultHeartbeat = 15 * time.Second
	// streamBatch is the most events one read of a stream takes; a full
	// batch is followed by another read at once.
	streamBatch = 500
)

// Path is where the host mounts the stream, outside the base path.
const Path = "/watch"

// Revocations tells a stream that the identity service revoked a session
// (iam.Cached implements it: React publishes every revoked session).
type Revocations interface {
	OnRevoke(fn func(session string)) (stop func())
}

// WakeFunc subscribes one stream to best-effort wake-ups after commits:
// each receive on the channel makes the stream read at once instead of at
// its next poll; stop ends the subscription. The notifier plugs in here;
// without one, streams poll.
type WakeFunc func() (wake <-chan struct{}, stop func())

// Watch serves GET /watch: the tenant's committed events as Server-Sent
// Events, authenticated and decided like events.list (the same registry row
// through the same gate), closed when the caller's session is revoked or
// when re-authentication every Reauth fails.
type Watch struct {
	Gate    rpc.Gate
	Store   interface{ Queries() *db.Queries }
	Cursors *cursor.Sealer
	// Revocations closes streams of revoked sessions; nil: only
	// re-authentication notices them.
	Revocations Revocations
	// Wake may be nil (poll only).
	Wake WakeFunc
	// Poll, Heartbeat and Reauth default to DefaultPoll, DefaultHeartbeat
	// and iam.CredentialTTL.
	Poll, Heartbeat, Reauth time.Duration
	Log                     *slog.Logger

	mu      sync.Mutex
	closing chan struct{}
}

var method = api.Lookup("/events/list")

// Close ends every open stream (the listener is shutting down): streams
// never go idle, so a graceful shutdown would otherwise wait them out.
func (h *Watch) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing == nil {
		h.closing = make(chan struct{})
	}
	select {
	case <-h.closing:
	default:
		close(h.closing)
	}
}

func (h *Watch) closed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing == nil {
		h.closing = make(chan struct{})
	}
	return h.closing
}

// ServeHTTP answers GET (and HEAD) /watch.
func (h *Watch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, meta := reqmeta.Begin(w, r)
	log := h.logger().With("requestId", meta.RequestID)

	call, m, after, err := h.validate(r, meta)
	if err != nil {
		writeError(w, log, err)
		return
	}
	ctx, err = h.Gate.Admit(ctx, call)
	if err != nil {
		writeError(w, log, err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no") // no proxy buffering (nginx)
	rc := http.NewResponseController(w)
	// A stream outlives the server's read timeout, which would otherwise
	// end it by cancelling the request's context.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	s := &stream{h: h, w: w, rc: rc, call: call, tenant: call.TenantID(), m: m, pos: after, log: log}
	reason := s.run(ctx, iam.SessionFromContext(ctx))
	log.DebugContext(ctx, "watch closed", "tenantId", s.tenant, "reason", reason)
}

// validate reads the query as events.list input, before any identity call:
// tenantId, types (repeated or comma-separated) and the resume position
// (Last-Event-ID, or lastEventId in the query).
func (h *Watch) validate(r *http.Request, meta reqmeta.Meta) (*rpc.Call, Matcher, outbox.Position, error) {
	q := r.URL.Query()
	obj := map[string]any{}
	if v, ok := q["tenantId"]; ok {
		if len(v) != 1 {
			return nil, Matcher{}, outbox.Position{}, api.Errorf(api.CodeInvalidInput, "tenantId: give it once")
		}
		obj["tenantId"] = v[0]
	}
	var types []any
	for _, v := range q["types"] {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				types = append(types, p)
			}
		}
	}
	if len(types) > 0 {
		obj["types"] = types
	}
	var iss wire.Issues
	in, _ := method.Decode(obj, &iss).(*api.EventsListInput)
	if !iss.Empty() || in == nil {
		return nil, Matcher{}, outbox.Position{}, api.Errorf(api.CodeInvalidInput, "%s", iss.First()).
			WithDetails(map[string]any{"issues": iss.List})
	}
	m, err := ParsePatterns(in.Types)
	if err != nil {
		return nil, Matcher{}, outbox.Position{}, err
	}
	var after outbox.Position
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = q.Get("lastEventId")
	}
	if last != "" {
		if after, err = Open(h.Cursors, in.TenantID, last); err != nil {
			return nil, Matcher{}, outbox.Position{}, api.Errorf(api.CodeInvalidInput,
				"Last-Event-ID: not an id this tenant's stream sent")
		}
	}
	call := &rpc.Call{
		Method: method, Input: in, Fields: obj, Request: r,
		RequestID: meta.RequestID, Traceparent: meta.Traceparent,
		Credential: bearer(r.Header.Get("Authorization")),
	}
	return call, m, after, nil
}

func bearer(h string) string {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// stream is one open /watch response.
type stream struct {
	h      *Watch
	w      http.ResponseWriter
	rc     *http.ResponseController
	call   *rpc.Call
	tenant string
	m      Matcher
	pos    outbox.Position
	log    *slog.Logger
}

// run sends events until the client leaves, the session is revoked, a
// re-authentication fails or the host shuts down, and returns why it ended.
func (s *stream) run(ctx context.Context, sess *iam.Session) string {
	h := s.h
	revoked := make(chan struct{})
	if sess != nil && sess.Caller.Session != "" && h.Revocations != nil {
		var once sync.Once
		stop := h.Revocations.OnRevoke(func(session string) {
			if session == sess.Caller.Session {
				once.Do(func() { close(revoked) })
			}
		})
		defer stop()
	}
	var wake <-chan struct{}
	if h.Wake != nil {
		ch, stop := h.Wake()
		defer stop()
		wake = ch
	}
	poll := time.NewTicker(orDefault(h.Poll, DefaultPoll))
	defer poll.Stop()
	heartbeat := time.NewTicker(orDefault(h.Heartbeat, DefaultHeartbeat))
	defer heartbeat.Stop()
	reauth := time.NewTicker(orDefault(h.Reauth, iam.CredentialTTL))
	defer reauth.Stop()

	if err := s.comment("connected"); err != nil {
		return "client gone"
	}
	// again is ready at once: the next read follows without waiting when
	// the last one did not catch up, yet revocation, shutdown and the
	// client leaving are still heard in between.
	again := make(chan struct{})
	close(again)
	for {
		more, err := s.send(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return "client gone"
			}
			var werr clientWriteError
			if errors.As(err, &werr) {
				return "client gone"
			}
			// The store may come back: keep the stream and read again at
			// the next tick.
			s.log.WarnContext(ctx, "watch: outbox unreadable", "error", err.Error())
		}
		var next <-chan struct{}
		if more {
			next = again
		}
		select {
		case <-ctx.Done():
			return "client gone"
		case <-h.closed():
			_ = s.comment("closed: the server is shutting down")
			return "shutdown"
		case <-revoked:
			_ = s.comment("closed: the credential was revoked")
			return "revoked"
		case <-reauth.C:
			if _, err := h.Gate.Admit(ctx, s.call); err != nil {
				_ = s.comment("closed: re-authentication failed")
				return "re-authentication failed: " + err.Error()
			}
		case <-heartbeat.C:
			if err := s.comment("heartbeat"); err != nil {
				return "client gone"
			}
		case <-next:
		case <-wake:
		case <-poll.C:
		}
	}
}

// clientWriteError marks a failed write to the client.
type clientWriteError struct{ err error }

func (e clientWriteError) Error() string { return "watch: write: " + e.err.Error() }

// send writes the events committed since the last one sent and reports
// whether more may be waiting (the read did not catch up).
func (s *stream) send(ctx context.Context) (bool, error) {
	rows, next, more, err := Read(ctx, s.h.Store.Queries(), s.tenant, s.pos, s.m, streamBatch)
	if err != nil {
		return false, err
	}
	if len(rows) == 0 {
		// Rows looked at and filtered out are passed over next time; the
		// client's Last-Event-ID stays at the last event it got.
		s.pos = next
		return more, nil
	}
	var b strings.Builder
	for _, r := range rows {
		data, err := json.Marshal(Envelope(r.Event))
		if err != nil {
			return false, err
		}
		fmt.Fprintf(&b, "id: %s\nevent: %s\ndata: %s\n\n", Seal(s.h.Cursors, s.tenant, r.Position), r.Event.Type, data)
	}
	if err := s.write(b.String()); err != nil {
		return false, err
	}
	s.pos = next
	return more, nil
}

func (s *stream) comment(text string) error { return s.write(": " + text + "\n\n") }

// StreamWriteTimeout bounds each write of a stream: a client that stops
// reading is dropped when the next event or heartbeat cannot reach it.
const StreamWriteTimeout = 30 * time.Second

func (s *stream) write(text string) error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(StreamWriteTimeout))
	if _, err := s.w.Write([]byte(text)); err != nil {
		return clientWriteError{err}
	}
	if err := s.rc.Flush(); err != nil {
		return clientWriteError{err}
	}
	return nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (h *Watch) logger() *slog.Logger {
	if h.Log != nil {
		return h.Log
	}
	return slog.New(slog.DiscardHandler)
}

// writeError answers a refusal before the stream starts in the RPC error
// envelope (docs/protocol.md), with the code's status.
func writeError(w http.ResponseWriter, log *slog.Logger, err error) {
	_, _ = rpc.WriteError(w, log, err)
}
