package sinks_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/metrics"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/sinks"
	"computeplane/internal/store"
	"computeplane/internal/system"
)

// publish commits one site.deleted event per subject, each in its own
// transaction, in order.
func publish(t *testing.T, st *store.Store, tenant string, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		require.NoError(t, st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.Write(ctx, tx, outbox.Event{
				Type: api.EventSiteDeleted, Subject: s, TenantID: tenant, Data: api.SiteDeletedPayload{SiteID: s},
			})
		}))
	}
	visible(t, st)
}

// visible waits until every outbox and audit row of the test's database is
// readable: readers take rows of finished transactions older than the
// snapshot's xmin, which write transactions of parallel tests (on other
// databases of the cluster) hold back for a moment.
func visible(t *testing.T, st *store.Store) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, st.Pool().QueryRow(t.Context(), `SELECT
			(SELECT count(*) FROM outbox WHERE xid >= pg_snapshot_xmin(pg_current_snapshot())) +
			(SELECT count(*) FROM audit_log WHERE xid >= pg_snapshot_xmin(pg_current_snapshot()))`).Scan(&n))
		return n == 0
	}, 10*time.Second, 5*time.Millisecond)
}

func fastDispatcher(st *store.Store, m *sinks.Metrics) *sinks.Dispatcher {
	return &sinks.Dispatcher{Store: st, Metrics: m, Attempts: 3, Backoff: func(int) time.Duration { return time.Millisecond }}
}

// receiver is an HTTP sink endpoint that records every request and answers
// with the statuses it is given, then 200.
type receiver struct {
	mu       sync.Mutex
	statuses []int
	requests []request
	srv      *httptest.Server
}

type request struct {
	method, contentType string
	body                []byte
}

func newReceiver(t *testing.T, statuses ...int) *receiver {
	r := &receiver{statuses: statuses}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.requests = append(r.requests, request{req.Method, req.Header.Get("Content-Type"), body})
		status := http.StatusOK
		if len(r.statuses) > 0 {
			status, r.statuses = r.statuses[0], r.statuses[1:]
		}
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) got() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.requests...)
}

// subjects reads a CloudEvents batch body.
func subjects(t *testing.T, body []byte) []string {
	t.Helper()
	var batch []outbox.CloudEvent
	require.NoError(t, json.Unmarshal(body, &batch), string(body))
	var out []string
	for _, e := range batch {
		out = append(out, e.Subject)
	}
	return out
}

func cursorOf(t *testing.T, st *store.Store, kind, id string) (db.GetSinkCursorRow, bool) {
	t.Helper()
	row, err := st.Queries().GetSinkCursor(t.Context(), db.GetSinkCursorParams{SinkKind: kind, SinkID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return row, false
	}
	require.NoError(t, err)
	return row, true
}

func deadLetters(t *testing.T, st *store.Store, kind, id string) []db.ListSinkDeadLettersRow {
	t.Helper()
	rows, err := st.Queries().ListSinkDeadLetters(t.Context(), db.ListSinkDeadLettersParams{SinkKind: kind, SinkID: id, MaxRows: 1000})
	require.NoError(t, err)
	return rows
}

func TestHTTPSinkPostsBatchesInBatchContentMode(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	rcv := newReceiver(t)
	sink := sinks.NewHTTP(sinks.KindEvents, "siem", rcv.srv.URL+"/ingest", nil)
	d := fastDispatcher(st, nil)
	publish(t, st, "acme", "a", "b")
	publish(t, st, "globex", "c")

	n, err := d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	reqs := rcv.got()
	require.Len(t, reqs, 1)
	assert.Equal(t, http.MethodPost, reqs[0].method)
	assert.Equal(t, "application/cloudevents-batch+json", reqs[0].contentType)
	assert.Equal(t, []string{"a", "b", "c"}, subjects(t, reqs[0].body), "every tenant, in commit order")
	var batch []map[string]any
	require.NoError(t, json.Unmarshal(reqs[0].body, &batch))
	assert.Equal(t, "1.0", batch[0]["specversion"])
	assert.Equal(t, "site.deleted", batch[0]["type"])
	assert.Equal(t, "computeplane/sites", batch[0]["source"])
	assert.Equal(t, "application/json", batch[0]["datacontenttype"])
	assert.Equal(t, "acme", batch[0]["tenantid"])
	assert.Equal(t, map[string]any{"siteId": "a", "tombstoned": false}, batch[0]["data"])
	assert.Regexp(t, `^evt_`, batch[0]["id"])

	// Caught up: nothing is sent again; what commits next is.
	n, err = d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Len(t, rcv.got(), 1)
	publish(t, st, "acme", "d", "e", "f")
	n, err = d.DispatchOnce(t.Context(), sink, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "at most batch rows")
	n, err = d.DispatchOnce(t.Context(), sink, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	reqs = rcv.got()
	require.Len(t, reqs, 3)
	assert.Equal(t, []string{"d", "e"}, subjects(t, reqs[1].body))
	assert.Equal(t, []string{"f"}, subjects(t, reqs[2].body))
	cur, ok := cursorOf(t, st, sinks.KindEvents, "siem")
	require.True(t, ok)
	assert.Equal(t, int64(6), cur.Delivered)
	assert.Zero(t, cur.DeadLettered)
}

func TestHTTPSinkRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	rcv := newReceiver(t, http.StatusServiceUnavailable, http.StatusTooManyRequests)
	sink := sinks.NewHTTP(sinks.KindEvents, "siem", rcv.srv.URL, nil)
	var waits []time.Duration
	d := &sinks.Dispatcher{Store: st, Attempts: 3, Backoff: func(n int) time.Duration {
		w := sinks.DefaultBackoff(n) / 1000
		waits = append(waits, w)
		return w
	}}
	publish(t, st, "acme", "a")
	n, err := d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Len(t, rcv.got(), 3, "two refusals, then accepted")
	assert.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond}, waits, "backing off")
	assert.Empty(t, deadLetters(t, st, sinks.KindEvents, "siem"))
	n, err = d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Zero(t, n, "the cursor moved past the accepted batch")
}

func TestRepeatedFailuresBecomeDeadLetters(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	reg := metrics.NewRegistry()
	m, err := sinks.NewMetrics(reg)
	require.NoError(t, err)
	rcv := newReceiver(t, 500, 502, 503)
	sink := sinks.NewHTTP(sinks.KindEvents, "siem", rcv.srv.URL, nil)
	d := fastDispatcher(st, m)
	publish(t, st, "acme", "a", "b")

	n, err := d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err, "giving up on a batch is progress, not an error")
	assert.Equal(t, 2, n)
	assert.Len(t, rcv.got(), 3, "Attempts tries")
	dead := deadLetters(t, st, sinks.KindEvents, "siem")
	require.Len(t, dead, 2)
	for i, want := range []string{"a", "b"} {
		var e outbox.CloudEvent
		require.NoError(t, json.Unmarshal(dead[i].Payload, &e))
		assert.Equal(t, want, e.Subject)
		assert.Equal(t, e.ID, dead[i].EventID)
		assert.Contains(t, dead[i].Error, "answered 503", "the last error")
	}
	cur, _ := cursorOf(t, st, sinks.KindEvents, "siem")
	assert.Equal(t, int64(2), cur.DeadLettered)
	assert.Zero(t, cur.Delivered)
	assert.Equal(t, 2.0, gauge(t, reg, sinks.MetricDeadLettered, "siem"))
	assert.Equal(t, 0.0, gauge(t, reg, sinks.MetricLag, "siem"))

	// The receiver is back: later rows are delivered, the dead ones are not resent.
	publish(t, st, "acme", "c")
	n, err = d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	reqs := rcv.got()
	assert.Equal(t, []string{"c"}, subjects(t, reqs[len(reqs)-1].body))
}

func TestLagGauge(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	reg := metrics.NewRegistry()
	m, err := sinks.NewMetrics(reg)
	require.NoError(t, err)
	d := fastDispatcher(st, m)
	sink := &fakeSink{kind: sinks.KindEvents}
	publish(t, st, "acme", "a", "b", "c")
	_, err = d.DispatchOnce(t.Context(), sink, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, 1.0, gauge(t, reg, sinks.MetricLag, "fake"), "one row behind")
	assert.Equal(t, 2.0, gauge(t, reg, sinks.MetricDelivered, "fake"))
	_, err = d.DispatchOnce(t.Context(), sink, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, 0.0, gauge(t, reg, sinks.MetricLag, "fake"), "caught up: measured at once")
	assert.Equal(t, 3.0, gauge(t, reg, sinks.MetricDelivered, "fake"))
	assert.Equal(t, 0.0, gauge(t, reg, sinks.MetricDeadLettered, "fake"))
}

func TestPermanentRefusalIsNotRetried(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	rcv := newReceiver(t, http.StatusBadRequest)
	sink := sinks.NewHTTP(sinks.KindEvents, "siem", rcv.srv.URL, nil)
	publish(t, st, "acme", "a")
	_, err := fastDispatcher(st, nil).DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Len(t, rcv.got(), 1)
	require.Len(t, deadLetters(t, st, sinks.KindEvents, "siem"), 1)
}

// A redirect is a failure, never followed.
func TestHTTPSinkDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()
	target := newReceiver(t)
	redirect := httptest.NewServer(http.RedirectHandler(target.srv.URL, http.StatusTemporaryRedirect))
	t.Cleanup(redirect.Close)
	err := sinks.NewHTTP(sinks.KindEvents, "siem", redirect.URL, nil).Send(t.Context(), []sinks.Record{{ID: "1", Body: []byte(`{}`)}})
	require.ErrorContains(t, err, "answered 307")
	assert.NotErrorIs(t, err, sinks.ErrPermanent)
	assert.Empty(t, target.got())
}

// fakeSink records batches and fails while fail is set.
type fakeSink struct {
	kind    string
	mu      sync.Mutex
	batches [][]string
	fail    error
	during  func(ctx context.Context)
}

func (f *fakeSink) ID() string   { return "fake" }
func (f *fakeSink) Kind() string { return f.kind }
func (f *fakeSink) Send(ctx context.Context, batch []sinks.Record) error {
	if f.during != nil {
		f.during(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, r := range batch {
		ids = append(ids, r.ID)
	}
	f.batches = append(f.batches, ids)
	return f.fail
}

// The cursor moves only after the sink accepted: while it sends, the
// cursor still points before the batch; a send cut short by shutdown
// leaves it there and writes no dead letter.
func TestCursorAdvancesOnlyAfterSuccess(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	publish(t, st, "acme", "a", "b")
	d := fastDispatcher(st, nil)

	var seenDuringSend bool
	sink := &fakeSink{kind: sinks.KindEvents}
	sink.during = func(context.Context) { _, seenDuringSend = cursorOf(t, st, sinks.KindEvents, "fake") }
	n, err := d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.False(t, seenDuringSend, "no cursor before the sink accepted")
	_, ok := cursorOf(t, st, sinks.KindEvents, "fake")
	assert.True(t, ok)

	publish(t, st, "acme", "c")
	ctx, cancel := context.WithCancel(t.Context())
	stopping := &fakeSink{kind: sinks.KindEvents, fail: errors.New("receiver down")}
	stopping.during = func(context.Context) { cancel() }
	// A separate sink id would start over; reuse "fake" to continue after a, b.
	_, err = d.DispatchOnce(ctx, stopping, nil, 10)
	require.Error(t, err)
	assert.Empty(t, deadLetters(t, st, sinks.KindEvents, "fake"))
	n, err = d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "c is sent again")
	assert.Len(t, sink.batches, 2)
}

// A dispatcher whose fence fails (it lost its lease) cannot move the
// cursor: the batch is sent again by whoever holds the lease next.
func TestFenceFailureStopsTheAdvance(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	publish(t, st, "acme", "a", "b")
	d := fastDispatcher(st, nil)
	sink := &fakeSink{kind: sinks.KindEvents}
	lost := errors.New("lease lost")
	var fenced bool
	_, err := d.DispatchOnce(t.Context(), sink, func(ctx context.Context, tx pgx.Tx) error {
		fenced = true
		// Runs inside the advancing transaction.
		var one int
		require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one))
		return lost
	}, 10)
	require.ErrorIs(t, err, lost)
	assert.True(t, fenced)
	_, ok := cursorOf(t, st, sinks.KindEvents, "fake")
	assert.False(t, ok, "the cursor did not move")

	// Fence failures also keep dead letters out.
	failing := &fakeSink{kind: sinks.KindEvents, fail: sinks.Permanent(errors.New("bad"))}
	_, err = d.DispatchOnce(t.Context(), failing, func(context.Context, pgx.Tx) error { return lost }, 10)
	require.ErrorIs(t, err, lost)
	assert.Empty(t, deadLetters(t, st, sinks.KindEvents, "fake"))

	n, err := d.DispatchOnce(t.Context(), sink, func(context.Context, pgx.Tx) error { return nil }, 10)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	require.Len(t, sink.batches, 2)
	assert.Equal(t, sink.batches[0], sink.batches[1], "the same batch again: at least once")
}

// Two dispatchers of one sink: the one whose cursor moved underneath
// advances nothing.
func TestCursorMovedUnderTheDispatcher(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	publish(t, st, "acme", "a")
	d := fastDispatcher(st, nil)
	other := &fakeSink{kind: sinks.KindEvents}
	sink := &fakeSink{kind: sinks.KindEvents}
	sink.during = func(ctx context.Context) {
		_, err := d.DispatchOnce(ctx, other, nil, 10)
		require.NoError(t, err)
	}
	_, err := d.DispatchOnce(t.Context(), sink, nil, 10)
	require.ErrorIs(t, err, sinks.ErrCursorMoved)
	cur, _ := cursorOf(t, st, sinks.KindEvents, "fake")
	assert.Equal(t, int64(1), cur.Delivered, "counted once")
}

func TestFileSinkAppendsJSONLines(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	sink := sinks.NewFile(sinks.KindEvents, "local", path)
	d := fastDispatcher(st, nil)
	publish(t, st, "acme", "a", "b")
	_, err := d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)
	// A crash left a torn line: the next batch starts on a line of its own.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"torn":`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	publish(t, st, "acme", "c")
	_, err = d.DispatchOnce(t.Context(), sink, nil, 10)
	require.NoError(t, err)

	lines := readLines(t, path)
	require.Len(t, lines, 4)
	var got []string
	for i, l := range lines {
		if i == 2 {
			assert.Equal(t, `{"torn":`, l)
			continue
		}
		var e outbox.CloudEvent
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
		assert.Equal(t, "1.0", e.SpecVersion)
		got = append(got, e.Subject)
	}
	assert.Equal(t, []string{"a", "b", "c"}, got)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), info.Mode().Perm())
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	require.NoError(t, sc.Err())
	return out
}

func insertAudit(t *testing.T, ctx context.Context, tx pgx.Tx, method string) {
	t.Helper()
	_, err := tx.Exec(ctx, `INSERT INTO audit_log (tenant_id, identity_id, identity_kind, method, resource_type, resource_id, request_id, outcome, agent_id)
		VALUES ('acme', 'ann', 'user', $1, 'compute-site', 'site_1', 'req_1', 'ok', 'bot')`, method)
	require.NoError(t, err)
}

// Audit rows reach audit sinks in the order their transactions became
// visible: a row whose transaction commits late holds back those after it
// and is not skipped, although its id is smaller.
func TestAuditSinkOrdering(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	sink := sinks.NewFile(sinks.KindAudit, "trail", path)
	rcv := newReceiver(t)
	httpSink := sinks.NewHTTP(sinks.KindAudit, "trail-http", rcv.srv.URL, nil)
	d := fastDispatcher(st, nil)

	slow, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(context.WithoutCancel(ctx)) }()
	insertAudit(t, ctx, slow, "sites.late") // smaller id, commits last
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		insertAudit(t, ctx, tx, "sites.early")
		return nil
	}))
	n, err := d.DispatchOnce(ctx, sink, nil, 10)
	require.NoError(t, err)
	assert.Zero(t, n, "the open older transaction holds back what follows it")

	require.NoError(t, slow.Commit(ctx))
	visible(t, st)
	for _, s := range []sinks.Sink{sink, httpSink} {
		n, err = d.DispatchOnce(ctx, s, nil, 10)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
	}
	var recs []sinks.AuditRecord
	for _, l := range readLines(t, path) {
		var r sinks.AuditRecord
		require.NoError(t, json.Unmarshal([]byte(l), &r))
		recs = append(recs, r)
	}
	require.Len(t, recs, 2)
	assert.Equal(t, "sites.late", recs[0].Method)
	assert.Equal(t, "sites.early", recs[1].Method)
	assert.Less(t, recs[0].ID, recs[1].ID)
	assert.Equal(t, "acme", recs[0].TenantID)
	assert.Equal(t, "bot", *recs[0].AgentID)
	assert.Nil(t, recs[0].DelegationID)
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, recs[0].At)

	reqs := rcv.got()
	require.Len(t, reqs, 1)
	assert.Equal(t, "application/json", reqs[0].contentType)
	var posted []sinks.AuditRecord
	require.NoError(t, json.Unmarshal(reqs[0].body, &posted))
	assert.Equal(t, recs, posted, "both transports carry the same records")

	// Events and audit cursors of the same id are apart.
	_, ok := cursorOf(t, st, sinks.KindEvents, "trail")
	assert.False(t, ok)
}

func TestJobsDrainEachSink(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	publish(t, st, "acme", "a", "b", "c", "d", "e")
	d := fastDispatcher(st, nil)
	a, b := &fakeSink{kind: sinks.KindEvents}, &fakeSink{kind: sinks.KindAudit}
	jobs := d.Jobs([]sinks.Sink{a, b}, 2)
	require.Len(t, jobs, 2)
	assert.Equal(t, "sink:events:fake", jobs[0].Name)
	assert.Equal(t, "sink:audit:fake", jobs[1].Name)
	var fences atomic.Int32
	fence := func(context.Context, pgx.Tx) error { fences.Add(1); return nil }
	require.NoError(t, jobs[0].Run(t.Context(), fence))
	assert.Len(t, a.batches, 3, "2 + 2 + 1")
	assert.Equal(t, int32(3), fences.Load(), "every advance fenced")
	require.NoError(t, jobs[1].Run(t.Context(), fence))
	assert.Empty(t, b.batches, "no audit rows")
}

// The job drains at once, again on a wake-up, and ends with its context.
func TestJobWakesAndStops(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	publish(t, st, "acme", "a")
	sink := &fakeSink{kind: sinks.KindEvents}
	job := fastDispatcher(st, nil).Jobs([]sinks.Sink{sink}, 10)[0]
	ctx, cancel := context.WithCancel(t.Context())
	n := notify.New(nil, nil, nil)
	done := make(chan error, 1)
	go func() { done <- job.Periodic(n, time.Hour).RunFenced(ctx, nil) }()
	batches := func() int {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.batches)
	}
	require.Eventually(t, func() bool { return batches() == 1 }, 5*time.Second, 5*time.Millisecond)
	publish(t, st, "acme", "b")
	n.Wake(notify.TopicOutbox)
	require.Eventually(t, func() bool { return batches() == 2 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func TestFromConfig(t *testing.T) {
	t.Parallel()
	list, err := sinks.FromConfig(configSinks())
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, "events", list[0].Kind())
	assert.IsType(t, &sinks.HTTP{}, list[0])
	assert.Equal(t, "audit", list[1].Kind())
	assert.IsType(t, &sinks.File{}, list[1])
	assert.Equal(t, "siem", list[1].ID())
}

func TestSelfCheckReportsLagAndDeadLetters(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ok := &fakeSink{kind: sinks.KindEvents}
	run := func() []api.Finding {
		var out []api.Finding
		require.NoError(t, st.WithTx(t.Context(), true, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			out, err = sinks.Check([]sinks.Sink{ok}).Run(ctx, tx)
			return err
		}))
		return out
	}
	publish(t, st, "acme", "a", "b")
	f := run()
	require.Len(t, f, 1)
	assert.Equal(t, system.SeverityInfo, f[0].Severity)
	assert.Equal(t, "events sink fake: 2 rows behind, 0 dead letters", f[0].Message)

	d := fastDispatcher(st, nil)
	ok.fail = sinks.Permanent(errors.New("no"))
	_, err := d.DispatchOnce(t.Context(), ok, nil, 10)
	require.NoError(t, err)
	f = run()
	assert.Equal(t, system.SeverityWarning, f[0].Severity)
	assert.Equal(t, "events sink fake: 0 rows behind, 2 dead letters", f[0].Message)

	// Rows waiting behind a cursor that has not moved for long: stalled.
	publish(t, st, "acme", "c")
	_, err = st.Pool().Exec(t.Context(), "UPDATE sink_cursors SET updated_at = now() - interval '11 minutes'")
	require.NoError(t, err)
	f = run()
	assert.Equal(t, system.SeverityError, f[0].Severity)
	assert.Contains(t, f[0].Message, "1 rows behind")
	assert.Contains(t, f[0].Message, "no progress for 11m0s")

	require.NoError(t, st.WithTx(t.Context(), true, func(ctx context.Context, tx pgx.Tx) error {
		none, err := sinks.Check(nil).Run(ctx, tx)
		require.NoError(t, err)
		assert.Equal(t, "no sinks configured", none[0].Message)
		return nil
	}))
}

// gauge reads the value of a per-sink series from the registry.
func gauge(t *testing.T, reg *metrics.Registry, name, sink string) float64 {
	t.Helper()
	families, err := reg.Prometheus().Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "sink") == sink {
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s series for sink %s", name, sink)
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func configSinks() config.Sinks {
	return config.Sinks{
		Events: []config.Sink{{ID: "siem", Kind: config.SinkHTTP, URL: "https://siem.example.com/ingest"}},
		Audit:  []config.Sink{{ID: "siem", Kind: config.SinkFile, Path: "/var/log/cp/audit.jsonl"}},
	}
}

// Audit rows are read in the numeric order of their transaction ids, also
// where the ids gain a digit (see outbox TestCommittedOrdersTransactionIDsAsNumbers).
func TestAuditReadOrdersTransactionIDsAsNumbers(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	for _, xid := range []string{"10", "9"} { // the row of 10 is written first: ids alone must order them
		_, err := st.Pool().Exec(ctx, `INSERT INTO audit_log (tenant_id, identity_id, identity_kind, method, resource_type, resource_id, request_id, outcome, xid)
			VALUES ('acme', 'ann', 'user', 'm', 'r', $1::text, 'req', 'allowed', $1::text::xid8)`, xid)
		require.NoError(t, err)
	}
	q := db.New(st.Pool())
	var got []string
	after := db.ListAuditCommittedParams{AfterXid: "0", MaxRows: 1}
	for range 3 {
		rows, err := q.ListAuditCommitted(ctx, after)
		require.NoError(t, err)
		if len(rows) == 0 {
			break
		}
		got = append(got, rows[0].Xid)
		after.AfterXid, after.AfterID = rows[0].Xid, rows[0].ID
	}
	assert.Equal(t, []string{"9", "10"}, got)
}
