package embedded

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/notify"
)

// Inbox event types this service writes.
const (
	EventCredentialRevoked = "credential.revoked"
	// EventRoleChanged says an identity's role in a tenant changed (or
	// was bound for the first time): what it holds open (tunnels) is
	// decided again, and SpiceDB decisions take the new binding.
	EventRoleChanged = "role.changed"
)

// Inbox page bounds.
const (
	defaultInboxLimit = 100
	maxInboxLimit     = 1000
)

// Next returns up to limit events written after the event whose id is
// after (from the first event when after is empty), in the order they
// committed. An id the inbox does not hold is an error: starting over
// silently would hide a lost cursor.
func (s *Service) Next(ctx context.Context, after string, limit int) ([]iam.Event, error) {
	if limit <= 0 {
		limit = defaultInboxLimit
	}
	limit = min(limit, maxInboxLimit)
	q := s.st.Queries()
	var seq int64
	if after != "" {
		var err error
		seq, err = q.IAMEventSeq(ctx, after)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("iam: inbox: unknown event id %q", after)
		}
		if err != nil {
			return nil, unavailable(err)
		}
	}
	rows, err := q.IAMEventsAfter(ctx, db.IAMEventsAfterParams{AfterSeq: seq, MaxRows: int32(limit)})
	if err != nil {
		return nil, unavailable(err)
	}
	out := make([]iam.Event, len(rows))
	for i, r := range rows {
		out[i] = iam.Event{ID: r.EventID, Type: r.Type, IdentityID: r.IdentityID, Session: r.Session, At: r.At}
	}
	return out, nil
}

// writeEvent appends an event in tx, under the inbox lock (see
// inboxLockID).
func (s *Service) writeEvent(ctx context.Context, q *db.Queries, typ, identity, session string) error {
	if err := q.AdvisoryXactLock(ctx, inboxLockID); err != nil {
		return err
	}
	if err := q.IAMInsertEvent(ctx, db.IAMInsertEventParams{
		EventID: newID("iev_"), Type: typ, IdentityID: identity, Session: session, At: s.now(),
	}); err != nil {
		return err
	}
	return wakeInbox(ctx, q)
}

// wakeInbox has every process with a postgres notifier drain the inbox
// at once rather than at its next poll, so that a revocation closes
// streams and tunnels within a second wherever it was made (the
// computed iam command included, which runs no notifier). The NOTIFY is
// in the event's transaction, delivered at its commit: identity events
// are rare, so the commit-time lock NOTIFY takes costs nothing that
// matters here (the notifier keeps it out of mutations for that reason).
func wakeInbox(ctx context.Context, q *db.Queries) error {
	return q.Notify(ctx, db.NotifyParams{Channel: notify.Channel, Topics: []string{iam.TopicInbox}})
}

// RecordEvent appends an event that arrived through the identity service's
// signed webhook, under the inbox lock; recorded is false when an event
// with its id is already in the inbox (a redelivery).
func (s *Service) RecordEvent(ctx context.Context, e iam.Event) (recorded bool, err error) {
	err = s.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		if err := q.AdvisoryXactLock(ctx, inboxLockID); err != nil {
			return err
		}
		n, err := q.IAMInsertEventOnce(ctx, db.IAMInsertEventOnceParams{
			EventID: e.ID, Type: e.Type, IdentityID: e.IdentityID, Session: e.Session, At: e.At,
		})
		recorded = n == 1
		if err != nil || !recorded {
			return err
		}
		return wakeInbox(ctx, q)
	})
	if err != nil {
		return false, unavailable(err)
	}
	return recorded, nil
}
