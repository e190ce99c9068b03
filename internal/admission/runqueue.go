package admission

import (
	"math"
	"runtime/metrics"
	"time"
)

// runQueue reads how long this process's goroutines waited to run once
// they were runnable (the Go scheduler's /sched/latencies:seconds): the
// queue for the CPU, which the wait for a database connection does not
// show. A server short of CPU holds hundreds of calls in flight, each
// waiting its turn on the processor while the pool has connections free;
// only this wait says that fewer calls in flight would each be answered
// sooner (docs/protocol.md, "Admission").
type runQueue struct {
	sample []metrics.Sample
	prev   []uint64 // the histogram's counts at the previous read
}

const runQueueMetric = "/sched/latencies:seconds"

func newRunQueue() *runQueue {
	r := &runQueue{sample: []metrics.Sample{{Name: runQueueMetric}}}
	r.median() // the counts so far are not the first interval's
	return r
}

// median is the median wait of the goroutines that became runnable since
// the previous call (the lower bound of its histogram bucket), and
// whether any did.
func (r *runQueue) median() (time.Duration, bool) {
	metrics.Read(r.sample)
	if r.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0, false // a runtime without the metric
	}
	h := r.sample[0].Value.Float64Histogram()
	if len(r.prev) != len(h.Counts) {
		r.prev = make([]uint64, len(h.Counts))
	}
	m, ok := medianSince(h.Counts, r.prev, h.Buckets)
	copy(r.prev, h.Counts)
	return m, ok
}

// medianSince is the median of the counts added since prev, as the lower
// bound of its bucket (buckets holds the len(counts)+1 boundaries, in
// seconds; the first may be -Inf).
func medianSince(counts, prev []uint64, buckets []float64) (time.Duration, bool) {
	var total uint64
	for i, c := range counts {
		total += c - prev[i]
	}
	if total == 0 {
		return 0, false
	}
	var seen uint64
	for i, c := range counts {
		seen += c - prev[i]
		if 2*seen >= total {
			lo := buckets[i]
			if math.IsInf(lo, -1) || lo < 0 {
				lo = 0
			}
			return time.Duration(lo * float64(time.Second)), true
		}
	}
	return 0, false
}
