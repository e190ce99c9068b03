// Package events implements the events group and GET /watch: the tenant's
// committed events read from the outbox in the order they became visible
// (outbox.Committed), filtered by type patterns, behind cursors sealed for
// events.list and the tenant. events.list pages through them; /watch
// streams them as Server-Sent Events whose ids are the same cursors, so a
// stream resumes with Last-Event-ID and a list continues where a stream
// stopped. docs/events.md describes both.
package events

import (
	"context"
	"errors"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/cursor"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
)

// Read bounds: rows are read from the outbox in chunks, and one read looks
// at no more than MaxScan rows, so a filter that matches rarely cannot make
// a single call scan a tenant's whole history; the position returned moves
// past what was looked at.
const (
	scanChunk = 500
	MaxScan   = 5000
)

// Read returns up to limit of tenant's committed events after `after` that
// m selects, in visibility order, and the position to continue from: the
// last event returned when the page is full, otherwise the last row looked
// at (matching or not), or after itself when nothing was there. more is
// true when it stopped before catching up (a full page, or MaxScan rows
// looked at). Rows are only ever read from finished transactions, so
// nothing can commit before a returned position later.
func Read(ctx context.Context, q *db.Queries, tenant string, after outbox.Position, m Matcher, limit int) (rows []outbox.Row, next outbox.Position, more bool, err error) {
	chunk := scanChunk
	if m.All() {
		chunk = limit
	}
	next = after
	for scanned := 0; scanned < MaxScan; {
		got, err := outbox.Committed(ctx, q, tenant, next, int32(chunk))
		if err != nil {
			return nil, after, false, err
		}
		for _, r := range got {
			next = r.Position
			scanned++
			if m.Match(r.Event.Type) {
				rows = append(rows, r)
				if len(rows) == limit {
					return rows, next, true, nil
				}
			}
		}
		if len(got) < chunk {
			return rows, next, false, nil // caught up
		}
	}
	return rows, next, true, nil
}

// Service implements api.EventsService.
type Service struct{ cursors *cursor.Sealer }

var _ api.EventsService = (*Service)(nil)

// New returns the events service; cursors seals list cursors and stream ids.
func New(cursors *cursor.Sealer) *Service { return &Service{cursors: cursors} }

// Seal is the cursor (and /watch id) of a position in tenant's stream.
func Seal(c *cursor.Sealer, tenant string, p outbox.Position) string {
	return c.Seal(api.MethodEventsList, tenant, []byte(p.String()))
}

// Open reads a cursor Seal made for tenant; anything else is ErrBadCursor.
func Open(c *cursor.Sealer, tenant, s string) (outbox.Position, error) {
	raw, err := c.Open(api.MethodEventsList, tenant, s)
	if err != nil {
		return outbox.Position{}, ErrBadCursor
	}
	p, err := outbox.ParsePosition(string(raw))
	if err != nil {
		return outbox.Position{}, ErrBadCursor
	}
	return p, nil
}

// ErrBadCursor is the answer to a cursor events.list or /watch did not hand
// out for the tenant.
var ErrBadCursor = errors.New("events: not a cursor of this tenant's event stream")

// Envelope is the catalog's CloudEvent of an outbox row.
func Envelope(e outbox.CloudEvent) api.CloudEvent {
	return api.CloudEvent{
		Specversion: e.SpecVersion, ID: e.ID, Source: e.Source, Type: e.Type, Subject: e.Subject,
		Time: e.Time, Datacontenttype: e.DataContentType, Data: e.Data, Tenantid: e.TenantID,
	}
}

// List answers events.list.
func (s *Service) List(ctx context.Context, in *api.EventsListInput) (*api.EventPage, error) {
	m, err := ParsePatterns(in.Types)
	if err != nil {
		return nil, err
	}
	var after outbox.Position
	given := in.Cursor != nil
	if given {
		if after, err = Open(s.cursors, in.TenantID, *in.Cursor); err != nil {
			return nil, api.Errorf(api.CodeInvalidInput, "cursor: not a cursor events.list returned for tenant %s", in.TenantID)
		}
	}
	tx, ok := store.TxFromContext(ctx)
	if !ok {
		return nil, errors.New("events: called outside a transaction")
	}
	rows, next, _, err := Read(ctx, db.New(tx), in.TenantID, after, m, int(in.Limit))
	if err != nil {
		return nil, err
	}
	out := &api.EventPage{Items: make([]api.CloudEvent, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, Envelope(r.Event))
	}
	if given || next != after {
		c := Seal(s.cursors, in.TenantID, next)
		out.Cursor = &c
	}
	return out, nil
}
