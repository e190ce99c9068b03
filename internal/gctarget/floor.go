package gctarget

import (
	"context"
	"expvar"
	"math"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
)

// A heap floor keeps the collector's heap goal at or above a size,
// however small the live heap: after each collection it sets the
// collector's percentage so that the next goal is the floor, or base
// percent above the live heap when that is more. An api process keeps
// little (about 10 MB) and allocates with every call (about 50 MB a
// second at half the benchmark's peak), so with a percentage alone it
// collected every second; each mark phase is a stall of 20 ms or so on
// the one core the benchmark gives it, and that stall was the half-load
// p99 (docs/benchmarks-notes.md, "the collector is the half-load tail").
// With a floor of 256 MB a collection comes every few seconds and costs
// the same, since marking follows the live heap, not the goal.
//
// It is the "GOGC tuner" of latency-sensitive Go services, done with the
// runtime's own numbers: the runtime has no minimum heap of its own, and
// GOGC=off with GOMEMLIMIT would make a live heap near the limit collect
// without pause.

// FloorPercent is the percentage whose heap goal is floor bytes for a
// live heap of live bytes and roots (stacks and globals scanned) of
// roots bytes, the runtime's goal being live + (live+roots) x
// percent/100; never below base. A live heap of 0 (no collection yet)
// counts as the runtime's 4 MB minimum.
func FloorPercent(floor, live, roots uint64, base int) int {
	const minHeap = 4 << 20
	live = max(live, minHeap)
	if floor <= live {
		return base
	}
	p := float64(floor-live) * 100 / float64(live+roots)
	if p >= math.MaxInt32 {
		return math.MaxInt32
	}
	return max(base, int(p))
}

// heapSamples are the runtime metrics FloorPercent needs.
func heapSamples() (live, roots uint64) {
	s := []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
	}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64() + s[2].Value.Uint64()
}

// statFloor is the percentage the floor set last (0: no floor).
var statFloor = new(expvar.Int)

func init() { stats.Set("floorPercent", statFloor) }

// StartFloor keeps the heap goal at or above floor bytes until ctx ends,
// with base the percentage to use when the live heap needs more than the
// floor. It sets the percentage at once, through setGC
// (debug.SetGCPercent), and again after every collection; once ctx ends
// it stops following the collections and leaves the last percentage.
func StartFloor(ctx context.Context, floor uint64, base int, setGC func(int) int) {
	var set atomic.Int64
	apply := func() {
		live, roots := heapSamples()
		p := FloorPercent(floor, live, roots, base)
		// Setting the percentage is cheap but not free (the heap lock):
		// leave it when it moved by less than a tenth.
		if old := set.Load(); old != 0 && math.Abs(float64(p-int(old))) < float64(old)/10 {
			return
		}
		set.Store(int64(p))
		setGC(p)
		statFloor.Set(int64(p))
	}
	apply()
	afterEachGC(ctx, apply)
}

// afterEachGC calls f on the cleanup goroutine after each collection
// until ctx ends: a sentinel object that nothing references is
// collected by the next cycle, and its cleanup arms the next one.
func afterEachGC(ctx context.Context, f func()) {
	type sentinel struct{ _ [16]byte } // not a tiny object: those share blocks and may live on
	var arm func()
	arm = func() {
		runtime.AddCleanup(new(sentinel), func(struct{}) {
			if ctx.Err() != nil {
				return
			}
			f()
			arm()
		}, struct{}{})
	}
	arm()
}
