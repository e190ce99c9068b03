package placement_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
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

// fleet is a pool of nodes with quotas, written straight to the tables the
// fleet methods own.
type fleet struct {
	st   *store.Store
	pool string
}

func newFleet(t testing.TB, st *store.Store, nodes int, nodeVCPU int32, nodeMemMiB int64, quotas map[string]map[string]int64) *fleet {
	t.Helper()
	ctx := context.Background()
	f := &fleet{st: st, pool: "pool_" + fmt.Sprintf("%026d", rand.IntN(1<<30))}
	p := st.Pool()
	_, err := p.Exec(ctx, `insert into sites (site_id, tenant_id, kind, region, created_by, idem_request)
		values ('site_test0000000000000000000000', 'root', 'shared', 'eu-west', 'test', '{}') on conflict do nothing`)
	require.NoError(t, err)
	_, err = p.Exec(ctx, `insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		values ($1, 'root', 'site_test0000000000000000000000', $1, 'vps-host', 'hosted', 'qemu', 'node-daemon', 'test', '{}')`, f.pool)
	require.NoError(t, err)
	_, err = p.Exec(ctx, `insert into nodes (node_id, pool_id, site_id, hostname, state, cap_vcpu, cap_memory_mib, cap_disk_gib)
		select $1 || '-' || lpad(i::text, 5, '0'), $1, 'site_test0000000000000000000000', 'host' || i, 'ready', $2, $3, 1000
		from generate_series(1, $4) i`, f.pool, nodeVCPU, nodeMemMiB, nodes)
	require.NoError(t, err)
	for tenant, rs := range quotas {
		for r, max := range rs {
			_, err := p.Exec(ctx, `insert into quotas (tenant_id, pool_id, resource, max) values ($1, $2, $3, $4)`, tenant, f.pool, r, max)
			require.NoError(t, err)
		}
	}
	return f
}

func (f *fleet) admit(ctx context.Context, e *placement.Engine, req placement.Request) (*placement.Booking, error) {
	req.PoolID = f.pool
	var b *placement.Booking
	err := f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) (err error) {
		b, err = e.Admit(ctx, tx, req)
		return err
	})
	return b, err
}

func (f *fleet) release(ctx context.Context, e *placement.Engine, id string, count map[string]int64) error {
	return f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error { return e.Release(ctx, tx, id, count) })
}

// checkInvariants reads the database's own view: nothing over capacity or
// quota, the counters equal to the live bookings, no overlapping
// whole-node bookings.
func (f *fleet) checkInvariants(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var overCap, drift, overQuota, overlaps int
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select count(*) from nodes where pool_id = $1 and
		(booked_vcpu > cap_vcpu or booked_memory_mib > cap_memory_mib or booked_disk_gib > cap_disk_gib or booked_gpus > cap_gpus
		 or least(booked_vcpu, booked_memory_mib, booked_disk_gib, booked_gpus) < 0)`, f.pool).Scan(&overCap))
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select count(*) from nodes n left join lateral (
			select coalesce(sum(vcpu), 0) v, coalesce(sum(memory_mib), 0) m from bookings b where b.node_id = n.node_id and not released) b on true
		where n.pool_id = $1 and (n.booked_vcpu <> b.v or n.booked_memory_mib <> b.m)`, f.pool).Scan(&drift))
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select count(*) from quotas where pool_id = $1 and (used > max or used < 0)`, f.pool).Scan(&overQuota))
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select count(*) from bookings a join bookings b on a.node_id = b.node_id and a.booking_id < b.booking_id
		where a.pool_id = $1 and a.whole and b.whole and not a.released and not b.released and a.during && b.during`, f.pool).Scan(&overlaps))
	assert.Zero(t, overCap, "nodes booked past capacity")
	assert.Zero(t, drift, "nodes whose counters differ from their live bookings")
	assert.Zero(t, overQuota, "quotas used past max")
	assert.Zero(t, overlaps, "overlapping whole-node bookings")
	// Quota used equals what the live bookings hold, per tenant.
	var quotaDrift int
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select count(*) from quotas q left join lateral (
			select coalesce(sum(vcpu), 0) v from bookings b where b.pool_id = q.pool_id and b.tenant_id = q.tenant_id and not released and not whole) b on true
		where q.pool_id = $1 and q.resource = 'vcpu' and q.used <> b.v`, f.pool).Scan(&quotaDrift))
	assert.Zero(t, quotaDrift, "vcpu quota used differs from the live bookings")
}

func code(err error) api.Code {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func TestAdmitAndRelease(t *testing.T) {
	t.Parallel()
	f := newFleet(t, dbtest.NewStore(t), 2, 4, 4096, map[string]map[string]int64{
		"acme": {"vcpu": 10, "memoryMiB": 1 << 20, "instances": 2, "nodes": 1},
	})
	e := placement.New(placement.Options{})
	ctx := t.Context()
	one := placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i1"},
		Shape: placement.Shape{VCPU: 3, MemoryMiB: 1024}, Count: map[string]int64{"instances": 1}}
	b1, err := f.admit(ctx, e, one)
	require.NoError(t, err)
	b2, err := f.admit(ctx, e, one)
	require.NoError(t, err)
	assert.NotEqual(t, b1.NodeID, b2.NodeID, "3 of 4 vCPU taken: the second goes elsewhere")

	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: one.Owner, Shape: placement.Shape{VCPU: 3, MemoryMiB: 1}})
	assert.Equal(t, api.CodeCapacityUnavailable, code(err), "1 vCPU left on each node; the quota allows it")
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: one.Owner, Whole: true})
	assert.Equal(t, api.CodeCapacityUnavailable, code(err), "no empty node for a whole-node booking")
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: one.Owner, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1},
		Count: map[string]int64{"instances": 1}})
	assert.Equal(t, api.CodeQuotaExceeded, code(err), "both instances of the quota are used")
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: one.Owner, Shape: placement.Shape{VCPU: 3, MemoryMiB: 1},
		Count: map[string]int64{"instances": 1}})
	assert.Equal(t, api.CodeQuotaExceeded, code(err), "a spent quota is named before the missing capacity")
	_, err = f.admit(ctx, e, placement.Request{TenantID: "globex", Owner: one.Owner, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}})
	assert.Equal(t, api.CodeQuotaExceeded, code(err), "a missing quota row grants nothing")

	require.NoError(t, f.release(ctx, e, b1.ID, map[string]int64{"instances": 1}))
	assert.Equal(t, api.CodeNotFound, code(f.release(ctx, e, b1.ID, nil)), "a booking is released once")
	b3, err := f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: one.Owner, Shape: placement.Shape{VCPU: 3, MemoryMiB: 1}, NodeID: b1.NodeID})
	require.NoError(t, err, "released capacity and quota can be booked again, on a pinned node")
	assert.Equal(t, b1.NodeID, b3.NodeID)
	_, err = f.st.Pool().Exec(ctx, `update pools set archived = true where pool_id = $1`, f.pool)
	require.NoError(t, err)
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: one.Owner, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}})
	assert.Equal(t, api.CodeInvalidState, code(err), "an archived pool takes no new work")
	f.checkInvariants(t)
}

// TestConstraintsRefuseOverCommit: the database refuses what a bug in the
// placement code could try; these constraints are what make the
// concurrency test below hold whatever the code above them does.
func TestConstraintsRefuseOverCommit(t *testing.T) {
	t.Parallel()
	f := newFleet(t, dbtest.NewStore(t), 1, 4, 4096, map[string]map[string]int64{"acme": {"vcpu": 4}})
	ctx := t.Context()
	p := f.st.Pool()
	violates := func(constraint, sql string, args ...any) {
		t.Helper()
		_, err := p.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		assert.Equal(t, constraint, pgErr.ConstraintName)
	}
	violates("nodes_booked_within_capacity", `update nodes set booked_vcpu = cap_vcpu + 1 where pool_id = $1`, f.pool)
	violates("nodes_booked_within_capacity", `update nodes set booked_vcpu = -1 where pool_id = $1`, f.pool)
	violates("quotas_used_within_max", `update quotas set used = max + 1 where pool_id = $1`, f.pool)
	node := f.pool + "-00001"
	insert := `insert into bookings (booking_id, node_id, pool_id, tenant_id, owner_type, owner_id, whole, vcpu, memory_mib, disk_gib, gpus, during)
		values ($1, $2, $3, 'acme', 'reservation', $1, true, 4, 4096, 0, 0, tstzrange(now(), now() + interval '1 hour'))`
	_, err := p.Exec(ctx, insert, "bkg_a", node, f.pool)
	require.NoError(t, err)
	violates("bookings_whole_node_no_overlap", insert, "bkg_b", node, f.pool)
}

// TestConcurrentAdmissionsNeverOverCommit: thousands of admissions and
// releases race on a small pool from many goroutines; afterwards the
// database shows nothing over capacity or quota, counters equal to the
// live bookings, and no overlapping whole-node bookings. The guarantees
// are the constraints of TestConstraintsRefuseOverCommit: with them
// dropped, a BookNode or ChargeQuotas whose condition were wrong would
// over-commit here and checkInvariants would count it.
func TestConcurrentAdmissionsNeverOverCommit(t *testing.T) {
	t.Parallel()
	tenants := []string{"t1", "t2", "t3"}
	quotas := map[string]map[string]int64{}
	for _, tn := range tenants {
		quotas[tn] = map[string]int64{"vcpu": 20, "memoryMiB": 40 << 10, "instances": 12, "nodes": 2}
	}
	f := newFleet(t, dbtest.NewStore(t), 8, 8, 16<<10, quotas)
	e := placement.New(placement.Options{})
	ctx := t.Context()

	const workers, opsEach = 12, 250
	var mu sync.Mutex
	held := map[string][]*placement.Booking{}
	counts := map[api.Code]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for range opsEach {
				tn := tenants[rng.IntN(len(tenants))]
				mu.Lock()
				mine := held[tn]
				var victim *placement.Booking
				if len(mine) > 0 && rng.IntN(3) == 0 {
					i := rng.IntN(len(mine))
					victim = mine[i]
					held[tn] = append(mine[:i:i], mine[i+1:]...)
				}
				mu.Unlock()
				if victim != nil {
					count := map[string]int64{"instances": 1}
					if victim.Whole {
						count = nil
					}
					require.NoError(t, f.release(ctx, e, victim.ID, count))
					continue
				}
				req := placement.Request{TenantID: tn, Owner: placement.Owner{Type: "instance", ID: "x"},
					Shape: placement.Shape{VCPU: int32(1 + rng.IntN(4)), MemoryMiB: int64(512 * (1 + rng.IntN(8)))},
					Count: map[string]int64{"instances": 1}}
				if rng.IntN(10) == 0 {
					req = placement.Request{TenantID: tn, Owner: placement.Owner{Type: "reservation", ID: "r"}, Whole: true}
				}
				b, err := f.admit(ctx, e, req)
				mu.Lock()
				if err == nil {
					held[tn] = append(held[tn], b)
					counts["OK"]++
				} else {
					counts[code(err)]++
				}
				mu.Unlock()
				if c := code(err); err != nil && c != api.CodeCapacityUnavailable && c != api.CodeQuotaExceeded {
					require.NoError(t, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("outcomes: %v", counts)
	assert.Positive(t, counts["OK"])
	assert.Positive(t, counts[api.CodeCapacityUnavailable]+counts[api.CodeQuotaExceeded], "the pool and quotas were contended")
	f.checkInvariants(t)
}

// TestSpreadWeights: with spread weighted above pack, admissions go to the
// emptiest nodes first; the default packs them onto the fullest.
func TestSpreadWeights(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for name, tc := range map[string]struct {
		opts      placement.Options
		wantNodes int
	}{
		"pack":   {placement.Options{TopN: 1}, 1},
		"spread": {placement.Options{TopN: 1, Weights: placement.Weights{Spread: 1}}, 4},
	} {
		f := newFleet(t, dbtest.NewStore(t), 4, 8, 8192, map[string]map[string]int64{"acme": {"vcpu": 100, "memoryMiB": 1 << 20}})
		e := placement.New(tc.opts)
		used := map[string]bool{}
		for range 4 {
			b, err := f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "t", ID: "x"}, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}})
			require.NoError(t, err, name)
			used[b.NodeID] = true
		}
		assert.Len(t, used, tc.wantNodes, name)
	}
}

// TestMove: a booking moves to another node with room; the tenant's quota
// does not change; with no room elsewhere nothing moves.
func TestMove(t *testing.T) {
	t.Parallel()
	f := newFleet(t, dbtest.NewStore(t), 2, 4, 4096, map[string]map[string]int64{"acme": {"vcpu": 6, "memoryMiB": 1 << 20}})
	e := placement.New(placement.Options{})
	ctx := t.Context()
	a, b := f.pool+"-00001", f.pool+"-00002"
	booking, err := f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i1"},
		Shape: placement.Shape{VCPU: 3, MemoryMiB: 1024}, NodeID: a})
	require.NoError(t, err)
	var moved *placement.Booking
	require.NoError(t, f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) (err error) {
		moved, err = e.Move(ctx, tx, booking.ID, "")
		return err
	}))
	assert.Equal(t, b, moved.NodeID)
	assert.Equal(t, booking.Shape, moved.Shape)
	var used int64
	var owner string
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select used from quotas where tenant_id = 'acme' and resource = 'vcpu'`).Scan(&used))
	assert.Equal(t, int64(3), used, "a move charges nothing")
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select owner_id from bookings where booking_id = $1`, moved.ID).Scan(&owner))
	assert.Equal(t, "i1", owner)

	// Node a filled up: the booking cannot go back there.
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i2"},
		Shape: placement.Shape{VCPU: 2, MemoryMiB: 1024}, NodeID: a})
	require.NoError(t, err)
	err = f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		_, err := e.Move(ctx, tx, moved.ID, a)
		return err
	})
	assert.Equal(t, api.CodeCapacityUnavailable, code(err))
	var booked int32
	require.NoError(t, f.st.Pool().QueryRow(ctx, `select booked_vcpu from nodes where node_id = $1`, b).Scan(&booked))
	assert.Equal(t, int32(3), booked, "nothing moved")
	f.checkInvariants(t)
}

// A node held (row-locked) by another transaction, such as its own status
// write, is waited for: the admission books it once the lock is gone,
// rather than refusing work the node has room for. A full node still
// refuses at once.
func TestHeldNodeIsWaitedFor(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	f := newFleet(t, st, 1, 4, 4096, map[string]map[string]int64{"acme": {"vcpu": 10, "memoryMiB": 1 << 20}})
	e := placement.New(placement.Options{})
	ctx := t.Context()
	node := f.pool + "-00001"

	status, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	_, err = status.Exec(ctx, `update nodes set updated_at = now() where node_id = $1`, node)
	require.NoError(t, err)
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		released <- time.Now()
		_ = status.Commit(context.Background())
	}()
	req := placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i1"}, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}}
	b, err := f.admit(ctx, e, req)
	require.NoError(t, err, "the node was held, not full")
	assert.Equal(t, node, b.NodeID)
	select {
	case at := <-released:
		assert.False(t, time.Now().Before(at), "booked after the lock was released")
	default:
		t.Fatal("booked while the node was held")
	}

	start := time.Now()
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: req.Owner, Shape: placement.Shape{VCPU: 4, MemoryMiB: 1}})
	assert.Equal(t, api.CodeCapacityUnavailable, code(err))
	assert.Less(t, time.Since(start), placement.HeldWait, "a full node refuses without waiting")
	f.checkInvariants(t)

	// A node asked for by name that is not ready is named as such, not as
	// short of room.
	_, err = st.Pool().Exec(ctx, `update nodes set state = 'cordoned' where node_id = $1`, node)
	require.NoError(t, err)
	_, err = f.admit(ctx, e, placement.Request{TenantID: "acme", Owner: req.Owner, NodeID: node, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}})
	var refused *api.Error
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, api.CodeCapacityUnavailable, refused.Code)
	assert.Equal(t, "cordoned", refused.Details["state"])
}

// A VM asking for a network goes only to a node whose hello offers it;
// none left is CAPACITY_UNAVAILABLE naming the network, and a VM asking
// none goes anywhere.
func TestAVMAskingForANetworkGoesToANodeOfferingIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t, dbtest.NewStore(t), 3, 32, 4096, map[string]map[string]int64{"acme": {"vcpu": 100, "memoryMiB": 1 << 20}})
	ctx := t.Context()
	// Node 1: no networks (--network none, or a daemon from before);
	// node 2: egress only (no underlay); node 3: both.
	for i, inv := range []string{`{"hostname": "h1"}`, `{"networks": ["egress"]}`, `{"networks": ["egress", "private"], "underlay": "192.0.2.3"}`} {
		_, err := f.st.Pool().Exec(ctx, `update nodes set inventory = $2 where node_id = $1`, fmt.Sprintf("%s-%05d", f.pool, i+1), inv)
		require.NoError(t, err)
	}
	e := placement.New(placement.Options{Weights: placement.Weights{Spread: 1}})
	req := func(network string) placement.Request {
		return placement.Request{TenantID: "acme", Owner: placement.Owner{Type: "instance", ID: "i"}, Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}, Network: network}
	}
	got := map[string]map[string]bool{}
	for range 8 {
		for _, n := range []string{"none", "egress", "private"} {
			b, err := f.admit(ctx, e, req(n))
			require.NoError(t, err, n)
			if got[n] == nil {
				got[n] = map[string]bool{}
			}
			got[n][b.NodeID[len(b.NodeID)-1:]] = true
		}
	}
	assert.NotContains(t, got["egress"], "1")
	assert.Equal(t, map[string]bool{"3": true}, got["private"])
	none := req("none")
	none.NodeID = f.pool + "-00001"
	_, err := f.admit(ctx, e, none)
	assert.NoError(t, err, "a VM asking no network goes to a node without networks")

	// Node 3 full: no node offers private with room; a pinned node that
	// does not offer the network says so.
	_, err = f.st.Pool().Exec(ctx, `update nodes set booked_vcpu = cap_vcpu where node_id = $1`, f.pool+"-00003")
	require.NoError(t, err)
	_, err = f.admit(ctx, e, req("private"))
	assert.Equal(t, api.CodeCapacityUnavailable, code(err))
	assert.ErrorContains(t, err, "network private")
	pinned := req("egress")
	pinned.NodeID = f.pool + "-00001"
	_, err = f.admit(ctx, e, pinned)
	assert.Equal(t, api.CodeCapacityUnavailable, code(err))
	assert.ErrorContains(t, err, "does not offer network egress")
	// No node offering it at all: the refusal says how nodes offer it.
	_, err = f.st.Pool().Exec(ctx, `update nodes set inventory = '{}' where pool_id = $1`, f.pool)
	require.NoError(t, err)
	_, err = f.admit(ctx, e, req("egress"))
	assert.Equal(t, api.CodeCapacityUnavailable, code(err))
	assert.ErrorContains(t, err, "offers network egress (its nodes run compute-agent with --network none")
}
