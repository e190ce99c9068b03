package gctarget

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is the collector as the policy sees it: the targets set and
// the times memory was returned.
type recorder struct {
	handshakes atomic.Int64 // completed, as gateway.Handshakes counts them
	set        []int
	freed      int
	// freedAt is the last target set when memory was returned.
	freedAt []int
}

func (r *recorder) setGC(v int) int { r.set = append(r.set, v); return 0 }
func (r *recorder) freeOS() {
	r.freed++
	if len(r.set) > 0 {
		r.freedAt = append(r.freedAt, r.set[len(r.set)-1])
	}
}

func newPolicy(r *recorder) *Policy {
	return New(20, StormPercent, r.handshakes.Load, r.setGC, r.freeOS, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// ticks steps the policy n ticks from *now, with perTick handshakes
// completed (counted in r) before each.
func ticks(r *recorder, p *Policy, now *time.Time, n, perTick int) {
	for range n {
		for range perTick {
			r.handshakes.Add(1)
		}
		*now = now.Add(Tick)
		p.Step(*now)
	}
}

func TestPolicyRaisesTheTargetInAStormAndSetsItBackOnceQuiet(t *testing.T) {
	r := &recorder{}
	p := newPolicy(r)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	p.Step(now)

	// Sessions coming and going at a quiet gateway's pace: nothing set.
	ticks(r, p, &now, 40, 1) // 4 a second
	assert.Empty(t, r.set)
	assert.False(t, p.InStorm())

	// A reconnect storm: 1,000 handshakes a second.
	ticks(r, p, &now, 1, 250)
	require.Equal(t, []int{StormPercent}, r.set, "the storm's target at its first tick")
	assert.True(t, p.InStorm())
	ticks(r, p, &now, 20, 250)
	assert.Equal(t, []int{StormPercent}, r.set, "set once for the whole storm")

	// The tail: stragglers below the leave rate, not yet for QuietFor.
	quietTicks := int(QuietFor / Tick)
	ticks(r, p, &now, quietTicks-1, 1)
	assert.True(t, p.InStorm())
	assert.Zero(t, r.freed, "not freed before QuietFor")
	// A burst above the leave rate (but under the enter rate) restarts
	// the quiet period.
	ticks(r, p, &now, 1, LeavePerSecond/4+5)
	ticks(r, p, &now, quietTicks-1, 0)
	assert.True(t, p.InStorm(), "the quiet period restarts after a busier tick")
	ticks(r, p, &now, 1, 0)
	assert.False(t, p.InStorm())
	assert.Equal(t, []int{StormPercent, 20}, r.set, "the idle target set back")
	assert.Equal(t, 1, r.freed, "memory returned once")
	assert.Equal(t, []int{20}, r.freedAt, "returned after the idle target is set, so the collection it forces uses it")

	// Quiet afterwards: nothing more.
	ticks(r, p, &now, 40, 0)
	assert.Equal(t, []int{StormPercent, 20}, r.set)
	assert.Equal(t, 1, r.freed)

	// A second storm enters and leaves again, freeing once more.
	ticks(r, p, &now, 4, 300)
	ticks(r, p, &now, quietTicks, 0)
	assert.Equal(t, []int{StormPercent, 20, StormPercent, 20}, r.set)
	assert.Equal(t, 2, r.freed)
}

func TestPolicyIgnoresRatesBelowTheStorm(t *testing.T) {
	r := &recorder{}
	p := newPolicy(r)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	p.Step(now)
	// Just under the enter rate, for a minute.
	ticks(r, p, &now, 240, EnterPerSecond/4-1)
	assert.Empty(t, r.set)
	assert.Zero(t, r.freed)
	// At the enter rate.
	ticks(r, p, &now, 1, EnterPerSecond/4)
	assert.Equal(t, []int{StormPercent}, r.set)
}

func TestPolicyRateIsPerSecondOfTheClock(t *testing.T) {
	r := &recorder{}
	p := newPolicy(r)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	p.Step(now)
	// 100 handshakes over 10 s (a late tick) is 10 a second: no storm.
	for range 100 {
		r.handshakes.Add(1)
	}
	now = now.Add(10 * time.Second)
	p.Step(now)
	assert.Empty(t, r.set)
}

func TestRunSetsTheIdleTargetBackWhenItEnds(t *testing.T) {
	statStorm.Set(0)
	r := &recorder{}
	p := newPolicy(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	// Handshakes at far more than the storm's rate until Run has set
	// the storm's target (it owns the recorder until it returns, so
	// watch the expvar it sets).
	require.Eventually(t, func() bool {
		for range 200 {
			r.handshakes.Add(1)
		}
		return statStorm.Value() == 1
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	<-done
	assert.Equal(t, []int{StormPercent, 20}, r.set)
	assert.Zero(t, statStorm.Value())
}
