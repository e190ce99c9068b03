package webhooks_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/store"
	"computeplane/internal/webhooks"
)

// A fan-out that reads a committed event makes three database round trips
// when a webhook matches it (its batch with the webhooks of the event's
// tenant in one statement, the deliveries' insert, the COMMIT with the
// place's move) and two when none does; each fan-out runs after every
// commit that carries events. Counted on the wire (store.CountRoundTrips).
func TestAFanOutIsOneStatementAndItsWrites(t *testing.T) {
	t.Parallel()
	f := setup(t, private)
	rc := newReceiver(t)
	e := f.engine(t, nil, webhooks.EngineOptions{})
	mustCreate(t, f.acme, "acme", rc.URL(), "site.*")
	f.fanOut(t, e) // the webhook's own events, if any, are behind

	// fanOutOne runs FanOut until it reads the event published last and
	// returns the round trips of that call.
	fanOutOne := func() int64 {
		var trips int64
		require.Eventually(t, func() bool {
			var n atomic.Int64
			read, err := e.FanOut(store.CountRoundTrips(context.Background(), &n), nil, 100)
			require.NoError(t, err)
			trips = n.Load()
			return read == 1
		}, 10*time.Second, 5*time.Millisecond, "the event is fanned out")
		return trips
	}

	matched := f.publish(t, "acme", "site.created", "matched")
	trips := fanOutOne()
	t.Logf("a fan-out queueing a delivery: %d round trips", trips)
	assert.LessOrEqual(t, trips, int64(3))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE event_id = $1", matched))

	other := f.publish(t, "globex", "site.created", "no webhook")
	trips = fanOutOne()
	t.Logf("a fan-out queueing none: %d round trips", trips)
	assert.LessOrEqual(t, trips, int64(2))
	assert.Zero(t, f.count(t, "SELECT count(*) FROM webhook_deliveries WHERE event_id = $1", other))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM webhook_fanout WHERE (after_xid, after_seq) = (SELECT xid, seq FROM outbox WHERE id = $1)", other),
		"the place moved past it")
}
