package placement_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/dbtest"
	"computeplane/internal/placement"
	"computeplane/internal/store"
)

// quotaUsed reads a tenant's used per resource in the fleet's pool.
func (f *fleet) quotaUsed(t *testing.T, tenant string) map[string]int64 {
	t.Helper()
	rows, err := f.st.Pool().Query(context.Background(), `select resource, used from quotas where tenant_id = $1 and pool_id = $2`, tenant, f.pool)
	require.NoError(t, err)
	m := map[string]int64{}
	var r string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&r, &n}, func() error { m[r] = n; return nil })
	require.NoError(t, err)
	return m
}

// TestReleaseIsTwoStatements: a release is the booking with its node (one
// statement) and the refund of every resource the admission charged (one
// statement), and in a store transaction one round trip besides the
// COMMIT, which carries the refund; the quota and the node are as before
// the admission; a second release is NOT_FOUND; RefundCount is one
// statement; a refund past what is used still fails (used is never below
// 0) and changes nothing.
func TestReleaseIsTwoStatements(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	f := newFleet(t, st, 1, 8, 8192, map[string]map[string]int64{
		"acme": {"vcpu": 8, "memoryMiB": 8192, "diskGiB": 100, "gpus": 0, "instances": 4, "sandboxes": 4, "nodes": 1},
	})
	conn, statements := dbtest.StatementConn(t, st)
	e := placement.New(placement.Options{})
	ctx := t.Context()
	zero := map[string]int64{"vcpu": 0, "memoryMiB": 0, "diskGiB": 0, "gpus": 0, "instances": 0, "sandboxes": 0, "nodes": 0}
	// onConn runs fn in a transaction of conn, committed when it succeeds,
	// and returns the statements fn sent.
	onConn := func(fn func(tx pgx.Tx) error) (int64, error) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		before := statements.Load()
		err = fn(tx)
		n := statements.Load() - before
		if err != nil {
			require.NoError(t, tx.Rollback(ctx))
			return n, err
		}
		require.NoError(t, tx.Commit(ctx))
		return n, nil
	}
	booked := func() (vcpu, mem, disk int64) {
		require.NoError(t, st.Pool().QueryRow(ctx, `select booked_vcpu, booked_memory_mib, booked_disk_gib from nodes where pool_id = $1`, f.pool).
			Scan(&vcpu, &mem, &disk))
		return
	}
	instance := placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i1"},
		Shape: placement.Shape{VCPU: 2, MemoryMiB: 1024, DiskGiB: 10}, Count: map[string]int64{"instances": 1}}

	b, err := f.admit(ctx, e, instance)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"vcpu": 2, "memoryMiB": 1024, "diskGiB": 10, "gpus": 0, "instances": 1, "sandboxes": 0, "nodes": 0}, f.quotaUsed(t, "acme"))
	n, err := onConn(func(tx pgx.Tx) error { return e.Release(ctx, tx, b.ID, instance.Count) })
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "the booking with its node, then the 4 refunds")
	assert.Equal(t, zero, f.quotaUsed(t, "acme"))
	v, m, d := booked()
	assert.Equal(t, []int64{0, 0, 0}, []int64{v, m, d}, "the node has its room back")
	var released bool
	require.NoError(t, st.Pool().QueryRow(ctx, `select released and upper(during) is not null from bookings where booking_id = $1`, b.ID).Scan(&released))
	assert.True(t, released)

	n, err = onConn(func(tx pgx.Tx) error { return e.Release(ctx, tx, b.ID, instance.Count) })
	assert.Equal(t, api.CodeNotFound, code(err), "a booking is released once")
	assert.Equal(t, int64(1), n)
	assert.Equal(t, zero, f.quotaUsed(t, "acme"), "and refunds nothing the second time")

	// In a store transaction the refund travels with the COMMIT.
	b, err = f.admit(ctx, e, instance)
	require.NoError(t, err)
	var trips atomic.Int64
	require.NoError(t, st.WithTx(store.CountRoundTrips(ctx, &trips), false, func(ctx context.Context, tx pgx.Tx) error {
		return e.Release(ctx, tx, b.ID, instance.Count)
	}))
	assert.EqualValues(t, 2, trips.Load(), "BEGIN with the release, then the refund with the COMMIT")
	assert.Equal(t, zero, f.quotaUsed(t, "acme"))

	// A whole node refunds one node.
	b, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "reservation", ID: "r1"}, Whole: true})
	require.NoError(t, err)
	assert.Equal(t, int64(1), f.quotaUsed(t, "acme")["nodes"])
	require.NoError(t, f.release(ctx, e, b.ID, nil))
	assert.Equal(t, zero, f.quotaUsed(t, "acme"))

	// Counted resources alone: charged and refunded in one statement each.
	count := map[string]int64{"instances": 1, "sandboxes": 2}
	n, err = onConn(func(tx pgx.Tx) error { return e.ChargeCount(ctx, tx, "acme", f.pool, count) })
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	n, err = onConn(func(tx pgx.Tx) error { return e.RefundCount(ctx, tx, "acme", f.pool, count) })
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "2 refunds, one statement")
	assert.Equal(t, zero, f.quotaUsed(t, "acme"))

	// A refund past what is used fails, in the statement or (held) at the
	// COMMIT, and keeps nothing: not even the refunds that fit.
	_, err = onConn(func(tx pgx.Tx) error { return e.ChargeCount(ctx, tx, "acme", f.pool, map[string]int64{"sandboxes": 1}) })
	require.NoError(t, err)
	var pgErr *pgconn.PgError
	_, err = onConn(func(tx pgx.Tx) error {
		return e.RefundCount(ctx, tx, "acme", f.pool, map[string]int64{"instances": 1, "sandboxes": 1})
	})
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "quotas_used_within_max", pgErr.ConstraintName)
	err = st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return e.RefundCount(ctx, tx, "acme", f.pool, map[string]int64{"instances": 1, "sandboxes": 1})
	})
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "quotas_used_within_max", pgErr.ConstraintName)
	assert.Equal(t, int64(1), f.quotaUsed(t, "acme")["sandboxes"])
	assert.Equal(t, int64(0), f.quotaUsed(t, "acme")["instances"])
}

// TestChargeAndReleaseRace: an admission's charge and a release's refund
// of the same tenant's quota rows, one waiting for the other in both
// orders, then many of each at once on the same rows: none deadlocks (the
// two statements lock the rows in the order of placement.Resources) or
// fails, and no update is lost: used is what the live bookings hold.
func TestChargeAndReleaseRace(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	f := newFleet(t, st, 8, 64, 1<<20, map[string]map[string]int64{
		"acme": {"vcpu": 1000, "memoryMiB": 1 << 30, "diskGiB": 100000, "instances": 1000},
	})
	e := placement.New(placement.Options{})
	ctx := t.Context()
	// on pins the two transactions of each order to different nodes, so
	// that what the second waits for is the quota rows.
	on := func(r placement.Request, node int) placement.Request {
		r.NodeID = fmt.Sprintf("%s-%05d", f.pool, node)
		return r
	}
	req := func(vcpu int32) placement.Request {
		return placement.Request{TenantID: "acme", PoolID: f.pool, Owner: placement.Owner{Type: "instance", ID: "i"},
			Shape: placement.Shape{VCPU: vcpu, MemoryMiB: 256 * int64(vcpu), DiskGiB: int64(vcpu)}, Count: map[string]int64{"instances": 1}}
	}
	want := func(vcpus ...int32) map[string]int64 {
		m := map[string]int64{"vcpu": 0, "memoryMiB": 0, "diskGiB": 0, "instances": 0}
		for _, v := range vcpus {
			m["vcpu"] += int64(v)
			m["memoryMiB"] += 256 * int64(v)
			m["diskGiB"] += int64(v)
			m["instances"]++
		}
		return m
	}
	// waiting is how many backends of the test's database wait for a lock.
	waiting := func() int {
		var n int
		require.NoError(t, st.Pool().QueryRow(ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock'`).Scan(&n))
		return n
	}
	// first runs do in a transaction it keeps open, then then in another
	// transaction, which must wait for the first's locks; the first
	// commits once the second waits, and the second must then finish.
	first := func(do, then func(tx pgx.Tx) error) {
		held, err := st.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = held.Rollback(ctx) }()
		require.NoError(t, do(held))
		done := make(chan error, 1)
		go func() {
			done <- func() error {
				tx, err := st.Pool().Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if err := then(tx); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}()
		}()
		require.Eventually(t, func() bool { return waiting() > 0 }, 10*time.Second, 5*time.Millisecond, "the second waits for the first's rows")
		require.NoError(t, held.Commit(ctx))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the second transaction did not finish after the first committed")
		}
	}

	b1, err := f.admit(ctx, e, on(req(2), 1))
	require.NoError(t, err)
	// The charge holds the rows; the release's refund waits for them.
	first(func(tx pgx.Tx) error { _, err := e.Admit(ctx, tx, on(req(3), 2)); return err },
		func(tx pgx.Tx) error { return e.Release(ctx, tx, b1.ID, map[string]int64{"instances": 1}) })
	assert.Equal(t, want(3), f.quotaUsed(t, "acme"), "the charge and the refund both kept")

	b2, err := f.admit(ctx, e, on(req(4), 1))
	require.NoError(t, err)
	// The refund holds the rows; the charge waits for them.
	first(func(tx pgx.Tx) error { return e.Release(ctx, tx, b2.ID, map[string]int64{"instances": 1}) },
		func(tx pgx.Tx) error { _, err := e.Admit(ctx, tx, on(req(5), 2)); return err })
	assert.Equal(t, want(3, 5), f.quotaUsed(t, "acme"), "the refund and the charge both kept")

	// Many at once: each worker admits and releases, keeping every third
	// booking; the rows are those of one tenant and pool throughout.
	const workers, rounds = 8, 30
	var mu sync.Mutex
	kept := []int32{3, 5}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				vcpu := int32(1 + (w+i)%3)
				b, err := f.admit(ctx, e, req(vcpu))
				if !assert.NoError(t, err) {
					return
				}
				if i%3 == 0 {
					mu.Lock()
					kept = append(kept, vcpu)
					mu.Unlock()
					continue
				}
				if !assert.NoError(t, f.release(ctx, e, b.ID, map[string]int64{"instances": 1})) {
					return
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, want(kept...), f.quotaUsed(t, "acme"))
	f.checkInvariants(t)
}
