package usage_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/dbtest"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/store"
	"computeplane/internal/usage"
)

// t0 is an hour boundary the tests count from.
var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func at(h, m int) time.Time { return t0.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute) }

func tx(t *testing.T, st *store.Store, fn func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, st.WithTx(t.Context(), false, fn))
}

type window struct {
	key      string
	start    time.Time
	microMs  int64
	adjusted int32
}

func windows(t *testing.T, st *store.Store, alloc string) []window {
	t.Helper()
	rows, err := st.Pool().Query(t.Context(), `select key, window_start, quantity_micro_ms, adjustment from usage_windows
		where allocation_id = $1 order by window_start, adjustment`, alloc)
	require.NoError(t, err)
	defer rows.Close()
	var out []window
	for rows.Next() {
		var w window
		require.NoError(t, rows.Scan(&w.key, &w.start, &w.microMs, &w.adjusted))
		w.start = w.start.UTC()
		out = append(out, w)
	}
	return out
}

func rollup(t *testing.T, st *store.Store, tenant string, now time.Time) int {
	t.Helper()
	var n int
	tx(t, st, func(ctx context.Context, tx pgx.Tx) (err error) {
		n, err = usage.Rollup(ctx, tx, tenant, now)
		return err
	})
	return n
}

func open(t *testing.T, st *store.Store, a usage.Allocation) string {
	t.Helper()
	var id string
	tx(t, st, func(ctx context.Context, tx pgx.Tx) (err error) {
		id, err = usage.Open(ctx, tx, a)
		return err
	})
	return id
}

const hourMs = 3_600_000

// TestRollupAcrossHourBoundaries: an allocation of 2 units per hour from
// 10:15 to 12:45 gives windows of 45, 60 and 45 minutes, exactly; the
// rollup only writes closed hours; running it again writes nothing.
func TestRollupAcrossHourBoundaries(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	id := open(t, st, usage.Allocation{TenantID: "acme", ProjectID: "prj_0000000000000000000000000a", Meter: api.MeterInstanceVcpuHours,
		PerHour: 2 * usage.Micro, Owner: usage.Owner{Type: "instance", ID: "i1"}, At: at(0, 15)})

	assert.Equal(t, 0, rollup(t, st, "acme", at(0, 50)), "the first hour is not closed yet")
	assert.Equal(t, 1, rollup(t, st, "acme", at(1, 5)))
	assert.Equal(t, 0, rollup(t, st, "acme", at(1, 30)), "again: nothing new")
	tx(t, st, func(ctx context.Context, tx pgx.Tx) error { return usage.Close(ctx, tx, id, at(2, 45)) })
	assert.Equal(t, 1, rollup(t, st, "acme", at(2, 50)), "hour 11 closed; 12 still open")
	assert.Equal(t, 1, rollup(t, st, "acme", at(3, 0)), "hour 12, partial")
	assert.Equal(t, 0, rollup(t, st, "acme", at(9, 0)), "closed and fully windowed")

	got := windows(t, st, id)
	require.Len(t, got, 3)
	want := []int64{45 * 60_000 * 2 * usage.Micro, hourMs * 2 * usage.Micro, 45 * 60_000 * 2 * usage.Micro}
	for i, w := range got {
		assert.Equal(t, at(i, 0), w.start)
		assert.Equal(t, want[i], w.microMs, "window %d", i)
		assert.Equal(t, usage.Key(id, at(i, 0), 0), w.key)
	}
	assert.InDelta(t, 1.5, usage.Quantity(got[0].microMs), 1e-12)
	assert.InDelta(t, 2.0, usage.Quantity(got[1].microMs), 1e-12)

	// A backfill (the allocation found to have started earlier) is an
	// adjustment window of its own; what was written stays.
	_, err := st.Pool().Exec(t.Context(), `update allocations set started_at = $2, dirty = true where allocation_id = $1`, id, at(0, 0))
	require.NoError(t, err)
	assert.Equal(t, 1, rollup(t, st, "acme", at(9, 0)))
	got = windows(t, st, id)
	require.Len(t, got, 4)
	assert.Equal(t, int32(1), got[1].adjusted)
	assert.Equal(t, usage.Key(id, at(0, 0), 1), got[1].key)
	assert.Equal(t, int64(15*60_000*2*usage.Micro), got[1].microMs, "the missing quarter hour")
	assert.Equal(t, 0, rollup(t, st, "acme", at(9, 0)), "and again nothing")

	var project string
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select tags->>'project' from usage_windows where key = $1`, got[0].key).Scan(&project))
	assert.Equal(t, "prj_0000000000000000000000000a", project, "windows carry the project")
}

func TestOpenRefusesUnknownMeterAndCloseTwice(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	err := st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := usage.Open(ctx, tx, usage.Allocation{TenantID: "acme", Meter: "made.up", PerHour: 1, Owner: usage.Owner{Type: "x", ID: "y"}})
		return err
	})
	require.ErrorContains(t, err, "not a meter")
	id := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, PerHour: usage.Micro, Owner: usage.Owner{Type: "node", ID: "n"}})
	tx(t, st, func(ctx context.Context, tx pgx.Tx) error {
		return usage.CloseOwner(ctx, tx, usage.Owner{Type: "node", ID: "n"}, time.Time{})
	})
	err = st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error { return usage.Close(ctx, tx, id, time.Time{}) })
	require.ErrorContains(t, err, "not open")
}

// TestOpenAllIsOneStatement: one owner's allocations (an instance's vCPU
// and memory) are opened by one statement, each row as Open writes it
// (project none or given, tags, start at the given time or the
// transaction's); allocations of different starts are refused.
func TestOpenAllIsOneStatement(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	conn, statements := dbtest.StatementConn(t, st)
	ctx := t.Context()
	owner := usage.Owner{Type: "instance", ID: "i1"}
	txn, err := conn.Begin(ctx)
	require.NoError(t, err)
	before := statements.Load() // BEGIN
	ids, err := usage.OpenAll(ctx, txn,
		usage.Allocation{TenantID: "acme", Meter: "instance.vcpu.hours", PerHour: 2 * usage.Micro, Owner: owner},
		usage.Allocation{TenantID: "acme", ProjectID: "prj_0000000000000000000000000a", Meter: "instance.memory.gib.hours", PerHour: usage.Micro / 2,
			Owner: owner, Tags: map[string]string{"k": "v"}})
	require.NoError(t, err)
	assert.Equal(t, int64(1), statements.Load()-before, "two allocations, one statement")
	var now time.Time
	require.NoError(t, txn.QueryRow(ctx, `select now()`).Scan(&now))
	require.NoError(t, txn.Commit(ctx))
	require.Len(t, ids, 2)

	type row struct {
		Meter   string
		Project *string
		PerHour int64
		Tags    map[string]string
		Start   time.Time
		Rolled  time.Time
	}
	read := func(id string) row {
		var r row
		require.NoError(t, st.Pool().QueryRow(ctx, `select meter, project_id, quantity_micro, tags, started_at, rolled_until
			from allocations where allocation_id = $1 and owner_type = 'instance' and owner_id = 'i1' and tenant_id = 'acme' and ended_at is null`, id).
			Scan(&r.Meter, &r.Project, &r.PerHour, &r.Tags, &r.Start, &r.Rolled))
		return r
	}
	vcpu, mem := read(ids[0]), read(ids[1])
	assert.Equal(t, "instance.vcpu.hours", vcpu.Meter)
	assert.Nil(t, vcpu.Project)
	assert.Equal(t, int64(2*usage.Micro), vcpu.PerHour)
	assert.Equal(t, map[string]string{}, vcpu.Tags)
	assert.True(t, now.Equal(vcpu.Start), "the transaction's time")
	assert.True(t, now.Truncate(time.Hour).Equal(vcpu.Rolled))
	assert.Equal(t, "instance.memory.gib.hours", mem.Meter)
	require.NotNil(t, mem.Project)
	assert.Equal(t, "prj_0000000000000000000000000a", *mem.Project)
	assert.Equal(t, map[string]string{"k": "v", usage.TagProject: "prj_0000000000000000000000000a"}, mem.Tags)

	id := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, Owner: owner, At: at(0, 15)})
	assert.True(t, at(0, 15).Equal(read(id).Start), "a given start")
	assert.True(t, at(0, 0).Equal(read(id).Rolled))
	err = st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := usage.OpenAll(ctx, tx,
			usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, Owner: owner, At: at(0, 15)},
			usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, Owner: owner})
		return err
	})
	require.ErrorContains(t, err, "start at the same time")
}

// flaky fails its first calls with UNAVAILABLE, then passes them to the
// real bridge.
type flaky struct {
	iam.Billing
	failures atomic.Int32
	calls    atomic.Int32
}

func (f *flaky) Record(ctx context.Context, w iam.UsageWindow) (string, error) {
	f.calls.Add(1)
	if f.failures.Add(-1) >= 0 {
		return "", iam.ErrUnavailable
	}
	return f.Billing.Record(ctx, w)
}

// TestHandoverSurvivesBillingOutage: billing that fails, then recovers,
// loses and duplicates nothing; handing a window over again is a
// duplicate, never a second record.
func TestHandoverSurvivesBillingOutage(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	bridge := &flaky{Billing: embedded.New(st, "root", "compute-", time.Now).Billing()}
	bridge.failures.Store(3)
	for i := range 5 {
		open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, PerHour: usage.Micro,
			Owner: usage.Owner{Type: "node", ID: string(rune('a' + i))}, At: at(0, 0)})
	}
	require.Equal(t, 10, rollup(t, st, "acme", at(2, 0)))
	h := &usage.Handovers{Store: st, Billing: bridge, Batch: 4, Now: func() time.Time { return at(2, 0) }}
	noFence := func(context.Context, pgx.Tx) error { return nil }

	require.NoError(t, h.Once(t.Context(), noFence)) // 3 fail, 1 recorded: not a full batch of decisions
	var pending, recorded int
	count := func() {
		require.NoError(t, st.Pool().QueryRow(t.Context(), `select count(*) filter (where outcome is null),
			count(*) filter (where outcome = 'recorded') from usage_windows`).Scan(&pending, &recorded))
	}
	count()
	assert.Equal(t, 9, pending, "windows billing could not take stay pending")
	assert.Equal(t, 1, recorded)
	for range 5 {
		require.NoError(t, h.Once(t.Context(), noFence))
	}
	count()
	assert.Zero(t, pending)
	assert.Equal(t, 10, recorded)
	var billed int
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select count(*) from iam.usage_records`).Scan(&billed))
	assert.Equal(t, 10, billed, "each window recorded once by billing")

	// A hand-over killed after billing answered: the window is handed over
	// again, billing answers duplicate, nothing is recorded twice.
	_, err := st.Pool().Exec(t.Context(), `update usage_windows set outcome = null, recorded_at = null`)
	require.NoError(t, err)
	require.NoError(t, h.Once(t.Context(), noFence))
	require.NoError(t, h.Once(t.Context(), noFence))
	require.NoError(t, h.Once(t.Context(), noFence))
	var dups int
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select count(*) from usage_windows where outcome = 'duplicate'`).Scan(&dups))
	assert.Equal(t, 10, dups)
	require.NoError(t, st.Pool().QueryRow(t.Context(), `select count(*) from iam.usage_records`).Scan(&billed))
	assert.Equal(t, 10, billed)
}

// TestCloseOwnerIsOneStatement: an owner's open allocations (here 3) are
// ended by one statement, each at the given time but never before it
// started, or at the transaction's time; what another owner has open and
// what the owner closed before stay as they were; closing again closes
// nothing and is no error. Under a store transaction the statement is held
// and travels with the COMMIT: ending them costs no round trip of its own.
func TestCloseOwnerIsOneStatement(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	conn, statements := dbtest.StatementConn(t, st)
	ctx := t.Context()
	owner, other := usage.Owner{Type: "instance", ID: "i1"}, usage.Owner{Type: "instance", ID: "i2"}
	early := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterInstanceVcpuHours, PerHour: usage.Micro, Owner: owner, At: at(0, 0)})
	late := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterInstanceMemoryGibHours, PerHour: usage.Micro, Owner: owner, At: at(3, 0)})
	closed := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterInstanceVcpuHours, PerHour: usage.Micro, Owner: owner, At: at(0, 0)})
	tx(t, st, func(ctx context.Context, tx pgx.Tx) error { return usage.Close(ctx, tx, closed, at(0, 30)) })
	theirs := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterInstanceVcpuHours, PerHour: usage.Micro, Owner: other, At: at(0, 0)})
	third := open(t, st, usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, PerHour: usage.Micro, Owner: owner, At: at(0, 0)})

	ended := func(id string) (end *time.Time, dirty bool) {
		require.NoError(t, st.Pool().QueryRow(ctx, `select ended_at, dirty from allocations where allocation_id = $1`, id).Scan(&end, &dirty))
		return end, dirty
	}
	txn, err := conn.Begin(ctx)
	require.NoError(t, err)
	before := statements.Load()
	require.NoError(t, usage.CloseOwner(ctx, txn, owner, at(2, 0)))
	assert.Equal(t, int64(1), statements.Load()-before, "3 allocations, one statement")
	require.NoError(t, txn.Commit(ctx))
	for id, want := range map[string]time.Time{early: at(2, 0), late: at(3, 0), third: at(2, 0), closed: at(0, 30)} {
		end, dirty := ended(id)
		require.NotNil(t, end, id)
		assert.True(t, want.Equal(*end), "%s ended at %v, want %v", id, *end, want)
		assert.True(t, dirty, "the rollup sees the end")
	}
	end, _ := ended(theirs)
	assert.Nil(t, end, "another owner's allocation stays open")

	// Again: nothing open, nothing closed, no error; the transaction's time.
	tx(t, st, func(ctx context.Context, tx pgx.Tx) error { return usage.CloseOwner(ctx, tx, owner, time.Time{}) })
	end, _ = ended(early)
	assert.True(t, at(2, 0).Equal(*end))
	var trips atomic.Int64
	var now time.Time
	require.NoError(t, st.WithTx(store.CountRoundTrips(ctx, &trips), false, func(ctx context.Context, tx pgx.Tx) error {
		return usage.CloseOwner(ctx, tx, other, time.Time{})
	}))
	assert.EqualValues(t, 1, trips.Load(), "BEGIN, the held close and the COMMIT: one round trip")
	require.NoError(t, st.Pool().QueryRow(ctx, `select now()`).Scan(&now))
	end, _ = ended(theirs)
	require.NotNil(t, end)
	assert.WithinDuration(t, now, *end, time.Minute, "the transaction's time")
}
