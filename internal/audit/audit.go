// Package audit writes the audit trail: one row per committed mutation, in
// the mutation's own transaction, naming who did what to which resource.
// It never receives inputs or outputs, so it cannot hold secret values.
package audit

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/uow"
)

// OutcomeOK is the outcome of a committed mutation.
const OutcomeOK = "ok"

// Record writes the audit row of call in tx, together with the events the
// call held (its unit of work) in the same statement: one round trip
// before commit. The envelope calls it after the business function
// succeeded.
func Record(ctx context.Context, tx pgx.Tx, call *rpc.Call, u *uow.Unit) error {
	s := iam.SessionFromContext(ctx)
	if s == nil {
		return errors.New("audit: a mutation ran without an authenticated session")
	}
	c := s.Caller
	// The call's last write: it travels with the COMMIT (store.Later).
	return db.New(store.Later(tx)).InsertAuditWithEvents(ctx, db.InsertAuditWithEventsParams{
		TenantID:     s.Resource.TenantID,
		IdentityID:   c.IdentityID,
		IdentityKind: c.IdentityKind,
		AgentID:      text(c.AgentID),
		DelegationID: text(c.DelegationID),
		Method:       call.Method.FullName,
		ResourceType: s.Resource.Type,
		ResourceID:   s.Resource.ID,
		RequestID:    text(call.RequestID),
		Traceparent:  text(call.Traceparent),
		Outcome:      OutcomeOK,
		Events:       u.TakeEvents(),
	})
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }
