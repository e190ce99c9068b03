package gctarget

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFloorPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		floor, live, roots uint64
		base, want         int
	}{
		{256 * mib, 10 * mib, 0, 400, 2460},       // goal 10 + 10 x 24.6 = 256
		{256 * mib, 10 * mib, 6 * mib, 400, 1537}, // roots count in the goal
		{256 * mib, 0, 0, 400, 6300},              // no collection yet: the runtime's 4 MB
		{256 * mib, 60 * mib, 0, 400, 400},        // 5 x 60 > 256: the base
		{256 * mib, 300 * mib, 0, 100, 100},       // past the floor
		{1 << 62, 4 * mib, 0, 100, 2147483647},    // bounded
		{8 * mib, 4 * mib, 0, 100, 100},           // the base already reaches it
	} {
		assert.Equal(t, tc.want, FloorPercent(tc.floor, tc.live, tc.roots, tc.base), "%+v", tc)
	}
}

// The floor follows the real collector: the goal reaches the floor after
// a collection, falls back to the base percentage over a live heap the
// floor cannot hold, and rises to the floor again once it is gone.
func TestTheHeapGoalStaysAtTheFloorAcrossCollections(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const floor = 96 << 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	StartFloor(ctx, floor, 100, debug.SetGCPercent)
	runtime.GC()
	require.Eventually(t, func() bool { return heapGoal() >= floor*9/10 }, 5*time.Second, 10*time.Millisecond,
		"the goal after a collection: %d MiB", heapGoal()>>20)

	big := make([]byte, 80<<20) // live: 80 + 80 x 100 % > 96
	for i := range big {
		big[i] = 1
	}
	runtime.GC()
	require.Eventually(t, func() bool { return heapGoal() >= 150<<20 && gcPercent() == 100 }, 5*time.Second, 10*time.Millisecond,
		"the base over a large live heap: goal %d MiB, GOGC %d", heapGoal()>>20, gcPercent())
	runtime.KeepAlive(big)
	big = nil

	runtime.GC()
	runtime.GC()
	require.Eventually(t, func() bool { g := heapGoal(); return g >= floor*9/10 && g < 150<<20 }, 5*time.Second, 10*time.Millisecond,
		"the floor again: goal %d MiB", heapGoal()>>20)

	cancel()
	debug.SetGCPercent(100)
	runtime.GC()
	runtime.GC()
	time.Sleep(50 * time.Millisecond) // a cleanup queued by the collection runs by then
	assert.Equal(t, 100, gcPercent(), "the floor stopped with its context")
}

func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
