package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

// The BEGIN of a transaction travels with its first statement; whichever
// way that statement is sent, the transaction behaves like pgx's own.
func TestLazyTransactionFirstStatementForms(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	ctx := t.Context()
	forms := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('exec', 'x')")
			return err
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			var k string
			return tx.QueryRow(ctx, "INSERT INTO service_meta (key, value) VALUES ('row', 'x') RETURNING key").Scan(&k)
		},
		"Query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "INSERT INTO service_meta (key, value) VALUES ('rows', 'x') RETURNING key")
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO service_meta (key, value) VALUES ('batch', 'x')")
			return tx.SendBatch(ctx, b).Close()
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"service_meta"}, []string{"key", "value"}, pgx.CopyFromRows([][]any{{"copy", "x"}}))
			return err
		},
	}
	for name, first := range forms {
		// Rolled back after an error: nothing stays.
		boom := errors.New("boom")
		err := s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
			require.NoError(t, first(ctx, tx), name)
			return boom
		})
		require.ErrorIs(t, err, boom, name)
		// Committed: it stays, and a second statement shares the transaction.
		require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
			if err := first(ctx, tx); err != nil {
				return err
			}
			var one int
			return tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		}), name)
	}
	var n int
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*) FROM service_meta").Scan(&n))
	assert.Equal(t, len(forms), n, "one committed row per form, none from the rolled-back ones")
}

func TestLazyTransactionIsOneTransaction(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	ctx := t.Context()
	var pids []int64
	require.NoError(t, s.WithTx(ctx, true, func(ctx context.Context, tx pgx.Tx) error {
		for range 3 {
			var x int64
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&x); err != nil {
				return err
			}
			pids = append(pids, x)
		}
		var ro string
		if err := tx.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
			return err
		}
		assert.Equal(t, "on", ro)
		var iso string
		if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
			return err
		}
		assert.Equal(t, "read committed", iso)
		return nil
	}))
	assert.Equal(t, pids[0], pids[1], "one connection")
	assert.Equal(t, pids[0], pids[2])

	// A snapshot-sensitive check: within one READ WRITE transaction, the
	// transaction start time holds for every statement.
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		var a, b string
		if err := tx.QueryRow(ctx, "SELECT now()::text").Scan(&a); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT pg_sleep(0.01), now()::text").Scan(new(any), &b); err != nil {
			return err
		}
		assert.Equal(t, a, b, "now() is the transaction's start: both statements ran in it")
		return nil
	}))
}

func TestLazyTransactionFailedFirstStatement(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	ctx := t.Context()
	err := s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		var x int
		return tx.QueryRow(ctx, "SELECT 1/0").Scan(&x)
	})
	require.ErrorContains(t, err, "division by zero")
	// A failed statement whose error is ignored makes COMMIT a rollback.
	err = s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('k', 'v')")
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return nil
	})
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	var n int
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*) FROM service_meta").Scan(&n))
	assert.Zero(t, n)
	// No connection is left inside a transaction.
	require.NoError(t, s.Pool().QueryRow(ctx,
		"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'").Scan(&n))
	assert.Zero(t, n)
}

func TestLazyTransactionWithoutStatementsSendsNothing(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	require.NoError(t, s.WithTx(t.Context(), false, func(context.Context, pgx.Tx) error { return nil }))
	boom := errors.New("boom")
	require.ErrorIs(t, s.WithTx(t.Context(), false, func(context.Context, pgx.Tx) error { return boom }), boom)
}

// A held write (store.Later) travels with the next statement, which sees
// it, or with the COMMIT; one that fails there fails the commit, and the
// transaction is rolled back on a connection that stays usable.
func TestLaterWritesTravelWithTheNextStatement(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	var trips atomic.Int64
	ctx := store.CountRoundTrips(t.Context(), &trips)
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held-1', 'x')"); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM service_meta WHERE key = 'held-1'").Scan(&n); err != nil {
			return err
		}
		assert.Equal(t, 1, n, "the read after a held write sees it")
		_, err := store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held-2', 'x')")
		return err
	}))
	assert.Equal(t, int64(2), trips.Load(), "BEGIN, the held write and the read; then the held write and COMMIT")
	var n int
	require.NoError(t, s.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta WHERE key LIKE 'held-%'").Scan(&n))
	assert.Equal(t, 2, n)

	// A held write that fails at commit: nothing of the transaction stays.
	err := s.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held-3', 'x')"); err != nil {
			return err
		}
		_, err := store.Later(tx).Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('held-1', 'duplicate')")
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "23505", pgErr.Code, "the held write's own error")
	require.NoError(t, s.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta WHERE key = 'held-3'").Scan(&n))
	assert.Zero(t, n, "rolled back")
	for range 5 { // every connection of the pool is still usable
		require.NoError(t, s.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT 1").Scan(&n)
		}))
	}
}

// Savepoints are held like writes: a rolled-back one undoes what ran in
// it, a released one keeps it, and neither costs a round trip of its own.
func TestLazySavepoints(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	var trips atomic.Int64
	ctx := store.CountRoundTrips(t.Context(), &trips)
	insert := func(ctx context.Context, tx pgx.Tx, key string) error {
		_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ($1, 'x')", key)
		return err
	}
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, insert(ctx, sp, "sp-undone"))
		require.NoError(t, sp.Rollback(ctx))
		sp, err = tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, insert(ctx, sp, "sp-kept"))
		require.Error(t, insert(ctx, sp, "sp-kept"), "a duplicate fails inside the savepoint")
		require.NoError(t, sp.Rollback(ctx))
		sp, err = tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, insert(ctx, sp, "sp-kept"))
		return sp.Commit(ctx)
	}))
	assert.Equal(t, int64(7), trips.Load(), "four inserts, two rollbacks and the COMMIT")
	var keys []string
	rows, err := s.Pool().Query(t.Context(), "SELECT key FROM service_meta WHERE key LIKE 'sp-%' ORDER BY key")
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"sp-kept"}, keys)
}

// A held write that answers with a row (LaterRow) travels with the
// COMMIT, costs no round trip of its own, and its answer is read by the
// time the commit returned; a failing one fails the commit.
func TestLaterRowAnswersWithTheCommit(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	var trips atomic.Int64
	ctx := store.CountRoundTrips(t.Context(), &trips)
	var key string
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('first', 'x')")
		require.NoError(t, err)
		require.NoError(t, store.LaterRow(ctx, tx, func(r pgx.Row) error { return r.Scan(&key) },
			"INSERT INTO service_meta (key, value) VALUES ($1, 'x') RETURNING key || '!'", "held"))
		assert.Empty(t, key, "held until the commit")
		return nil
	}))
	assert.Equal(t, "held!", key)
	assert.Equal(t, int64(2), trips.Load(), "BEGIN with the first statement, then the held write with the COMMIT")

	err := s.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return store.LaterRow(ctx, tx, func(r pgx.Row) error { return r.Scan(&key) },
			"INSERT INTO service_meta (key, value) VALUES ('held', 'again') RETURNING key")
	})
	require.Error(t, err, "a duplicate key fails the commit")
	var n int
	require.NoError(t, s.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta WHERE key IN ('first', 'held')").Scan(&n))
	assert.Equal(t, 2, n)
}
