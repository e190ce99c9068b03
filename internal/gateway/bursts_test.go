package gateway

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goroutineID is the calling goroutine's number, from its stack's header.
func goroutineID() string {
	b := make([]byte, 64)
	f := strings.Fields(string(b[:runtime.Stack(b, false)]))
	return f[1] // "goroutine 17 [running]:"
}

func TestBurstPoolKeepsItsGoroutinesBetweenBursts(t *testing.T) {
	p := newBurstPool(4, time.Hour)
	ran := map[string]bool{}
	for i := range 100 {
		want := i%2 == 0
		require.Equal(t, want, p.run(func() bool { ran[goroutineID()] = true; return want }))
	}
	// One burst at a time, on the goroutines kept: a few (one that just
	// ran a burst may not wait for the next yet), not one per burst.
	assert.LessOrEqual(t, len(ran), 10)
	assert.LessOrEqual(t, p.workers.Load(), int32(4))
}

func TestBurstPoolNeverHoldsABurstBehindABusyOne(t *testing.T) {
	p := newBurstPool(2, time.Hour)
	release := make(chan struct{})
	var blocked sync.WaitGroup
	for range 3 { // more stalled bursts than kept goroutines
		blocked.Add(1)
		go func() {
			defer blocked.Done()
			assert.False(t, p.run(func() bool { <-release; return false }))
		}()
	}
	// Every goroutine the pool keeps is stalled (a status write to a
	// database that does not answer, say): another burst still runs.
	require.Eventually(t, func() bool { return p.workers.Load() == 2 }, 5*time.Second, time.Millisecond)
	done := make(chan bool)
	go func() { done <- p.run(func() bool { return true }) }()
	select {
	case ok := <-done:
		assert.True(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("a burst waited for stalled ones")
	}
	assert.LessOrEqual(t, p.workers.Load(), int32(2))
	close(release)
	blocked.Wait()
}

func TestBurstPoolLetsIdleGoroutinesGo(t *testing.T) {
	p := newBurstPool(4, 20*time.Millisecond)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.run(func() bool { time.Sleep(5 * time.Millisecond); return true })
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return p.workers.Load() == 0 }, 5*time.Second, 5*time.Millisecond)
}

// deepBurst uses about 6 KiB of stack, as a burst's frame read and
// decoding do.
//
//go:noinline
func deepBurst(depth int) bool {
	var pad [512]byte
	pad[depth] = byte(depth)
	if depth == 0 {
		return pad[0] == 0
	}
	return deepBurst(depth-1) && pad[depth] == byte(depth)
}

// BenchmarkBurst is the cost of running one burst off the session's
// goroutine: a fresh goroutine each time (its stack grown from 2 KiB on
// every burst) against the pool's kept goroutines; "handshake" is as deep
// as a TLS handshake's goroutine gets (about 24 KiB).
func BenchmarkBurst(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchmarkBurst(b, 11) })
	b.Run("handshake", func(b *testing.B) { benchmarkBurst(b, 47) })
}

func benchmarkBurst(b *testing.B, depth int) {
	fn := func() bool { return deepBurst(depth) }
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			done := make(chan bool, 1)
			go func() { done <- fn() }()
			<-done
		}
	})
	b.Run("pool", func(b *testing.B) {
		b.ReportAllocs()
		p := newBurstPool(burstWorkers, burstLinger)
		for b.Loop() {
			p.run(fn)
		}
	})
}

func TestBurstPoolSpawnsWithoutWaiting(t *testing.T) {
	p := newBurstPool(1, 20*time.Millisecond)
	release := make(chan struct{})
	ran := make(chan int, 3)
	for i := range 3 { // the second and third find the kept goroutine busy
		p.spawn(func() { <-release; ran <- i })
	}
	close(release)
	got := map[int]bool{}
	for range 3 {
		select {
		case i := <-ran:
			got[i] = true
		case <-time.After(5 * time.Second):
			t.Fatal("a spawned function did not run")
		}
	}
	assert.Len(t, got, 3)
	require.Eventually(t, func() bool { return p.workers.Load() == 0 }, 5*time.Second, 5*time.Millisecond)
}
