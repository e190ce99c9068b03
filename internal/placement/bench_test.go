package placement_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/dbtest"
	"computeplane/internal/placement"
)

// BenchmarkAdmitInline measures inline admissions (each its own
// transaction: candidates, book, booking row, quota charges, commit) on a
// 5,000-node pool from parallel callers, 16 tenants, then checks that
// nothing was over-committed. make bench runs it; figures in
// docs/benchmarks.md.
func BenchmarkAdmitInline(b *testing.B) {
	for _, tenants := range []int{1, 16} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			quotas := map[string]map[string]int64{}
			for i := range tenants {
				quotas[fmt.Sprintf("t%d", i)] = map[string]int64{"vcpu": 1 << 40, "memoryMiB": 1 << 50, "instances": 1 << 40}
			}
			f := newFleet(b, dbtest.NewStore(b), 5000, 1<<20, 1<<40, quotas)
			e := placement.New(placement.Options{})
			var n atomic.Int64
			b.SetParallelism(8) // 8 callers per CPU, as an api role's pool would run them
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					_, err := f.admit(context.Background(), e, placement.Request{
						TenantID: fmt.Sprintf("t%d", i%int64(tenants)), Owner: placement.Owner{Type: "instance", ID: "x"},
						Shape: placement.Shape{VCPU: 1, MemoryMiB: 512}, Count: map[string]int64{"instances": 1},
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admissions/s")
			var over int
			if err := f.st.Pool().QueryRow(context.Background(), `select count(*) from nodes where booked_vcpu > cap_vcpu
				or booked_memory_mib > cap_memory_mib`).Scan(&over); err != nil || over > 0 {
				b.Fatalf("over-committed nodes: %d (%v)", over, err)
			}
		})
	}
}

// BenchmarkPoolLease measures the pool-lease placer on a 5,000-node pool:
// b.N admissions queued from parallel callers (each its own transaction),
// then placed by one worker in batches of 64 (capacity.maxBatch), and
// checks that nothing was over-committed. It reports both rates.
func BenchmarkPoolLease(b *testing.B) {
	quotas := map[string]map[string]int64{"t0": {"vcpu": 1 << 40, "memoryMiB": 1 << 50, "instances": 1 << 40}}
	f := newFleet(b, dbtest.NewStore(b), 5000, 1<<20, 1<<40, quotas)
	e := placement.New(placement.Options{})
	ctx := context.Background()
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			err := f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
				_, err := e.Enqueue(ctx, tx, placement.Request{TenantID: "t0", PoolID: f.pool, Owner: placement.Owner{Type: "instance", ID: "x"},
					Shape: placement.Shape{VCPU: 1, MemoryMiB: 512}, Count: map[string]int64{"instances": 1}})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	queued := time.Since(start)
	start = time.Now()
	placed := 0
	for {
		n := 0
		err := f.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) (err error) {
			n, err = e.PlaceBatch(ctx, tx, f.pool, 64)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
		placed += n
	}
	placing := time.Since(start)
	b.StopTimer()
	if placed != b.N {
		b.Fatalf("placed %d of %d", placed, b.N)
	}
	b.ReportMetric(float64(b.N)/queued.Seconds(), "queued/s")
	b.ReportMetric(float64(b.N)/placing.Seconds(), "placed/s")
	var over int
	if err := f.st.Pool().QueryRow(ctx, `select count(*) from nodes where booked_vcpu > cap_vcpu or booked_memory_mib > cap_memory_mib`).Scan(&over); err != nil || over > 0 {
		b.Fatalf("over-committed nodes: %d (%v)", over, err)
	}
}
