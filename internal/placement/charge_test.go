package placement_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/dbtest"
	"computeplane/internal/placement"
)

// TestChargesAreOneStatement: an admission's charges (here the 4 of an
// instance: diskGiB, instances, memoryMiB, vcpu) go to the database as one
// statement, and a refusal still names the first resource refused in the
// order of placement.Resources, with what the spec's QUOTA_EXCEEDED
// details carry, after one more statement (its explanation); nothing of a
// refused charge is kept once the transaction is rolled back.
func TestChargesAreOneStatement(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	f := newFleet(t, st, 1, 4, 4096, map[string]map[string]int64{
		"acme": {"vcpu": 2, "memoryMiB": 1024, "diskGiB": 10, "instances": 1},
	})
	conn, statements := dbtest.StatementConn(t, st)
	e := placement.New(placement.Options{})
	ctx := t.Context()
	used := func() map[string]int64 {
		rows, err := st.Pool().Query(ctx, `select resource, used from quotas where tenant_id = 'acme' and pool_id = $1`, f.pool)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv struct {
			R string
			N int64
		}, err error) {
			err = r.Scan(&kv.R, &kv.N)
			return kv, err
		})
		require.NoError(t, err)
		m := map[string]int64{}
		for _, kv := range out {
			m[kv.R] = kv.N
		}
		return m
	}
	// charge runs ChargeCount in a transaction of its own on conn, committed
	// when it succeeds, and returns the statements it sent.
	charge := func(count map[string]int64) (int64, error) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		before := statements.Load()
		err = e.ChargeCount(ctx, tx, "acme", f.pool, count)
		n := statements.Load() - before
		if err != nil {
			require.NoError(t, tx.Rollback(ctx))
			return n, err
		}
		require.NoError(t, tx.Commit(ctx))
		return n, nil
	}
	details := func(err error) map[string]any {
		var e *api.Error
		require.True(t, errors.As(err, &e), "%v", err)
		assert.Equal(t, api.CodeQuotaExceeded, e.Code)
		return e.Details
	}

	n, err := charge(map[string]int64{"vcpu": 1, "memoryMiB": 512, "diskGiB": 1, "instances": 1})
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "4 charges, one statement")
	assert.Equal(t, map[string]int64{"vcpu": 1, "memoryMiB": 512, "diskGiB": 1, "instances": 1}, used())

	// instances (1 of 1) and memoryMiB (512 + 1024 > 1024) are both spent:
	// instances comes first in Resources, so it is named.
	n, err = charge(map[string]int64{"vcpu": 1, "memoryMiB": 1024, "diskGiB": 1, "instances": 1})
	assert.Equal(t, int64(2), n, "the charges, then the refusal's explanation")
	assert.Equal(t, map[string]any{"resource": "instances", "requested": int64(1), "max": int64(1), "used": int64(1)}, details(err))
	assert.Contains(t, err.Error(), "instances quota of tenant acme in pool "+f.pool+" is spent: 1 of 1 used, 1 more asked")
	assert.Equal(t, map[string]int64{"vcpu": 1, "memoryMiB": 512, "diskGiB": 1, "instances": 1}, used(), "a refusal keeps nothing")

	// Only memoryMiB spent: the later vcpu charge, which fits, is not kept.
	_, err = charge(map[string]int64{"vcpu": 1, "memoryMiB": 1024})
	assert.Equal(t, "memoryMiB", details(err)["resource"])
	assert.Equal(t, map[string]int64{"vcpu": 1, "memoryMiB": 512, "diskGiB": 1, "instances": 1}, used())

	// No row grants nothing; a pool no longer offered is said so.
	_, err = charge(map[string]int64{"gpus": 1, "vcpu": 1})
	assert.Equal(t, map[string]any{"resource": "gpus", "requested": int64(1), "max": 0, "used": 0}, details(err))
	assert.Contains(t, err.Error(), "tenant acme has no gpus quota in pool "+f.pool)
	_, err = st.Pool().Exec(ctx, `update quotas set offered = false where tenant_id = 'acme' and pool_id = $1 and resource = 'vcpu'`, f.pool)
	require.NoError(t, err)
	_, err = charge(map[string]int64{"diskGiB": 1, "vcpu": 1})
	assert.Equal(t, "vcpu", details(err)["resource"])
	assert.Contains(t, err.Error(), "pool "+f.pool+" is no longer offered to tenant acme")
	assert.Equal(t, map[string]int64{"vcpu": 1, "memoryMiB": 512, "diskGiB": 1, "instances": 1}, used())
}
