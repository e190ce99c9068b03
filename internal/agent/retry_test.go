package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A gateway's daemons all lose it at the same instant when it is killed,
// dial it at once (refused: nothing listens yet) and then retry with Run's
// backoff (BackoffMin doubling to DrainRetryMax, RetryDelay's jitter).
// Wherever in the first seconds the restarted gateway starts listening, a
// few dozen of its daemons (enough to keep its handshake turns busy) dial
// within 50 ms; with the jitter only on the top third of each wait the
// retries came in rounds (0.2-0.3, 0.6-0.9, 1.4-2.1 s) and a gateway
// listening at 0.35 s waited 0.25 s for its first daemon.
func TestAFleetsRetriesLeaveNoGapAfterARestart(t *testing.T) {
	const daemons, horizon = 10000, 4 * time.Second
	var dials []time.Duration
	for range daemons {
		at, backoff := time.Duration(0), BackoffMin
		for at < horizon {
			backoff = min(backoff, DrainRetryMax)
			at += RetryDelay(backoff)
			dials = append(dials, at)
			backoff = min(2*backoff, DrainRetryMax)
		}
	}
	slices.Sort(dials)
	worst, worstAt := time.Duration(0), time.Duration(0)
	for listen := 100 * time.Millisecond; listen <= 3*time.Second; listen += 10 * time.Millisecond {
		i, _ := slices.BinarySearch(dials, listen)
		// The 64th dial at or after the listen: the tool's dial slots, and
		// 16 times the turns of a one-core gateway.
		if wait := dials[i+63] - listen; wait > worst {
			worst, worstAt = wait, listen
		}
	}
	assert.Less(t, worst, 50*time.Millisecond, "a gateway listening %s after the kill waits for its 64th daemon", worstAt)
}

// RetryDelay stays within its bounds: at least BackoffMin/4, at most one
// and a half times the backoff (the longest wait of the old jitter).
func TestRetryDelayStaysWithinItsBounds(t *testing.T) {
	for _, b := range []time.Duration{BackoffMin, time.Second, BackoffMax} {
		lo, hi := b, time.Duration(0)
		for range 2000 {
			d := RetryDelay(b)
			lo, hi = min(lo, d), max(hi, d)
		}
		assert.GreaterOrEqual(t, lo, BackoffMin/4, b)
		assert.LessOrEqual(t, hi, b+b/2, b)
		assert.Less(t, lo, b/2, "the jitter reaches the bottom of the wait at %s", b)
	}
}
