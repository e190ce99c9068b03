package placement_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/dbtest"
	"computeplane/internal/placement"
	"computeplane/internal/store"
)

// admitPipelined admits a flavor's shape as instances.create does: the
// candidates read with the caller's first reads, the booking, charges and
// the caller's statement (here a count of the booked node's live bookings,
// which sees the booking) in one pipeline.
func (f *fleet) admitPipelined(ctx context.Context, e *placement.Engine, flavor string, req placement.Request) (b *placement.Booking, seen int64, thens int, err error) {
	req.PoolID = f.pool
	err = f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		var p store.Pipeline
		first := e.QueueCandidates(ctx, &p, f.pool, flavor, "")
		if err := p.Send(ctx, tx); err != nil {
			return err
		}
		var seenErr error
		b, err = e.AdmitPipelined(ctx, tx, req, first, func(p *store.Pipeline, b *placement.Booking) {
			thens++
			node := b.NodeID
			p.Queue(func(q *db.Queries) { seen, seenErr = q.CountLiveBookings(ctx, node) })
		})
		if err != nil {
			return err
		}
		return seenErr
	})
	return b, seen, thens, err
}

// TestAdmitPipelined: a pipelined admission books and charges as Admit
// does, the caller's statements after it see the booking; a refused charge
// and a node held by another transaction fall back to Admit's way, with
// nothing of the first attempt left behind.
func TestAdmitPipelined(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	f := newFleet(t, st, 2, 2, 4096, map[string]map[string]int64{"acme": {"vcpu": 3, "memoryMiB": 1 << 20, "instances": 10, "diskGiB": 100}})
	ctx := t.Context()
	_, err := st.Pool().Exec(ctx, `insert into flavors (pool_id, name, vcpu, memory_mib, disk_gib) values ($1, 'small', 1, 512, 1)`, f.pool)
	require.NoError(t, err)
	e := placement.New(placement.Options{TopN: 1})
	req := placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i1"}, Shape: placement.Shape{VCPU: 1, MemoryMiB: 512, DiskGiB: 1},
		Count: map[string]int64{placement.ResourceInstances: 1}}

	b, seen, thens, err := f.admitPipelined(ctx, e, "small", req)
	require.NoError(t, err)
	assert.Equal(t, int64(1), seen, "the caller's statement sees the booking")
	assert.Equal(t, 1, thens)
	// Pack with a top of 1: the same node again, then the other.
	b2, seen, _, err := f.admitPipelined(ctx, e, "small", req)
	require.NoError(t, err)
	assert.Equal(t, b.NodeID, b2.NodeID)
	assert.Equal(t, int64(2), seen)

	// The other node held by a transaction (a status write): the first
	// attempt finds it held, rolls back, and Admit waits for it.
	other := f.pool + "-00001"
	if other == b.NodeID {
		other = f.pool + "-00002"
	}
	status, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	_, err = status.Exec(ctx, `update nodes set updated_at = now() where node_id = $1`, other)
	require.NoError(t, err)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = status.Commit(context.Background())
	}()
	b3, seen, thens, err := f.admitPipelined(ctx, e, "small", req)
	require.NoError(t, err, "the node was held, not full")
	assert.Equal(t, other, b3.NodeID)
	assert.Equal(t, int64(1), seen)
	assert.Equal(t, 2, thens, "the caller's statements go again with the booking made")

	// The vcpu quota (3) is spent: refused with the quota's answer, and the
	// booking of the first attempt is gone with its savepoint.
	_, _, _, err = f.admitPipelined(ctx, e, "small", req)
	assert.Equal(t, api.CodeQuotaExceeded, code(err))
	var live int64
	require.NoError(t, st.Pool().QueryRow(ctx, `select count(*) from bookings where pool_id = $1 and not released`, f.pool).Scan(&live))
	assert.Equal(t, int64(3), live)
	f.checkInvariants(t)

	// No such flavor: no candidates, and Admit's answer for the shape asked.
	_, err = st.Pool().Exec(ctx, `update quotas set max = 10 where pool_id = $1 and resource = 'vcpu'`, f.pool)
	require.NoError(t, err)
	_, _, thens, err = f.admitPipelined(ctx, e, "large", placement.Request{TenantID: "acme", Owner: req.Owner, Shape: placement.Shape{VCPU: 2, MemoryMiB: 512}})
	assert.Equal(t, api.CodeCapacityUnavailable, code(err))
	assert.Zero(t, thens)
	f.checkInvariants(t)
}
