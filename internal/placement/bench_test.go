package placement_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

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
