package placement_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/placement"
	"computeplane/internal/workers"
)

func (f *fleet) enqueue(t *testing.T, e *placement.Engine, req placement.Request) string {
	t.Helper()
	req.PoolID = f.pool
	var id string
	require.NoError(t, f.st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		id, err = e.Enqueue(ctx, tx, req)
		return err
	}))
	return id
}

func (f *fleet) item(t *testing.T, id string) *placement.Item {
	t.Helper()
	it, err := placement.GetItem(t.Context(), f.st.Queries(), id)
	require.NoError(t, err)
	return it
}

func TestPlaceBatch(t *testing.T) {
	t.Parallel()
	f := newFleet(t, dbtest.NewStore(t), 1, 4, 4096, map[string]map[string]int64{"acme": {"vcpu": 100, "memoryMiB": 1 << 20}, "poor": {"vcpu": 1}})
	e := placement.New(placement.Options{Attempts: 2})
	fits := f.enqueue(t, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "t", ID: "1"}, Shape: placement.Shape{VCPU: 3, MemoryMiB: 1}})
	noRoom := f.enqueue(t, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "t", ID: "2"}, Shape: placement.Shape{VCPU: 3, MemoryMiB: 1}})
	noQuota := f.enqueue(t, e, placement.Request{TenantID: "poor", Owner: placement.Owner{Type: "t", ID: "3"}, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}})
	assert.Equal(t, placement.ItemQueued, f.item(t, fits).State)

	batch := func() int {
		var n int
		require.NoError(t, f.st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
			n, err = e.PlaceBatch(ctx, tx, f.pool, 64)
			return err
		}))
		return n
	}
	assert.Equal(t, 3, batch())
	placed := f.item(t, fits)
	assert.Equal(t, placement.ItemPlaced, placed.State)
	assert.NotEmpty(t, placed.BookingID)
	assert.Equal(t, f.pool+"-00001", placed.NodeID)
	waiting := f.item(t, noRoom)
	assert.Equal(t, placement.ItemQueued, waiting.State, "no room: tried again next batch")
	assert.Equal(t, int32(1), waiting.Attempts)
	failed := f.item(t, noQuota)
	assert.Equal(t, placement.ItemFailed, failed.State, "a spent quota fails at once")
	assert.Equal(t, api.CodeQuotaExceeded, failed.Error.Code)

	assert.Equal(t, 1, batch(), "only the waiting item is left")
	waiting = f.item(t, noRoom)
	assert.Equal(t, placement.ItemFailed, waiting.State, "capacity.maxAttempts spent")
	assert.Equal(t, api.CodeCapacityUnavailable, waiting.Error.Code)
	assert.Equal(t, 0, batch())
	f.checkInvariants(t)
}

// TestQueueReconciler: with the pool-lease placer a worker holding the
// pool's shard places what admissions queue.
func TestQueueReconciler(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	f := newFleet(t, st, 50, 8, 16384, map[string]map[string]int64{"acme": {"vcpu": 1000, "memoryMiB": 1 << 30}})
	e := placement.New(placement.Options{})
	runner := workers.New(st, workers.Options{Workers: config.Workers{ResyncMs: 1000, PollMs: 100}, Timing: workers.Timing{
		LeaseTTL: 3 * time.Second, Renew: time.Second, Liveness: 6 * time.Second, SyncAgain: 50 * time.Millisecond,
	}})
	runner.RegisterReconciler(placement.ReconcilerName, &placement.Queue{Engine: e, Store: st, MaxBatch: 16,
		WithTx: func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
			return st.WithTx(ctx, false, fn)
		}})
	ids := make([]string, 0, 100)
	for range 100 {
		ids = append(ids, f.enqueue(t, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "t", ID: "x"}, Shape: placement.Shape{VCPU: 1, MemoryMiB: 128}}))
	}
	require.NoError(t, runner.Start(t.Context()))
	defer func() { _ = runner.Stop(context.Background()) }()
	runner.Enqueue(placement.ReconcilerName, f.pool) // as an admission's AfterCommit would
	require.Eventually(t, func() bool {
		var queued int
		require.NoError(t, st.Pool().QueryRow(t.Context(), `select count(*) from placement_queue where state = 'queued'`).Scan(&queued))
		return queued == 0
	}, 20*time.Second, 50*time.Millisecond)
	for _, id := range ids {
		assert.Equal(t, placement.ItemPlaced, f.item(t, id).State)
	}
	f.checkInvariants(t)
}
