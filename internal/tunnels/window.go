package tunnels

import (
	"sync"
	"time"

	"computeplane/gen/api"
)

// window counts events per identity over a sliding period (tunnel opens
// per minute, SSH certificates per hour) on this replica.
type window struct {
	mu   sync.Mutex
	seen map[string][]time.Time // identity -> events within the period
}

// allow records an event of identity at now, unless limit of them fall
// within period: then RATE_LIMITED (what says so) with the time until the
// oldest leaves the window.
func (w *window) allow(identity string, now time.Time, period time.Duration, limit int, what string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen = map[string][]time.Time{}
	}
	keep := w.seen[identity][:0]
	for _, t := range w.seen[identity] {
		if now.Sub(t) < period {
			keep = append(keep, t)
		}
	}
	if len(keep) >= limit {
		w.seen[identity] = keep
		wait := period - now.Sub(keep[0])
		return api.Errorf(api.CodeRateLimited, "%s", what).
			WithDetails(map[string]any{"retryAfterMs": max(wait.Milliseconds(), 1)})
	}
	w.seen[identity] = append(keep, now)
	return nil
}
