package sinks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/outbox"
	"computeplane/internal/wire"
	"computeplane/internal/workers"
)

// Defaults of a Dispatcher.
const (
	// DefaultAttempts is how many times a batch is sent before it becomes
	// dead letters.
	DefaultAttempts = 5
	// DefaultBatch is the batch size Jobs use.
	DefaultBatch = 100
	// LagCap bounds the count behind the lag gauge and the self check, so
	// that measuring a far-behind sink stays cheap.
	LagCap = 1_000_000
)

// Store is what a dispatcher needs of the store.
type Store interface {
	Queries() *db.Queries
	WithTx(ctx context.Context, readOnly bool, fn func(ctx context.Context, tx pgx.Tx) error) error
}

// Fence is run first in the transaction that advances a cursor; an error
// (the caller's lease is lost) rolls it back, leaving the cursor where it
// was.
type Fence = workers.Fence

// ErrCursorMoved is returned when a sink's cursor moved under a dispatch:
// another dispatcher owns the sink now. Nothing was advanced.
var ErrCursorMoved = errors.New("sinks: the cursor moved under this dispatcher")

// Dispatcher moves rows from the store to sinks.
type Dispatcher struct {
	Store Store
	// Metrics may be nil.
	Metrics *Metrics
	// Attempts per batch before it becomes dead letters (DefaultAttempts
	// when 0).
	Attempts int
	// Backoff is the wait before attempt n+1 after attempt n failed
	// (DefaultBackoff when nil).
	Backoff func(attempt int) time.Duration
	Log     *slog.Logger

	lagMu sync.Mutex
	lagAt map[string]time.Time // last lag count per sink
}

// lagEvery spaces the lag counts of a sink that is behind: counting a long
// way behind is not free, and the gauge need not move with every batch.
const lagEvery = 10 * time.Second

// DefaultBackoff doubles from 1 s up to 30 s: five attempts span about 15 s,
// within one lease renewal window of a singleton job.
func DefaultBackoff(attempt int) time.Duration {
	d := time.Second << min(attempt-1, 5)
	return min(d, 30*time.Second)
}

// cursorOf is a sink's durable place: (xid, seq) of the outbox for events
// sinks, (xid, id) of audit_log for audit sinks.
type cursorOf = outbox.Position

// DispatchOnce sends the next batch of at most batch rows after the sink's
// cursor and advances the cursor past them: send first, then advance in a
// transaction that runs fence before anything else (at least once). A batch
// the sink refuses Attempts times, or once permanently, is recorded as dead
// letters in that same transaction and passed over. It returns the number
// of rows the batch held (0 when the sink is caught up).
func (d *Dispatcher) DispatchOnce(ctx context.Context, s Sink, fence Fence, batch int) (int, error) {
	if batch < 1 {
		return 0, fmt.Errorf("sinks: batch must be positive, got %d", batch)
	}
	q := d.Store.Queries()
	from, err := readCursor(ctx, q, s)
	if err != nil {
		return 0, err
	}
	records, to, err := read(ctx, q, s.Kind(), from, batch)
	if err != nil {
		return 0, err
	}
	if len(records) == 0 {
		d.observeLag(ctx, q, s, from, true)
		return 0, nil
	}
	sendErr := d.send(ctx, s, records)
	if sendErr != nil && ctx.Err() != nil {
		return 0, sendErr // stopping: leave the batch for whoever runs next
	}
	var delivered, dead int64 = int64(len(records)), 0
	if sendErr != nil {
		delivered, dead = 0, int64(len(records))
	}
	err = d.Store.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if fence != nil {
			if err := fence(ctx, tx); err != nil {
				return err
			}
		}
		q := db.New(tx)
		if sendErr != nil {
			if err := q.InsertSinkDeadLetters(ctx, db.InsertSinkDeadLettersParams{
				SinkKind: s.Kind(), SinkID: s.ID(), Error: truncate(sendErr.Error(), 2000), Letters: letters(records),
			}); err != nil {
				return err
			}
		}
		n, err := q.AdvanceSinkCursor(ctx, db.AdvanceSinkCursorParams{
			SinkKind: s.Kind(), SinkID: s.ID(),
			FromXid: xidOf(from), FromSeq: from.Seq, ToXid: xidOf(to), ToSeq: to.Seq,
			Delivered: delivered, DeadLettered: dead,
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return ErrCursorMoved
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if sendErr != nil {
		d.logger().WarnContext(ctx, "sink gave up on a batch: dead letters written",
			"sinkKind", s.Kind(), "sinkId", s.ID(), "rows", len(records), "error", sendErr.Error())
	}
	d.Metrics.delivered(s, delivered)
	d.Metrics.deadLettered(s, dead)
	d.observeLag(ctx, q, s, to, len(records) < batch)
	return len(records), nil
}

// send tries the batch up to Attempts times, waiting Backoff between
// tries; a permanent failure ends the tries at once.
func (d *Dispatcher) send(ctx context.Context, s Sink, records []Record) error {
	attempts := d.Attempts
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	backoff := d.Backoff
	if backoff == nil {
		backoff = DefaultBackoff
	}
	var err error
	for attempt := 1; ; attempt++ {
		if err = s.Send(ctx, records); err == nil {
			return nil
		}
		if errors.Is(err, ErrPermanent) || attempt >= attempts || ctx.Err() != nil {
			return err
		}
		d.logger().InfoContext(ctx, "sink refused a batch; retrying",
			"sinkKind", s.Kind(), "sinkId", s.ID(), "attempt", attempt, "error", err.Error())
		t := time.NewTimer(backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func readCursor(ctx context.Context, q *db.Queries, s Sink) (cursorOf, error) {
	row, err := q.GetSinkCursor(ctx, db.GetSinkCursorParams{SinkKind: s.Kind(), SinkID: s.ID()})
	if errors.Is(err, pgx.ErrNoRows) {
		return cursorOf{Xid: "0"}, nil
	}
	if err != nil {
		return cursorOf{}, err
	}
	return cursorOf{Xid: row.AfterXid, Seq: row.AfterSeq}, nil
}

// read returns the next rows after `after` for a sink of kind, as records,
// and the position of the last one.
func read(ctx context.Context, q *db.Queries, kind string, after cursorOf, limit int) ([]Record, cursorOf, error) {
	switch kind {
	case KindEvents:
		rows, err := outbox.Committed(ctx, q, "", after, int32(limit))
		if err != nil || len(rows) == 0 {
			return nil, after, err
		}
		out := make([]Record, len(rows))
		for i, r := range rows {
			body, err := json.Marshal(r.Event)
			if err != nil {
				return nil, after, err
			}
			out[i] = Record{ID: r.Event.ID, Body: body}
		}
		return out, rows[len(rows)-1].Position, nil
	case KindAudit:
		rows, err := q.ListAuditCommitted(ctx, db.ListAuditCommittedParams{AfterXid: xidOf(after), AfterID: after.Seq, MaxRows: int32(limit)})
		if err != nil || len(rows) == 0 {
			return nil, after, err
		}
		out := make([]Record, len(rows))
		for i, r := range rows {
			body, err := json.Marshal(auditRecord(r))
			if err != nil {
				return nil, after, err
			}
			out[i] = Record{ID: strconv.FormatInt(r.ID, 10), Body: body}
		}
		last := rows[len(rows)-1]
		return out, cursorOf{Xid: last.Xid, Seq: last.ID}, nil
	}
	return nil, after, fmt.Errorf("sinks: unknown sink kind %q", kind)
}

func auditRecord(r db.ListAuditCommittedRow) AuditRecord {
	rec := AuditRecord{
		ID: r.ID, At: wire.Time(r.At), TenantID: r.TenantID,
		IdentityID: r.IdentityID, IdentityKind: r.IdentityKind, Method: r.Method,
		ResourceType: r.ResourceType, ResourceID: r.ResourceID, RequestID: r.RequestID, Outcome: r.Outcome,
	}
	if r.AgentID.Valid {
		rec.AgentID = &r.AgentID.String
	}
	if r.DelegationID.Valid {
		rec.DelegationID = &r.DelegationID.String
	}
	if r.Traceparent.Valid {
		rec.Traceparent = &r.Traceparent.String
	}
	return rec
}

// letters is the dead-letter rows of a batch as InsertSinkDeadLetters reads
// them.
func letters(records []Record) []byte {
	type letter struct {
		ID      string          `json:"id"`
		Payload json.RawMessage `json:"payload"`
	}
	out := make([]letter, len(records))
	for i, r := range records {
		out[i] = letter{ID: r.ID, Payload: r.Body}
	}
	b, err := json.Marshal(out)
	if err != nil {
		panic(err) // bodies are JSON the dispatcher marshalled
	}
	return b
}

func xidOf(p cursorOf) string {
	if p.Xid == "" {
		return "0"
	}
	return p.Xid
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Lag counts the rows after a sink's cursor, up to LagCap.
func Lag(ctx context.Context, q *db.Queries, kind string, after cursorOf) (int64, error) {
	switch kind {
	case KindEvents:
		return q.CountOutboxAfter(ctx, db.CountOutboxAfterParams{AfterXid: xidOf(after), AfterSeq: after.Seq, MaxRows: LagCap})
	case KindAudit:
		return q.CountAuditAfter(ctx, db.CountAuditAfterParams{AfterXid: xidOf(after), AfterID: after.Seq, MaxRows: LagCap})
	}
	return 0, fmt.Errorf("sinks: unknown sink kind %q", kind)
}

// observeLag sets the lag gauge: always when the sink caught up (the count
// is short), otherwise at most every lagEvery.
func (d *Dispatcher) observeLag(ctx context.Context, q *db.Queries, s Sink, after cursorOf, caughtUp bool) {
	if d.Metrics == nil {
		return
	}
	key := s.Kind() + "/" + s.ID()
	now := time.Now()
	d.lagMu.Lock()
	if !caughtUp && now.Sub(d.lagAt[key]) < lagEvery {
		d.lagMu.Unlock()
		return
	}
	if d.lagAt == nil {
		d.lagAt = map[string]time.Time{}
	}
	d.lagAt[key] = now
	d.lagMu.Unlock()
	n, err := Lag(ctx, q, s.Kind(), after)
	if err != nil {
		return // a gauge left as it was is better than a wrong one
	}
	d.Metrics.lag.WithLabelValues(s.Kind(), s.ID()).Set(float64(n))
}

func (d *Dispatcher) logger() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.New(slog.DiscardHandler)
}
