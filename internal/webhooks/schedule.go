package webhooks

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Backoff is the wait before each retry after a failed attempt, as Standard
// Webhooks recommends (about three days in all, like Stripe): the first
// retry 5 s after the first failure, the ninth 24 h after the eighth
// failure. A delivery is dead after MaxAttempts failures.
var Backoff = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour,
	10 * time.Hour, 14 * time.Hour, 20 * time.Hour, 24 * time.Hour,
}

// MaxAttempts is the first attempt and one per Backoff entry.
var MaxAttempts = len(Backoff) + 1

// Jitter is the spread of each wait: ±10 %.
const Jitter = 0.10

// MaxRetryAfter bounds the wait a receiver may ask for with Retry-After.
const MaxRetryAfter = 24 * time.Hour

// backoff is the wait after the failed attempt number failed (1-based), r
// in [0, 1) choosing the jitter.
func backoff(failed int, r float64) time.Duration {
	d := Backoff[min(max(failed, 1), len(Backoff))-1]
	return time.Duration(float64(d) * (1 - Jitter + 2*Jitter*r))
}

// retryAfter reads a Retry-After header (seconds or an HTTP date) as a
// wait from now, bounded to [1 s, MaxRetryAfter]; false when absent or
// unreadable.
func retryAfter(h string, now time.Time) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	var d time.Duration
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		d = time.Duration(min(n, int64(MaxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = t.Sub(now)
	} else {
		return 0, false
	}
	return min(max(d, time.Second), MaxRetryAfter), true
}

// Outcome is what became of one attempt.
type Outcome string

// Outcomes of an attempt (the outcome label of the delivery metrics).
const (
	OutcomeDelivered Outcome = "delivered" // 2xx
	OutcomeRetry     Outcome = "retry"     // failed; pending again
	OutcomeDead      Outcome = "dead"      // failed the last time
	OutcomeGone      Outcome = "gone"      // 410: webhook paused
	OutcomeCancelled Outcome = "cancelled" // cancelled by the worker (paused webhook)
	OutcomeReleased  Outcome = "released"  // the worker stopped mid-attempt; not counted
)

// result is one attempt's answer: a status, or an error when none came.
type result struct {
	status     int
	retryAfter string // the Retry-After header of a 429 or 503
	err        error
}

// decision is what to write for an attempt.
type decision struct {
	outcome Outcome
	state   string
	next    *time.Time
}

// decide applies the delivery rules to the attempt number attempt
// (1-based) that ended at now: 2xx delivered; 410 pauses the webhook and
// cancels; 429 and 503 wait what Retry-After asks; any other status (3xx
// included: redirects are not followed) or error retries after Backoff,
// and the last failure is dead.
func decide(res result, attempt int, now time.Time, r float64) decision {
	switch {
	case res.err == nil && res.status >= 200 && res.status < 300:
		return decision{outcome: OutcomeDelivered, state: StateDelivered}
	case res.err == nil && res.status == http.StatusGone:
		return decision{outcome: OutcomeGone, state: StateCancelled}
	case attempt >= MaxAttempts:
		return decision{outcome: OutcomeDead, state: StateDead}
	}
	wait := backoff(attempt, r)
	if res.err == nil && slices.Contains([]int{http.StatusTooManyRequests, http.StatusServiceUnavailable}, res.status) {
		if d, ok := retryAfter(res.retryAfter, now); ok {
			wait = d
		}
	}
	next := now.Add(wait)
	return decision{outcome: OutcomeRetry, state: StatePending, next: &next}
}

// describe is the last error recorded when no status came back.
func describe(err error) string {
	if f, ok := isForbiddenDial(err); ok {
		return f.Error()
	}
	s := err.Error()
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// snapshot is a pg_snapshot in its text form xmin:xmax:xip,...
type snapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

func parseSnapshot(s string) (snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("webhooks: bad snapshot %q", s)
	}
	var sn snapshot
	var err error
	if sn.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("webhooks: bad snapshot %q", s)
	}
	if sn.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("webhooks: bad snapshot %q", s)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snapshot{}, fmt.Errorf("webhooks: bad snapshot %q", s)
			}
			sn.xip = append(sn.xip, v)
		}
	}
	return sn, nil
}

// visible is pg_visible_in_snapshot for a transaction known to have
// committed: it had committed when the snapshot was taken.
func (s snapshot) visible(xid uint64) bool {
	switch {
	case xid < s.xmin:
		return true
	case xid >= s.xmax:
		return false
	}
	return !slices.Contains(s.xip, xid)
}
