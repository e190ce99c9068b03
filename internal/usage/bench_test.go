package usage_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
	"computeplane/internal/usage"
)

// BenchmarkExport exports 10,000 and 50,000 windows through the HTTP API
// (CSV) and reports the time, the bytes allocated and the peak heap per
// window: the export reads the range a page at a time, so what grows with
// the number of windows is the answer itself, not the rows held. make
// bench runs it; figures in docs/usage.md.
func BenchmarkExport(b *testing.B) {
	for _, n := range []int{10_000, usage.MaxExportWindows} {
		b.Run(fmt.Sprintf("windows=%d", n), func(b *testing.B) {
			env := testenv.Start(b)
			c := env.Client(b, computeclient.WithToken(env.Key(b, "acme", "vic", "viewer")))
			start := time.Now().UTC().Truncate(time.Hour).Add(-48 * time.Hour)
			insertWindows(b, env, start, n)
			in := &client.UsageExportInput{TenantId: "acme", From: start.UnixMilli(), To: start.Add(time.Hour).UnixMilli()}

			var peak atomic.Uint64
			stop := make(chan struct{})
			go func() {
				var m runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					runtime.ReadMemStats(&m)
					if m.HeapInuse > peak.Load() {
						peak.Store(m.HeapInuse)
					}
				}
			}()
			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			b.ReportAllocs()
			b.ResetTimer()
			size := 0
			for range b.N {
				res, err := c.UsageExport(b.Context(), in)
				if err != nil {
					b.Fatal(err)
				}
				if res.Data.Windows != int64(n) {
					b.Fatalf("exported %d of %d", res.Data.Windows, n)
				}
				size = len(res.Data.Content)
			}
			b.StopTimer()
			close(stop)
			b.ReportMetric(float64(size)/float64(n), "content-B/window")
			b.ReportMetric(float64(peak.Load()-min(peak.Load(), base.HeapInuse))/float64(n), "peak-heap-B/window")
		})
	}
}
