// Package rpc is the call envelope: the one path every RPC method takes, from
// the route to the answer. It looks the method up in the generated registry,
// checks headers and body, decodes and validates the input, hands the call to
// the Gate (authentication and the one decision), runs the business function
// in one transaction (READ ONLY for reads) and writes {data} or {error}.
// docs/protocol.md describes the wire protocol it implements.
package rpc

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-faster/jx"
	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/internal/admission"
	"computeplane/internal/metrics"
	"computeplane/internal/reqmeta"
	"computeplane/internal/store"
	"computeplane/internal/uow"
	"computeplane/internal/wire"
)

// MaxBody is the largest request body an RPC method accepts.
const MaxBody = 64 << 10

// Header names of the envelope.
const (
	HeaderService = "X-Service"
	// internalErrorMessage is all a caller learns of a failure that is not a
	// service error.
	internalErrorMessage = "Internal server error"
)

// Call is one RPC call as the envelope sees it after validation.
type Call struct {
	Method *api.Method
	// Input is the typed, validated input (a pointer to <Group><Method>Input).
	Input any
	// Fields is the parsed body, for generic reads of the tenant and
	// resource id fields named by the registry.
	Fields      map[string]any
	RequestID   string
	Traceparent string
	// Credential is the bearer token, "" when none was presented.
	Credential string
	Request    *http.Request
	// InTx says the method runs in a transaction the envelope opens after
	// Admit, so that a gate may put its decision at the head of it
	// (Settle).
	InTx bool
}

// TenantID is the input's tenantId, "" for methods that take none.
func (c *Call) TenantID() string {
	s, _ := c.Fields["tenantId"].(string)
	return s
}

// Gate is the seam where authentication and the one authorization decision
// sit. Admit runs after validation and before any transaction; an error
// refuses the call and opens no transaction. The returned context is the one
// the business function sees (it carries the caller).
type Gate interface {
	Admit(ctx context.Context, call *Call) (context.Context, error)
}

// Finisher is a Gate that must hear how an admitted call ended: err is nil
// when the transaction committed.
type Finisher interface {
	Finish(ctx context.Context, err error)
}

// Settle is how a gate that put its decision on a call at the head of the
// call's transaction (store.Head), where it is known only once that ran,
// answers the call after the transaction failed with err: the call's
// error, or again with the context to run the transaction once more in
// (the gate admitted the call by its own round trips, the head having left
// it undecided). The gate registers it in the call's context (WithSettle),
// so that a gate wrapping another needs to know nothing of it.
type Settle func(ctx context.Context, err error) (_ context.Context, again bool, _ error)

type settleKey struct{}

// WithSettle returns ctx carrying the call's Settle.
func WithSettle(ctx context.Context, s Settle) context.Context {
	return context.WithValue(ctx, settleKey{}, s)
}

// Transactor runs a function in one transaction.
type Transactor interface {
	WithTx(ctx context.Context, readOnly bool, fn func(ctx context.Context, tx pgx.Tx) error) error
}

// Handler serves POST {basePath}/{group}/{method}.
type Handler struct {
	BasePath string
	Services *api.Services
	Gate     Gate
	// Precheck runs after the input decoded and before the Gate: the
	// validation rules that need deployment facts (the root tenant) and
	// must still run before authentication. nil checks nothing.
	Precheck func(ctx context.Context, call *Call) error
	Store    Transactor
	Metrics  *metrics.RPC // nil records nothing
	// Audit writes the audit row of a mutation and the events it held in
	// its transaction, after the business function succeeded; nil writes
	// the events alone.
	Audit func(ctx context.Context, tx pgx.Tx, call *Call, u *uow.Unit) error
	// AfterCommit runs after a mutation committed, outside its transaction
	// (the notifier's wake-ups, among them u's); nil does nothing. A call
	// that waits (a continuation) runs it before its wait; any other runs
	// it once its answer was written to the connection, when ctx may be
	// done (serveAnswered).
	AfterCommit func(ctx context.Context, call *Call, u *uow.Unit)
	// Wakes lets a wait (ThenWait) re-read as soon as the row it waits on
	// is reported changed, between its backoff's re-reads; nil waits by
	// the backoff alone.
	Wakes Subscriber
	Log   *slog.Logger
	// Now is the clock of durations; tests may replace it.
	Now func() time.Time
	// CallTimeout bounds the decision and the transaction of one call;
	// 0 means DefaultCallTimeout.
	CallTimeout time.Duration
	// Admission sheds calls before any work (RATE_LIMITED); nil admits
	// every call.
	Admission *admission.Controller
}

// DefaultCallTimeout bounds a call's decision and transaction.
const DefaultCallTimeout = 10 * time.Second

// DefaultRetryAfterMs is the retry hint of an UNAVAILABLE or RATE_LIMITED
// answer whose error named none: the specification promises one on both.
const DefaultRetryAfterMs = 1000

func (h *Handler) callTimeout() time.Duration {
	if h.CallTimeout > 0 {
		return h.CallTimeout
	}
	return DefaultCallTimeout
}

// unavailable turns a database fault that reached the envelope (the
// database restarting or unreachable, a terminated session, a lock or
// statement timeout, no free connection) into UNAVAILABLE with a retry
// hint: the transaction rolled back, so nothing changed and a retry is
// safe. Every other error is left as it is.
func unavailable(log *slog.Logger, err error) error {
	var se *api.Error
	if errors.As(err, &se) || !store.Unavailable(err) {
		return err
	}
	log.Warn("database unavailable", "error", err.Error())
	return api.Errorf(api.CodeUnavailable, "the database is unavailable or busy; retry later").
		WithDetails(map[string]any{"retryAfterMs": DefaultRetryAfterMs})
}

// ServeHTTP implements the envelope.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := h.now()
	ctx, meta := reqmeta.Begin(w, r)
	log := h.logger()

	route := strings.TrimPrefix(r.URL.Path, h.BasePath)
	m := api.Lookup(route)
	name := "(unknown)"
	if m != nil {
		name = m.FullName
	}
	var trips atomic.Int64
	data, after, err := h.serve(store.CountRoundTrips(ctx, &trips), r, m, meta)
	status, code := http.StatusOK, metrics.CodeOK
	if err == nil {
		err = writeData(w, data, after != nil)
	}
	if err != nil {
		var c api.Code
		if se, ok := err.(*api.Error); ok && writeShed(w, se) {
			status, c = http.StatusTooManyRequests, api.CodeRateLimited
		} else {
			status, c = WriteError(w, log.With("requestId", meta.RequestID), err)
		}
		code = string(c)
	}
	if after != nil {
		// The answer goes out first: the work the wakes start (a spec sent
		// to its daemon, which starts a VM; the outbox's consumers) would
		// otherwise compete with it on its way to the caller.
		_ = http.NewResponseController(w).Flush()
		after()
	}
	h.Metrics.Observe(name, code, status, h.now().Sub(start))
	h.Metrics.RoundTrips(name, trips.Load())
	// One line per call at info (SERVICE_LOG_LEVEL=info), with its request
	// id first (as a With would put it). Its attributes are built only when
	// the level is on: boxing them costs allocations on every call.
	if log.Enabled(ctx, slog.LevelInfo) {
		log.Info("rpc", "requestId", meta.RequestID, "method", name, "status", status, "code", code, "ms", h.now().Sub(start).Milliseconds())
	}
}

// serve runs the call. after, when not nil, is the committed mutation's
// AfterCommit, for the caller to run once the answer is written.
func (h *Handler) serve(ctx context.Context, r *http.Request, m *api.Method, meta reqmeta.Meta) (_ any, after func(), err error) {
	out, err := h.serveAnswered(ctx, r, m, meta, &after)
	return out, after, err
}

// serveAnswered is serve; a committed mutation that does not wait sets
// *after to its AfterCommit instead of running it.
func (h *Handler) serveAnswered(ctx context.Context, r *http.Request, m *api.Method, meta reqmeta.Meta, after *func()) (_ any, err error) {
	if m == nil {
		return nil, api.Errorf(api.CodeNotFound, "no method at %s", r.URL.Path)
	}
	if r.Method != http.MethodPost {
		return nil, errMethodNotAllowed
	}
	if err := checkHeaders(r); err != nil {
		return nil, err
	}
	// Shed before reading the body: a refused call costs next to nothing.
	// Timed from the call's arrival on its connection, not from now.
	var ticket admission.Ticket
	if arrived, checked := admission.ArrivedChecked(ctx, h.now()); checked {
		ticket, err = h.Admission.EnterChecked(arrived) // RefuseEarly judged its wait
	} else {
		ticket, err = h.Admission.EnterAt(arrived)
	}
	if err != nil {
		return nil, err
	}
	holding := true // until a wait gives the slot back
	defer func() {
		if holding {
			h.Admission.Leave(ticket)
		}
		err = admission.Shed(err) // past the queue bound: RATE_LIMITED
	}()
	buf := bodies.Get().(*bytes.Buffer)
	defer putBody(buf)
	if err := readBody(buf, r.Body); err != nil {
		return nil, err
	}
	// The tree copies what it keeps: the buffer goes back to the pool.
	obj, issue := wire.ParseObject(buf.Bytes())
	if issue != nil {
		return nil, invalidInput(&wire.Issues{List: []wire.Issue{*issue}})
	}
	var iss wire.Issues
	in := m.Decode(obj, &iss)
	if !iss.Empty() {
		return nil, invalidInput(&iss)
	}
	if !m.Registered() || m.Invoke == nil {
		return nil, api.NotImplemented(m)
	}
	tenant, _ := obj["tenantId"].(string)
	if err := h.Admission.Rate(tenant); err != nil {
		return nil, err
	}
	// Every call is bounded: the decision and the transaction share one
	// deadline, from which the transaction's statement and lock timeouts
	// are derived (store.limitsOf).
	ctx, cancel := context.WithTimeout(ctx, h.callTimeout())
	defer cancel()
	// Shed a call that would wait long for a database connection; its
	// waits move the adaptive in-flight limit.
	ctx = store.WithAcquireRules(ctx, h.Admission.MaxQueue(), h.Admission.AcquireObserver())
	call := &Call{
		Method: m, Input: in, Fields: obj, Request: r,
		RequestID: meta.RequestID, Traceparent: meta.Traceparent,
		Credential: bearer(r.Header.Get("Authorization")),
		InTx:       m.Kind != api.KindPublic && store.TakesHeads(h.Store),
	}
	if h.Precheck != nil {
		if err := h.Precheck(ctx, call); err != nil {
			return nil, err
		}
	}
	if h.Gate != nil {
		if ctx, err = h.Gate.Admit(ctx, call); err != nil {
			return nil, err
		}
	}
	if m.Kind == api.KindPublic || h.Store == nil {
		return invoke(ctx, m, h.Services, in)
	}
	var out any
	if f, ok := h.Gate.(Finisher); ok {
		defer func() { f.Finish(ctx, err) }()
	}
	if m.Kind == api.KindMutation {
		ctx = context.WithValue(ctx, wakesKey{}, h.Wakes)
	}
	// One unit of work: a mutation's events are held and written with its
	// audit row in one statement just before commit; what it asks to wake
	// and its continuation act after the commit.
	run := func(ctx context.Context) (*uow.Unit, error) {
		return uow.Run(ctx, h.Store, m.Kind == api.KindRead, func(ctx context.Context, u *uow.Unit) error {
			ctx = store.ContextWithTx(ctx, u.Tx)
			var err error
			if out, err = invoke(ctx, m, h.Services, in); err != nil || m.Kind != api.KindMutation {
				return err
			}
			if h.Audit != nil {
				return h.Audit(ctx, u.Tx, call, u)
			}
			return nil // uow.Run writes the events
		})
	}
	u, err := run(ctx)
	if err != nil { // only a failed call looks for a gate's settle
		if settle, ok := ctx.Value(settleKey{}).(Settle); ok {
			var again bool
			if ctx, again, err = settle(ctx, err); again {
				u, err = run(ctx)
			}
		}
	}
	if err != nil || m.Kind != api.KindMutation {
		return out, err
	}
	then := u.Continuation()
	if h.AfterCommit != nil {
		if then == nil {
			*after = func() { h.AfterCommit(ctx, call, u) }
			return out, nil
		}
		// Before any wait: the wake-ups start the work waited for.
		h.AfterCommit(ctx, call, u)
	}
	if then != nil {
		// The Waiting convention: re-read after commit, outside the
		// transaction, within the call's deadline. A wait is no load: it
		// gives its slot back.
		holding = false
		h.Admission.Leave(ticket)
		// Committed: its re-reads wait as long as the store lets them,
		// and are no admitted call's.
		return then(store.WithAcquireRules(ctx, 0, nil))
	}
	return out, nil
}

type wakesKey struct{}

// invoke calls the group's function. An error that is not a service error
// leaves the group wrapped with the method it came from, so that the log
// of an INTERNAL_ERROR says what was being done ("instances.create: ...")
// rather than a bare "no rows in result set".
func invoke(ctx context.Context, m *api.Method, s *api.Services, in any) (any, error) {
	out, err := m.Invoke(ctx, s, in)
	var se *api.Error
	if err != nil && !errors.As(err, &se) {
		err = fmt.Errorf("%s: %w", m.FullName, err)
	}
	return out, err
}

// Subscriber is the notifier's side a wait listens on
// (notify.Notifier.Subscribe).
type Subscriber interface {
	Subscribe(topic string) (<-chan struct{}, func())
}

// Taker is the notifier's side a wait takes values on when a commit in
// this process offers what it wrote (notify.Notifier.Take, OfferLater).
type Taker interface {
	Take(topic string, fn func(v any)) (cancel func())
}

// Then replaces a mutation's output with what fn returns after the
// transaction committed (the Waiting convention: wait { timeoutMs }). fn
// runs outside the transaction; its error is the call's. It does nothing
// outside a mutation.
func Then(ctx context.Context, fn func(ctx context.Context) (any, error)) {
	if u := uow.From(ctx); u != nil {
		u.Then(fn)
	}
}

var errMethodNotAllowed = api.Errorf(api.CodeMethodNotAllowed, "RPC methods accept POST only")

// checkHeaders enforces X-Service: 1 and a JSON content type, the guard
// against cross-site form posts.
func checkHeaders(r *http.Request) error {
	if r.Header.Get(HeaderService) != "1" {
		return api.Errorf(api.CodeCsrfRejected, "the X-Service: 1 header is required")
	}
	ct := r.Header.Get("Content-Type")
	if ct == "application/json" {
		return nil // the usual value, without ParseMediaType's map
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return api.Errorf(api.CodeCsrfRejected, "Content-Type must be application/json")
	}
	return nil
}

func bearer(h string) string {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

func invalidInput(iss *wire.Issues) *api.Error {
	return api.Errorf(api.CodeInvalidInput, "%s", iss.First()).WithDetails(map[string]any{"issues": iss.List})
}

// asServiceError maps any error to the service error the caller sees:
// anything that is not a service error, and INTERNAL_ERROR itself, becomes
// INTERNAL_ERROR with a fixed message.
func asServiceError(err error) *api.Error {
	var se *api.Error
	if errors.As(err, &se) && se.Code != api.CodeInternalError {
		return se
	}
	return &api.Error{Code: api.CodeInternalError, Message: internalErrorMessage}
}

type errorBody struct {
	Error        errorPayload `json:"error"`
	RetryAfterMs *int64       `json:"retryAfterMs,omitempty"`
}

type errorPayload struct {
	Code         api.Code       `json:"code"`
	Message      string         `json:"message"`
	RetryAfterMs *int64         `json:"retryAfterMs,omitempty"`
	Details      map[string]any `json:"details,omitempty"`
}

// bodies are the buffers request bodies are read into, reused across
// calls; a buffer grown past maxPooled is left to the collector.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooled = MaxBody + bytes.MinRead

func putBody(b *bytes.Buffer) {
	if b.Cap() <= maxPooled {
		b.Reset()
		bodies.Put(b)
	}
}

// readBody reads body into buf, refusing more than MaxBody bytes. It reads
// into buf's spare room itself: a LimitReader or MaxBytesReader would cost
// an allocation per call.
func readBody(buf *bytes.Buffer, body io.Reader) error {
	for {
		if buf.Available() < bytes.MinRead {
			buf.Grow(bytes.MinRead)
		}
		room := buf.AvailableBuffer()[:buf.Available()]
		room = room[:min(len(room), MaxBody+1-buf.Len())]
		n, err := body.Read(room)
		buf.Write(room[:n]) // room is buf's own tail: this only extends it
		if buf.Len() > MaxBody {
			return api.Errorf(api.CodeInvalidInput, "body exceeds %d bytes", MaxBody)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return api.Errorf(api.CodeInvalidInput, "body could not be read")
		}
	}
}

// encoders are the JSON encoders answers are written with, reused across
// calls like bodies.
var encoders = sync.Pool{New: func() any { return new(jx.Encoder) }}

// maxPooledAnswer bounds the answer buffer kept for reuse (a list page is
// tens of KiB; a rare large answer is not kept).
const maxPooledAnswer = 1 << 20

// jsonEncoder is what the generator writes for every output type
// (gen/api/json_gen.go): encoding/json's bytes without reflection.
type jsonEncoder interface {
	EncodeJSON(e *jx.Encoder) error
}

// Header values shared by every answer: setting the map entry to a
// prebuilt slice saves Header.Set's allocation per header per call.
var (
	headerJSON    = []string{"application/json"}
	headerNoStore = []string{"no-store"}
)

// writeData answers {data}; an output that does not encode is returned as
// the error to answer instead, with nothing written. Outputs of the
// catalog's types encode with their generated EncodeJSON; anything else (a
// continuation's answer of another type) with encoding/json.
func writeData(w http.ResponseWriter, data any, flushed bool) error {
	e := encoders.Get().(*jx.Encoder)
	e.Reset()
	defer func() {
		if cap(e.Bytes()) <= maxPooledAnswer {
			encoders.Put(e)
		}
	}()
	e.ObjStart()
	e.FieldStart("data")
	var err error
	if d, ok := data.(jsonEncoder); ok {
		err = d.EncodeJSON(e)
	} else {
		err = wire.EncodeAny(e, data)
	}
	if err != nil {
		return err
	}
	e.ObjEnd()
	h := w.Header()
	h["Content-Type"] = headerJSON
	h["Cache-Control"] = headerNoStore
	if flushed {
		// Flushed before the handler returns, the answer keeps its length
		// (net/http would otherwise send it chunked).
		h["Content-Length"] = []string{strconv.Itoa(len(e.Bytes()))}
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(e.Bytes())
	return nil
}

// WriteError answers err in the error envelope and returns the status and
// code written. Database faults become UNAVAILABLE, anything that is not a
// service error INTERNAL_ERROR (logged, never shown); a numeric
// details.retryAfterMs moves to the top level and the Retry-After header,
// and UNAVAILABLE and RATE_LIMITED always carry one. Host routes that
// answer in the envelope's shape (GET /watch) use it too.
func WriteError(w http.ResponseWriter, log *slog.Logger, err error) (int, api.Code) {
	se := asServiceError(unavailable(log, err))
	if se.Code == api.CodeInternalError {
		log.Error("internal error", "error", err.Error())
	}
	body := errorBody{Error: errorPayload{Code: se.Code, Message: se.Message}}
	details := se.Details
	ms, ok := retryAfterMs(details)
	if !ok && (se.Code == api.CodeUnavailable || se.Code == api.CodeRateLimited) {
		ms, ok = DefaultRetryAfterMs, true
	}
	if ok {
		details = withoutKey(details, "retryAfterMs")
		body.RetryAfterMs, body.Error.RetryAfterMs = &ms, &ms
		w.Header().Set("Retry-After", strconv.FormatInt((ms+999)/1000, 10))
	}
	if len(details) > 0 {
		body.Error.Details = details
	}
	switch se.Code {
	case api.CodeMethodNotAllowed:
		w.Header().Set("Allow", http.MethodPost)
	case api.CodeUnauthenticated:
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	status := se.HTTPStatus()
	buf, merr := json.Marshal(body)
	if merr != nil {
		log.Error("error body could not be encoded", "error", merr.Error())
		status = http.StatusInternalServerError
		buf = []byte(`{"error":{"code":"INTERNAL_ERROR","message":"Internal server error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf)
	return status, se.Code
}

// shedAnswers caches the encoded bodies of RATE_LIMITED answers whose
// details hold only retryAfterMs (admission's refusals: a handful of
// messages), keyed by message and hint: under overload most answers are
// these, and each would otherwise cost a logger, a map and a JSON
// encoding. Bounded: past maxShedAnswers, WriteError encodes as usual.
var (
	shedMu      sync.RWMutex
	shedAnswers = map[shedKey][]byte{}
)

type shedKey struct {
	message string
	ms      int64
}

const maxShedAnswers = 256

var headerRetryAfter = map[int64][]string{}

// writeShed answers se from the cache when it is such a refusal and
// reports whether it did. The answer is the one WriteError writes.
func writeShed(w http.ResponseWriter, se *api.Error) bool {
	if se.Code != api.CodeRateLimited || len(se.Details) != 1 {
		return false
	}
	ms, ok := retryAfterMs(se.Details)
	if !ok {
		return false
	}
	k := shedKey{se.Message, ms}
	shedMu.RLock()
	body, ok := shedAnswers[k]
	retry := headerRetryAfter[ms]
	shedMu.RUnlock()
	if !ok {
		b, err := json.Marshal(errorBody{Error: errorPayload{Code: se.Code, Message: se.Message, RetryAfterMs: &ms}, RetryAfterMs: &ms})
		if err != nil {
			return false
		}
		body, retry = b, []string{strconv.FormatInt((ms+999)/1000, 10)}
		shedMu.Lock()
		if len(shedAnswers) < maxShedAnswers {
			shedAnswers[k], headerRetryAfter[ms] = body, retry
		}
		shedMu.Unlock()
	}
	h := w.Header()
	h["Retry-After"] = retry
	h["Content-Type"] = headerJSON
	h["Cache-Control"] = headerNoStore
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
	return true
}

// retryAfterMs reads a numeric details.retryAfterMs.
func retryAfterMs(details map[string]any) (int64, bool) {
	switch v := details["retryAfterMs"].(type) {
	case int:
		return int64(max(v, 0)), true
	case int64:
		return max(v, 0), true
	case float64:
		return int64(max(v, 0)), true
	case json.Number:
		f, err := v.Float64()
		return int64(max(f, 0)), err == nil
	}
	return 0, false
}

func withoutKey(m map[string]any, key string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h *Handler) logger() *slog.Logger {
	if h.Log != nil {
		return h.Log
	}
	return slog.Default()
}

// The Waiting convention's backoff between re-reads.
const (
	WaitFirst = 50 * time.Millisecond
	WaitMax   = time.Second
)

// ThenWait answers a mutation that accepts wait { timeoutMs } (the
// Waiting convention): after commit, read is called again until it
// reports done or timeout passes (up to 30 s, beyond the call's own
// deadline); a timeout answers the last output read, or initial, and is
// not an error. topic is as ThenPoll's.
func ThenWait(ctx context.Context, timeout time.Duration, topic string, initial any, read func(ctx context.Context) (out any, done bool)) {
	ThenPoll(ctx, Poll{Timeout: timeout, Topic: topic, Initial: initial}, func(ctx context.Context) (any, bool, error) {
		out, done := read(ctx)
		return out, done, nil
	})
}

// Poll is how ThenPoll re-reads.
type Poll struct {
	Timeout time.Duration
	// Topic, when set, is woken by whoever changes what the read reads
	// (notify.Later after their commit): the read runs again at each
	// wake-up too, so a change is seen within milliseconds rather than at
	// the next step of the backoff. The backoff stays, for a wake-up lost
	// or sent from a process without a notifier.
	Topic string
	// Initial answers a timeout when no read succeeded; nil answers
	// UNAVAILABLE then.
	Initial any
	// TimedOut is the call's error at the timeout; nil answers the last
	// output read, or Initial.
	TimedOut error
	// First is the backoff's first step; 0 is WaitFirst.
	First time.Duration
	// Offered, when set, answers from a value a commit in this process
	// offered on Topic (notify.OfferLater: the rows it wrote) instead of a
	// read: done ends the wait with out, without a round trip. A value it
	// is not done with (or does not know) is only a wake: the read runs.
	// Values from other processes never come; their wakes read, as before.
	Offered func(v any) (out any, done bool)
}

// ThenPoll replaces a mutation's output, after commit, with what read
// returns once it reports done or fails, re-reading at once and then
// backing off from WaitFirst to WaitMax (the Waiting convention), at most
// p.Timeout.
func ThenPoll(ctx context.Context, p Poll, read func(ctx context.Context) (out any, done bool, err error)) {
	wakes, _ := ctx.Value(wakesKey{}).(Subscriber)
	Then(ctx, func(ctx context.Context) (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.Timeout)
		defer cancel()
		var wake <-chan struct{} // nil: never ready
		var offered offerSlot
		if wakes != nil && p.Topic != "" {
			// Subscribed (and taking) before the first read: a change
			// between that read and the select is not missed.
			ch, stop := wakes.Subscribe(p.Topic)
			defer stop()
			wake = ch
			if tk, ok := wakes.(Taker); ok && p.Offered != nil {
				defer tk.Take(p.Topic, offered.put)()
			}
		}
		last := p.Initial
		delay := cmp.Or(p.First, WaitFirst)
		t := time.NewTimer(delay)
		defer t.Stop()
		for {
			if v, ok := offered.take(); ok {
				// Handed over before its wake (WakeUnit): the committed
				// rows, so no re-read when they end the wait.
				if out, done := p.Offered(v); done {
					return out, nil
				}
			}
			out, done, err := read(ctx)
			if out != nil {
				last = out
			}
			if done || err != nil {
				return last, err
			}
			select {
			case <-ctx.Done():
				if p.TimedOut != nil {
					return nil, p.TimedOut
				}
				if last == nil {
					// Committed, but never read back: the same call again
					// (its idempotency key) answers it.
					return nil, api.Errorf(api.CodeUnavailable, "the outcome could not be read back in time; repeat the call").
						WithDetails(map[string]any{"retryAfterMs": DefaultRetryAfterMs})
				}
				return last, nil // the work is pending
			case <-wake:
			case <-t.C:
				delay = min(2*delay, WaitMax)
				t.Reset(delay)
			}
		}
	})
}

// offerSlot keeps the newest value offered to a wait until its loop takes
// it (the taker runs on the committing goroutine and must not block).
type offerSlot struct {
	mu  sync.Mutex
	v   any
	has bool
}

func (o *offerSlot) put(v any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.v, o.has = v, true
}

func (o *offerSlot) take() (any, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, has := o.v, o.has
	o.v, o.has = nil, false
	return v, has
}
