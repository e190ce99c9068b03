package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/db"
	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

// head is a Head reading the database's time, whose Check answers err
// and records that it saw the head's result.
func head(ctx context.Context, err error) (*store.Head, *atomic.Int32) {
	h := &store.Head{}
	var now time.Time
	var checked atomic.Int32
	h.Queue(func(q *db.Queries) { now, _ = q.DatabaseNow(ctx) })
	h.Check = func(context.Context) error {
		if !now.IsZero() {
			checked.Add(1)
		}
		return err
	}
	return h, &checked
}

func metaRows(t *testing.T, s *store.Store, key string) (n int) {
	require.NoError(t, s.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta WHERE key = $1", key).Scan(&n))
	return n
}

// A head goes out after BEGIN with the transaction's first statement, in
// its round trip, and is checked before that statement's result is read;
// a transaction begun later in the same call does not run it again.
func TestHeadTravelsWithTheFirstStatement(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	var trips atomic.Int64
	ctx := store.CountRoundTrips(t.Context(), &trips)
	h, checked := head(ctx, nil)
	ctx = store.WithHead(ctx, h)
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('after-head', 'x')")
		require.NoError(t, err)
		assert.EqualValues(t, 1, trips.Load(), "BEGIN, the head and the statement: one round trip")
		assert.EqualValues(t, 1, checked.Load(), "checked on the head's result")
		return s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		})
	}))
	assert.EqualValues(t, 1, checked.Load(), "run once")
	assert.Equal(t, 1, metaRows(t, s, "after-head"))
}

// A refused head fails the transaction: the statements sent with it ran
// and are rolled back, every later statement answers the refusal, and so
// does the commit of a function that went on regardless.
func TestHeadRefusalRollsBack(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	refused := errors.New("refused")
	h, checked := head(t.Context(), refused)
	err := s.WithTx(store.WithHead(t.Context(), h), false, func(ctx context.Context, tx pgx.Tx) error {
		var key string
		err := tx.QueryRow(ctx, "INSERT INTO service_meta (key, value) VALUES ('speculative', 'x') RETURNING key").Scan(&key)
		require.ErrorIs(t, err, refused)
		_, err = tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('later', 'x')")
		require.ErrorIs(t, err, refused)
		_, err = store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held', 'x')")
		require.NoError(t, err)
		return nil // a function that swallowed the refusal still commits nothing
	})
	require.ErrorIs(t, err, refused)
	assert.EqualValues(t, 1, checked.Load())
	for _, k := range []string{"speculative", "later", "held"} {
		assert.Zero(t, metaRows(t, s, k), k)
	}
	// The connection went back clean: the pool serves the next call.
	require.NoError(t, s.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('next', 'x')")
		return err
	}))
	assert.Equal(t, 1, metaRows(t, s, "next"))
}

// A function that sends nothing before its commit (only held writes, or
// nothing at all) still has its head checked, before anything commits.
func TestHeadCheckedBeforeTheCommit(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	refused := errors.New("refused")
	h, checked := head(t.Context(), refused)
	err := s.WithTx(store.WithHead(t.Context(), h), false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held-only', 'x')")
		return err
	})
	require.ErrorIs(t, err, refused)
	assert.EqualValues(t, 1, checked.Load())
	assert.Zero(t, metaRows(t, s, "held-only"))

	h, checked = head(t.Context(), refused)
	err = s.WithTx(store.WithHead(t.Context(), h), false, func(context.Context, pgx.Tx) error { return nil })
	require.ErrorIs(t, err, refused, "a transaction that ran nothing answers its head too")
	assert.EqualValues(t, 1, checked.Load())

	h, checked = head(t.Context(), nil)
	require.NoError(t, s.WithTx(store.WithHead(t.Context(), h), false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held-admitted', 'x')")
		return err
	}))
	assert.EqualValues(t, 1, checked.Load())
	assert.Equal(t, 1, metaRows(t, s, "held-admitted"))
}
