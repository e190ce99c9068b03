package embedded

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/store"
)

// QueueDraftRequire decides a create at the head of its transaction, in
// the transaction's first round trip, as PutDraftRequire decides it after
// a round trip of its own: the owner admitted, a viewer refused (the draft
// gone with the rollback), a retry finding the real resource, and a
// target it cannot know without reading left to the pool.
func TestQueueDraftRequireAtTheHead(t *testing.T) {
	s, st, _ := newTestService(t)
	ctx := context.Background()
	owner := mustCaller(t, s, KeyRequest{Tenant: "acme", Identity: "olga", Role: RoleOwner})
	viewer := mustCaller(t, s, KeyRequest{Tenant: "acme", Identity: "vic", Role: RoleViewer})
	const action = "compute:pools:manage"
	tenant := iam.Resource{Type: "compute-tenant", ID: "acme", TenantID: "acme"}
	draft := func(id, owner string) iam.Resource {
		return iam.Resource{Type: "compute-pool", ID: id, TenantID: "acme", Owner: owner, Draft: true}
	}
	// decide runs a transaction with the head and one statement of its
	// own, committed when admitted, and answers the outcome.
	decide := func(c *iam.Caller, d iam.Resource) (iam.DraftOutcome, error) {
		h := &store.Head{}
		outcome, ok := s.QueueDraftRequire(&h.Pipeline, d, c, action, tenant)
		require.True(t, ok)
		var out iam.DraftOutcome
		var outErr error
		h.Check = func(ctx context.Context) error {
			out, outErr = outcome(ctx)
			if outErr == nil && out.Refusal != nil {
				return out.Refusal
			}
			return outErr
		}
		var trips atomic.Int64
		tctx := store.WithHead(store.CountRoundTrips(ctx, &trips), h)
		_ = st.WithTx(tctx, false, func(ctx context.Context, tx pgx.Tx) error {
			var one int
			if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				return err
			}
			assert.EqualValues(t, 1, trips.Load(), "BEGIN, the head and the first statement")
			return nil
		})
		return out, outErr
	}
	row := func(id string) (db.IamResource, error) {
		return st.Queries().IAMGetResource(ctx, db.IAMGetResourceParams{Type: "compute-pool", ID: id})
	}

	out, err := decide(viewer, draft("pool-v", "vic"))
	require.NoError(t, err)
	assert.True(t, out.Drafted)
	require.ErrorIs(t, out.Refusal, iam.ErrDenied, "a viewer does not create")
	_, err = row("pool-v")
	require.ErrorIs(t, err, pgx.ErrNoRows, "the refused draft went with the rollback")

	out, err = decide(owner, draft("pool-o", "olga"))
	require.NoError(t, err)
	assert.True(t, out.Drafted)
	require.NoError(t, out.Refusal)
	r, err := row("pool-o")
	require.NoError(t, err)
	assert.True(t, r.Draft, "committed as the draft the method would make real")

	// The method made it real: a retry finds it and is not decided.
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		real := draft("pool-o", "olga")
		real.Draft = false
		return s.Projection().Put(ctx, tx, real)
	}))
	out, err = decide(owner, draft("pool-o", "olga"))
	require.NoError(t, err)
	assert.False(t, out.Drafted)
	require.NotNil(t, out.Existing)
	assert.Equal(t, "olga", out.Existing.Owner)
	assert.False(t, out.Existing.Draft)

	// A pool's decision reads the pool: not at the head.
	pool := iam.Resource{Type: "compute-pool", ID: "pool-o", TenantID: "acme"}
	var p store.Pipeline
	_, ok := s.QueueDraftRequire(&p, iam.Resource{Type: "compute-sandbox-volume", ID: "vol-1", TenantID: "acme", Owner: "olga", Draft: true,
		Parent: &iam.Ref{Type: pool.Type, ID: pool.ID}}, owner, action, pool)
	assert.False(t, ok)
	assert.Zero(t, p.Len(), "nothing queued")
}
