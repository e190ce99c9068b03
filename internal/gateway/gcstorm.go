package gateway

import (
	"context"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// A process that runs the gateway role alone keeps its collector target
// low (cmd/computed: 20 %): its heap is mostly idle sessions. In a
// reconnect storm (thousands of handshakes within seconds after a restart)
// that target made the collector 15 % of the gateway's CPU, so while hellos
// arrive at StormHellos a second or more the target is raised to the storm
// one, and StormCalm after the last such second it returns to the idle one
// and the heap grown in the storm is collected and given back to the
// system at once (debug.FreeOSMemory).
const (
	StormHellos = 100
	StormCalm   = 3 * time.Second
)

var gcTargets struct {
	idle, storm atomic.Int32 // 0: not adapted (GOGC set, or other roles)
}

// AdaptGC lets the gateway switch the process's collector target between
// idle and storm (percent, as debug.SetGCPercent) by its hellos; the
// process has set idle already. Not called: the target is left alone.
func AdaptGC(idle, storm int) {
	gcTargets.idle.Store(int32(idle))
	gcTargets.storm.Store(int32(storm))
}

// helloCount counts hellos for gcStormLoop.
var helloCount atomic.Int64

// setGCPercent and freeOSMemory are the runtime's (a test watches them).
var (
	setGCPercent = debug.SetGCPercent
	freeOSMemory = debug.FreeOSMemory
)

// gcStormLoop watches the hellos a second until ctx ends.
func gcStormLoop(ctx context.Context, log interface{ Info(string, ...any) }) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last int64
	var storm bool
	var calmSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		idle, high := int(gcTargets.idle.Load()), int(gcTargets.storm.Load())
		if high == 0 {
			continue
		}
		n := helloCount.Load()
		rate := n - last
		last = n
		switch {
		case rate >= StormHellos:
			calmSince = time.Time{}
			if !storm {
				storm = true
				setGCPercent(high)
				log.Info("gateway: reconnect storm, collector target raised", "hellosPerSecond", rate, "gcPercent", high)
			}
		case storm && calmSince.IsZero():
			calmSince = time.Now()
		case storm && time.Since(calmSince) >= StormCalm:
			storm = false
			setGCPercent(idle)
			freeOSMemory()
			log.Info("gateway: storm over, collector target back", "gcPercent", idle)
		}
	}
}
