package admission

import (
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With the run queue judged, the limit is cut after two intervals in a
// row whose median run-queue wait stood past its target, not draining,
// even while every acquire is quick (a server short of CPU with its pool
// free), and grows again only after an interval where neither queue
// stood.
func TestWaitLimitFollowsAStandingRunQueue(t *testing.T) {
	now := time.Unix(1000, 0)
	w := newWaitLimit(8, 256, 5*time.Millisecond, now.Add(time.Millisecond))
	run := time.Duration(0)
	w.runWait, w.runTarget = func() (time.Duration, bool) { return run, true }, 2*time.Millisecond
	// Each interval: 100 quick acquires with as many calls in flight as
	// the limit lets in (at most 200); its run-queue median is read as
	// the next interval's first acquire closes it.
	interval := func(median time.Duration) int64 {
		run = median
		var l int64
		for range 100 {
			now = now.Add(time.Millisecond)
			l = w.acquired(now, 0, int(min(200, w.current())))
		}
		return l
	}
	interval(0)
	interval(0)
	assert.Equal(t, int64(256), interval(8*time.Millisecond), "no run queue stood before: stays at the ceiling")
	assert.Equal(t, int64(100), interval(8*time.Millisecond), "the second interval past the target: 200 in flight halved (target / median is a quarter, at most halving)")
	assert.Equal(t, int64(50), interval(8*time.Millisecond), "still standing: halved again")
	assert.Equal(t, int64(50), interval(3*time.Millisecond), "a run queue that drains is left to drain")
	assert.Equal(t, int64(33), interval(3*time.Millisecond), "one that stands again, not draining: 50 x 2/3")
	assert.Equal(t, int64(36), interval(time.Millisecond), "within the target: grows by a tenth")
}

// Without the run queue judged the same load never cuts the limit: the
// acquires are quick (the test above is the change's).
func TestWaitLimitWithoutRunQueueIgnoresTheCPU(t *testing.T) {
	now := time.Unix(1000, 0)
	w := newWaitLimit(8, 256, 5*time.Millisecond, now.Add(time.Millisecond))
	for range 10 {
		for range 100 {
			now = now.Add(time.Millisecond)
			w.acquired(now, 0, 200)
		}
	}
	assert.Equal(t, int64(256), w.current())
}

// medianSince takes the median of what was added since the previous read,
// as its bucket's lower bound, and says when nothing was.
func TestMedianSince(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0, 0.001, 0.002, 0.004, math.Inf(1)}
	prev := []uint64{5, 100, 0, 0, 0}
	_, ok := medianSince(prev, prev, buckets)
	assert.False(t, ok, "nothing new")
	m, ok := medianSince([]uint64{5, 101, 0, 3, 0}, prev, buckets)
	require.True(t, ok)
	assert.Equal(t, 2*time.Millisecond, m, "1 new in [0, 1 ms), 3 in [2 ms, 4 ms): the median is in the second")
	m, ok = medianSince([]uint64{6, 100, 0, 0, 0}, prev, buckets)
	require.True(t, ok)
	assert.Zero(t, m, "a -Inf lower bound reads as 0")
}

// The real runtime histogram: goroutines made to wait for one processor
// raise the median wait the reader sees, and an idle interval reports
// nothing new.
func TestRunQueueReadsTheScheduler(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := newRunQueue()
	time.Sleep(10 * time.Millisecond)
	r.median()
	// 64 goroutines each spinning 2 ms at a time on one processor: each
	// waits its turn behind the others.
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 5 {
				spin(2 * time.Millisecond)
				runtime.Gosched()
			}
		})
	}
	wg.Wait()
	m, ok := r.median()
	require.True(t, ok)
	assert.GreaterOrEqual(t, m, time.Millisecond, "goroutines queued behind 63 others of 2 ms each")
}

func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}
