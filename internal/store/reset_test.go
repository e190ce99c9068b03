package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

// TestServerGoneResetsEveryPool: when the server ends every session (a
// restart, a failover: here pg_terminate_backend), the idle connections of
// the pools are dead but not pinged (idle less than PingAfterIdle). The
// first call that finds its server gone fails UNAVAILABLE and resets every
// pool, the read pool and the write pool alike, so the calls after it
// connect afresh instead of failing once per dead connection.
func TestServerGoneResetsEveryPool(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	s, err := store.Open(t.Context(), url+"&pool_max_conns=4")
	require.NoError(t, err)
	t.Cleanup(s.Close)
	call := func(readOnly bool, held func()) error {
		return s.WithTx(t.Context(), readOnly, func(ctx context.Context, tx pgx.Tx) error {
			var one int
			err := tx.QueryRow(ctx, "select 1").Scan(&one)
			held()
			return err
		})
	}
	// Four connections in each pool, idle: eight calls each hold their
	// connection until all eight hold one.
	var inside, wg sync.WaitGroup
	inside.Add(8)
	for range 4 {
		for _, readOnly := range []bool{false, true} {
			wg.Go(func() { assert.NoError(t, call(readOnly, func() { inside.Done(); inside.Wait() })) })
		}
	}
	wg.Wait()

	admin, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	var ended int
	require.NoError(t, admin.QueryRow(t.Context(), `select count(pg_terminate_backend(pid)) from pg_stat_activity
		where datname = current_database() and pid <> pg_backend_pid()`).Scan(&ended))
	require.Equal(t, 8, ended, "the pools' connections")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(t.Context(), `select count(*) from pg_stat_activity
			where datname = current_database() and pid <> pg_backend_pid()`).Scan(&n))
		return n == 0
	}, 5*time.Second, 10*time.Millisecond)

	var failed []error
	for i := range 8 {
		if err := call(i%2 == 1, func() {}); err != nil {
			assert.True(t, store.Unavailable(err), "a dead connection's call answers as unavailable: %v", err)
			failed = append(failed, err)
		}
	}
	assert.Len(t, failed, 1, "one call finds the server gone, and the pools are reset: %v", failed)
}
