package gateway

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A second with StormHellos hellos raises the collector target; StormCalm
// after the last such second it returns and the heap is given back. Not
// parallel: it replaces the package's runtime hooks.
func TestCollectorTargetRisesInAStormAndReturnsAfterIt(t *testing.T) {
	var mu sync.Mutex
	var set []int
	freed := 0
	setGCPercent, freeOSMemory = func(p int) int {
		mu.Lock()
		defer mu.Unlock()
		set = append(set, p)
		return 0
	}, func() {
		mu.Lock()
		defer mu.Unlock()
		freed++
	}
	AdaptGC(20, 100)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { gcStormLoop(ctx, slog.New(slog.DiscardHandler)) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		AdaptGC(0, 0)
	})
	seen := func() ([]int, int) {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), set...), freed
	}

	// A trickle is no storm.
	for range 3 {
		helloCount.Add(StormHellos / 4)
		time.Sleep(time.Second)
	}
	s, _ := seen()
	assert.Empty(t, s)

	// A storm: raised while it lasts.
	stormEnd := time.Now().Add(3 * time.Second)
	for time.Now().Before(stormEnd) {
		helloCount.Add(StormHellos / 5)
		time.Sleep(50 * time.Millisecond)
	}
	s, f := seen()
	assert.Equal(t, []int{100}, s)
	assert.Zero(t, f)
	require.Eventually(t, func() bool { s, f = seen(); return len(s) == 2 }, StormCalm+3*time.Second, 50*time.Millisecond)
	assert.Equal(t, []int{100, 20}, s)
	assert.Equal(t, 1, f, "the storm's heap given back once")
}
