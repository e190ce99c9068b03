// Package outbox writes the events a change publishes into the outbox table
// in the change's own transaction, so an event exists exactly when its change
// committed; and it renders rows as CloudEvents 1.0 envelopes for the
// consumers (sinks, webhooks, /watch) that read them.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/ids"
	"computeplane/internal/reqmeta"
	"computeplane/internal/uow"
	"computeplane/internal/wire"
)

// SourcePrefix starts the CloudEvents source of every event; the publishing
// module follows (computeplane/sites).
const SourcePrefix = "computeplane/"

// Event is one event to publish.
type Event struct {
	Type     string // a type of catalog/events.yaml (api.EventSiteCreated ...)
	Subject  string // what it is about: a site id, a secret reference ...
	TenantID string // the tenant whose stream carries it
	Data     any    // the payload (api.<Name>Payload)
}

var modules = func() map[string]string {
	m := make(map[string]string, len(api.EventTypes))
	for _, e := range api.EventTypes {
		m[e.Type] = e.Module
	}
	return m
}()

// Write adds e to the outbox in tx. Inside a unit of work (uow.Run: an RPC
// call, a job's fenced write) the event is held and written with the
// unit's other events in one statement before commit; elsewhere it is
// written at once.
func Write(ctx context.Context, tx pgx.Tx, e Event) error {
	r, err := newRow(e)
	if err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if u := uow.From(ctx); u != nil {
		u.Hold(b)
		return nil
	}
	meta := reqmeta.FromContext(ctx)
	return db.New(tx).InsertEvents(ctx, db.InsertEventsParams{
		RequestID: text(meta.RequestID), Traceparent: text(meta.Traceparent), Events: []byte("[" + string(b) + "]"),
	})
}

// row is an event as the insert statements read it (a JSON array element).
type row struct {
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	Source   string          `json:"source"`
	Subject  string          `json:"subject"`
	TenantID string          `json:"tenantId"`
	Data     json.RawMessage `json:"data"`
}

func newRow(e Event) (row, error) {
	module, ok := modules[e.Type]
	if !ok {
		return row{}, fmt.Errorf("outbox: event type %q is not in the event catalog", e.Type)
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		return row{}, fmt.Errorf("outbox: %s payload: %w", e.Type, err)
	}
	return row{ID: ids.New("evt"), Type: e.Type, Source: SourcePrefix + module, Subject: e.Subject, TenantID: e.TenantID, Data: data}, nil
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

// CloudEvent is the JSON envelope of an event (CloudEvents 1.0, structured
// mode) plus the tenantid extension.
type CloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
	TenantID        string          `json:"tenantid"`
}

// Position is a reader's place in the outbox: the (transaction id, seq) of
// the last row it took. The zero Position is the start.
type Position struct {
	Xid string // xid8 as text; "" is 0
	Seq int64
}

// String is the position as "xid.seq".
func (p Position) String() string {
	x := p.Xid
	if x == "" {
		x = "0"
	}
	return x + "." + strconv.FormatInt(p.Seq, 10)
}

// ParsePosition reads a String.
func ParsePosition(s string) (Position, error) {
	x, seq, ok := strings.Cut(s, ".")
	if !ok {
		return Position{}, fmt.Errorf("outbox: bad position %q", s)
	}
	if _, err := strconv.ParseUint(x, 10, 64); err != nil {
		return Position{}, fmt.Errorf("outbox: bad position %q", s)
	}
	n, err := strconv.ParseInt(seq, 10, 64)
	if err != nil || n < 0 {
		return Position{}, fmt.Errorf("outbox: bad position %q", s)
	}
	return Position{Xid: x, Seq: n}, nil
}

// Row is a committed outbox row with its position.
type Row struct {
	Position Position
	Event    CloudEvent
}

// Envelope renders an outbox row.
func Envelope(r db.ListOutboxCommittedRow) CloudEvent {
	return CloudEvent{
		SpecVersion:     "1.0",
		ID:              r.ID,
		Source:          r.Source,
		Type:            r.Type,
		Subject:         r.Subject,
		Time:            wire.Time(r.Time),
		DataContentType: "application/json",
		Data:            r.Data,
		TenantID:        r.TenantID,
	}
}

// Committed returns up to limit rows after pos in the order they became
// visible, only from transactions that can no longer commit later (see
// migrations/00007_outbox_order.sql). tenant "" reads every tenant.
func Committed(ctx context.Context, q *db.Queries, tenant string, after Position, limit int32) ([]Row, error) {
	xid := after.Xid
	if xid == "" {
		xid = "0"
	}
	rows, err := q.ListOutboxCommitted(ctx, db.ListOutboxCommittedParams{
		AfterXid: xid, AfterSeq: after.Seq, TenantID: tenant, MaxRows: limit,
	})
	if err != nil {
		return nil, err
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = Row{Position: Position{Xid: r.Xid, Seq: r.Seq}, Event: Envelope(r)}
	}
	return out, nil
}
