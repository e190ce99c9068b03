// Package gctarget raises the Go collector's target while a gateway
// completes TLS handshakes at a storm's rate, and sets it back once the
// storm has passed, returning the storm's garbage to the operating system.
//
// A gateway-only process runs with a tight target (GOGC 20) so that its
// idle sessions stay small. In a reconnect storm (a restarted gateway, or
// every daemon dropping at once) each returning session allocates about
// 100 KB, mostly in crypto/tls, and at 20 the collector marks about five
// bytes of live heap per byte allocated: a quarter of the storm's CPU.
// During the storm the heap may grow (GOMEMLIMIT, read by the runtime,
// still caps it: the target set here is only the collector's percentage);
// afterwards the heap is collected at the tight target again and its free
// pages go back to the OS. What cannot go back is the storm's
// fragmentation: the sessions' long-lived objects were allocated among the
// handshakes' garbage, and a span with one live object stays in use, so
// the higher the storm's target, the more heap an idle session keeps
// (StormPercent).
package gctarget

import (
	"context"
	"expvar"
	"log/slog"
	"time"
)

// The storm's thresholds. Handshakes are counted per Tick; a tick at
// EnterPerSecond or more enters the storm, and QuietFor of ticks below
// LeavePerSecond ends it. A gateway of 10,000 daemons sees a few
// handshakes a minute when nothing happens and 500 to 1,000 a second when
// they all come back, so both thresholds sit far from either.
const (
	Tick           = 250 * time.Millisecond
	EnterPerSecond = 100
	LeavePerSecond = 20
	QuietFor       = 2 * time.Second
	// StormPercent is the collector's target during a storm. Measured
	// (docs/benchmarks-notes.md, "storm-aware collector target"): 50
	// cuts the returning sessions' CPU by 10 to 27 % with the idle
	// sessions' resident memory about as before (at 2,000 sessions their
	// heap in use 1.5 KiB more, the pages returned 1.7 KiB less; at
	// 10,000, 0.5 KiB more in all); 200 cuts 18 to 28 % at 2,000 but
	// leaves 5 KiB more per idle session, 400 10 KiB.
	StormPercent = 50
)

var (
	stats      = expvar.NewMap("gctarget")
	statStorm  = new(expvar.Int) // 1 while a storm's target is set
	statStorms = new(expvar.Int) // storms entered
	statFreed  = new(expvar.Int) // storms left, their garbage returned to the OS
)

func init() {
	stats.Set("storm", statStorm)
	stats.Set("storms", statStorms)
	stats.Set("freed", statFreed)
}

// Policy follows a count of completed handshakes and sets the collector's
// target. The zero value is not usable: use New.
type Policy struct {
	idle, storm int
	handshakes  func() int64  // gateway.Handshakes
	setGC       func(int) int // debug.SetGCPercent
	freeOS      func()        // debug.FreeOSMemory
	log         *slog.Logger

	// Step's state (one goroutine: Run's, or a test's).
	seen       int64
	at         time.Time
	inStorm    bool
	stormAt    time.Time
	stormCount int64 // handshakes when the storm began
	quietSince time.Time
}

// New returns a policy that reads the count of completed handshakes
// from handshakes, sets idle outside storms and storm during them
// through setGC, and calls freeOS once as each storm ends. It sets
// nothing until a storm.
func New(idle, storm int, handshakes func() int64, setGC func(int) int, freeOS func(), log *slog.Logger) *Policy {
	return &Policy{idle: idle, storm: storm, handshakes: handshakes, setGC: setGC, freeOS: freeOS, log: log}
}

// Run steps the policy every Tick until ctx ends, then sets the idle
// target back if a storm's was set.
func (p *Policy) Run(ctx context.Context) {
	t := time.NewTicker(Tick)
	defer t.Stop()
	p.Step(time.Now())
	for {
		select {
		case <-ctx.Done():
			if p.inStorm {
				p.setGC(p.idle)
				statStorm.Set(0)
			}
			return
		case now := <-t.C:
			p.Step(now)
		}
	}
}

// Step looks at the handshakes since the last step and enters or leaves
// a storm. The first call only takes the count.
func (p *Policy) Step(now time.Time) {
	n := p.handshakes()
	if p.at.IsZero() {
		p.seen, p.at = n, now
		return
	}
	dt := now.Sub(p.at)
	if dt <= 0 {
		return
	}
	rate := float64(n-p.seen) / dt.Seconds()
	since := p.at // the window this step measured began then
	p.seen, p.at = n, now
	switch {
	case !p.inStorm && rate >= EnterPerSecond:
		p.inStorm, p.stormAt, p.stormCount, p.quietSince = true, now, n, time.Time{}
		p.setGC(p.storm)
		statStorm.Set(1)
		statStorms.Add(1)
		p.log.Info("handshake storm: collector target raised", "handshakesPerSecond", int(rate), "gcPercent", p.storm)
	case p.inStorm && rate >= LeavePerSecond:
		p.quietSince = time.Time{}
	case p.inStorm:
		if p.quietSince.IsZero() {
			p.quietSince = since
		}
		if now.Sub(p.quietSince) < QuietFor {
			return
		}
		p.inStorm = false
		p.setGC(p.idle)
		start := time.Now()
		p.freeOS()
		statStorm.Set(0)
		statFreed.Add(1)
		p.log.Info("handshake storm passed: collector target lowered, memory returned to the OS",
			"gcPercent", p.idle, "handshakes", n-p.stormCount, "storm", now.Sub(p.stormAt).Round(time.Millisecond),
			"freeTook", time.Since(start).Round(time.Millisecond))
	}
}

// InStorm reports whether the storm's target is set (Step's goroutine
// only).
func (p *Policy) InStorm() bool { return p.inStorm }
