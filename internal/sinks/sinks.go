// Package sinks dispatches committed rows to the configured event and audit
// sinks, at least once each: events sinks receive every outbox row as a
// CloudEvent, audit sinks every audit_log row, each sink from its own
// durable cursor (sink_cursors, keyed by kind and id). A batch is read after
// the cursor from finished transactions only, sent, and only then is the
// cursor advanced, in a transaction that first runs the caller's lease
// fence, so a process that lost its lease cannot move it. A batch the sink
// keeps refusing becomes dead letters (sink_dead_letters) and the cursor
// moves past it. docs/events.md describes the sinks an operator configures.
package sinks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Kinds of sinks: what they receive. A sink id is unique within its kind.
const (
	KindEvents = "events"
	KindAudit  = "audit"
)

// Record is one row as a sink receives it.
type Record struct {
	// ID is the outbox event id (evt_...) or the audit row id.
	ID string
	// Body is the row's JSON: a CloudEvent for events sinks, an AuditRecord
	// for audit sinks.
	Body json.RawMessage
}

// Sink is a destination of committed rows. A message-broker sink joins by
// implementing it.
type Sink interface {
	// ID names the sink among those of its kind; with Kind it keys the
	// durable cursor.
	ID() string
	// Kind is KindEvents or KindAudit.
	Kind() string
	// Send delivers a batch, in order, or fails as a whole; the dispatcher
	// retries a failed batch, except after an error wrapping ErrPermanent.
	// A sink may see a batch again after a crash (at least once):
	// consumers deduplicate on Record.ID.
	Send(ctx context.Context, batch []Record) error
}

// ErrPermanent marks a Send failure that retrying cannot cure (a receiver
// answering 400): the batch becomes dead letters at once.
var ErrPermanent = errors.New("sinks: permanent failure")

// Permanent wraps err as a permanent failure.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// AuditRecord is the JSON of an audit row as audit sinks receive it.
type AuditRecord struct {
	ID           int64   `json:"id"`
	At           string  `json:"at"`
	TenantID     string  `json:"tenantId"`
	IdentityID   string  `json:"identityId"`
	IdentityKind string  `json:"identityKind"`
	AgentID      *string `json:"agentId,omitempty"`
	DelegationID *string `json:"delegationId,omitempty"`
	Method       string  `json:"method"`
	ResourceType string  `json:"resourceType"`
	ResourceID   string  `json:"resourceId"`
	RequestID    string  `json:"requestId"`
	Traceparent  *string `json:"traceparent,omitempty"`
	Outcome      string  `json:"outcome"`
}

// batchJSON is a batch as one JSON array of its bodies, in order.
func batchJSON(batch []Record) []byte {
	n := 2
	for _, r := range batch {
		n += len(r.Body) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for i, r := range batch {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, r.Body...)
	}
	return append(out, ']')
}
