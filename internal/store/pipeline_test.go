package store_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/db"
	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

// A pipeline of sqlc's statements is one round trip, with the BEGIN and
// the held writes before it; each statement's outcome (no rows included)
// reaches its own function.
func TestPipelineOneRoundTrip(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	var trips atomic.Int64
	ctx := store.CountRoundTrips(t.Context(), &trips)
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		// Held: it goes out first, in the pipeline below.
		if _, err := store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held', 'x')"); err != nil {
			return err
		}
		var p store.Pipeline
		var now time.Time
		var nowErr, poolErr error
		var charged []pgtype.Int4
		var chargedErr error
		p.Queue(func(q *db.Queries) { now, nowErr = q.DatabaseNow(ctx) })
		p.Queue(func(q *db.Queries) { _, poolErr = q.GetPool(ctx, "pool-none") })
		p.Queue(func(q *db.Queries) {
			charged, chargedErr = q.ChargeQuotas(ctx, db.ChargeQuotasParams{TenantID: "t", PoolID: "p", Resources: []string{"gpus", "vcpu"}, Amounts: []int64{1, 1}})
		})
		require.Equal(t, 3, p.Len())
		require.NoError(t, p.Send(ctx, tx))
		assert.EqualValues(t, 1, trips.Load(), "BEGIN, the held write and the pipeline: one round trip")
		require.NoError(t, nowErr)
		assert.WithinDuration(t, time.Now(), now, time.Minute)
		assert.ErrorIs(t, poolErr, pgx.ErrNoRows)
		require.NoError(t, chargedErr)
		assert.Empty(t, charged, "no quota rows: nothing charged")
		// The held write ran before the pipeline, in its transaction.
		var v string
		return tx.QueryRow(ctx, "SELECT value FROM service_meta WHERE key = 'held'").Scan(&v)
	}))
	assert.EqualValues(t, 3, trips.Load(), "the read after the pipeline and the COMMIT")
}

// A statement that fails fails the pipeline (Send's error) and those after
// it; the transaction is rolled back.
func TestPipelineFailure(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	ctx := t.Context()
	var firstErr, secondErr error
	err := s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		var p store.Pipeline
		p.Queue(func(q *db.Queries) { firstErr = q.AdvisoryXactLock(ctx, -1) })
		p.Queue(func(q *db.Queries) { _, secondErr = q.DatabaseNow(ctx) })
		// A failing statement: an attachment of no sandbox or volume.
		p.Queue(func(q *db.Queries) {
			_ = q.InsertAttachment(ctx, db.InsertAttachmentParams{SandboxID: "sbx-none", VolumeID: "vol-none", MountPath: "/m"})
		})
		p.Queue(func(q *db.Queries) { _, secondErr = q.DatabaseNow(ctx) })
		return p.Send(ctx, tx)
	})
	require.Error(t, err)
	assert.NoError(t, firstErr)
	assert.Error(t, secondErr, "the statement after the failed one fails too")
}
