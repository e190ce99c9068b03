package embedded

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/store"
)

// QueueDraftRequire implements iam.HeadDrafter: the draft and the caller's
// role in its own tenant are queued on p, which the gate puts at the head
// of the call's transaction (store.Head), and outcome decides once their
// results came, as PutDraftRequire does after its own round trip.
//
// The draft is then written in the call's transaction: no other call sees
// it before the commit, which makes it real (MakeReal), and a rollback
// (a refusal, a failed create) leaves none, so nothing needs dropping and
// the sweep has none to find. What a draft still does there: it takes the
// derived id's row first, so a concurrent create with the same key waits
// on it and then finds the real resource (a replay), and it is what the
// decision resolves the new object to.
func (s *Service) QueueDraftRequire(p *store.Pipeline, draft iam.Resource, c *iam.Caller, action string, target iam.Resource) (func(ctx context.Context) (iam.DraftOutcome, error), bool) {
	// The target must be known without reading it (the tenant, the draft,
	// the fleet): a create decided on another object (a sandbox volume on
	// its pool) is admitted before its transaction, as without a head.
	inDraft := context.WithValue(context.Background(), writtenDraftKey{}, draft)
	t, err := s.resolve(inDraft, db.New(noReads{}), target)
	if target.Type != s.prefix+"fleet" && err != nil {
		return nil, false
	}
	arg, err := s.resourceParams(draft)
	if err != nil {
		return func(context.Context) (iam.DraftOutcome, error) { return iam.DraftOutcome{}, err }, true
	}
	var n int64
	var putErr error
	p.Queue(func(q *db.Queries) { n, putErr = q.IAMPutDraft(context.Background(), db.IAMPutDraftParams(arg)) })
	read := c != nil && c.IdentityID != "" && c.TenantID != ""
	var role string
	var roleErr error
	if read {
		p.Queue(func(q *db.Queries) {
			role, roleErr = q.IAMGetRole(context.Background(), db.IAMGetRoleParams{TenantID: c.TenantID, IdentityID: c.IdentityID})
		})
	}
	// A caller without a role in the tenant may still change what is in a
	// project it is a member of: the refusal's last read, queued too when
	// the target is known without reading (the tenant, the draft).
	var member readMember
	if read && target.Type != s.prefix+"fleet" && t.id != "" && t.parentType != "" {
		member.arg = s.memberParams(c, t, false)
		p.Queue(func(q *db.Queries) { member.ok, member.err = q.IAMProjectMember(context.Background(), member.arg) })
	}
	// A retry finds the real resource instead of writing the draft: it is
	// read in the same pipeline (after the draft's write, which waits for
	// a concurrent create of the same id to end).
	var row db.IamResource
	var getErr error
	p.Queue(func(q *db.Queries) {
		row, getErr = q.IAMGetResource(context.Background(), db.IAMGetResourceParams{Type: draft.Type, ID: draft.ID})
	})
	return func(ctx context.Context) (iam.DraftOutcome, error) {
		if putErr != nil {
			return iam.DraftOutcome{}, wrapStore(putErr)
		}
		if n == 0 {
			if getErr != nil || row.Draft { // gone again: undecided
				return iam.DraftOutcome{}, nil
			}
			existing, err := resourceOf(row)
			return iam.DraftOutcome{Existing: existing}, err
		}
		if read {
			ctx = context.WithValue(ctx, readRoleKey{}, readRole{tenant: c.TenantID, identity: c.IdentityID, name: role, err: roleErr})
		}
		// The decision is made on what the head read, and the draft as
		// written; it reads nothing more while the transaction's pipeline
		// is open (noReads), and one that would is made the old way.
		ctx = context.WithValue(ctx, writtenDraftKey{}, draft)
		if member.arg.TenantID != "" {
			ctx = context.WithValue(ctx, readMemberKey{}, member)
		}
		ctx = context.WithValue(ctx, noReadsKey{}, true)
		refusal := s.decide(ctx, c, action, target)
		if errors.Is(refusal, iam.ErrNeedsReads) {
			return iam.DraftOutcome{}, iam.ErrNeedsReads
		}
		return iam.DraftOutcome{Drafted: true, Refusal: refusal}, nil
	}, true
}

// readMember is a project membership read in the head of the decision
// that uses it.
type readMember struct {
	arg db.IAMProjectMemberParams
	ok  bool
	err error
}

type readMemberKey struct{}

// writtenDraftKey carries the draft the decision's pipeline wrote: resolve
// takes it as the projection would answer, without reading it back.
type writtenDraftKey struct{}

// noReadsKey marks a decision made inside a transaction's pipeline.
type noReadsKey struct{}

// queries is what a decision reads with: the pool, or nothing when it is
// made on a head's results (a read then answers iam.ErrNeedsReads).
func (s *Service) queries(ctx context.Context) *db.Queries {
	if ctx.Value(noReadsKey{}) != nil {
		return db.New(noReads{})
	}
	return s.st.Queries()
}

// noReads refuses every statement: see queries.
type noReads struct{}

func (noReads) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, iam.ErrNeedsReads
}

func (noReads) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, iam.ErrNeedsReads
}

func (noReads) QueryRow(context.Context, string, ...any) pgx.Row { return noRow{} }

func (noReads) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	return pgx.FailedBatchResults(b, iam.ErrNeedsReads)
}

type noRow struct{}

func (noRow) Scan(...any) error { return iam.ErrNeedsReads }
