package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wait for a slot ends with the handshake's deadline, and leaves the
// queue as it was.
func TestATurnWaitsNoLongerThanTheHandshakesDeadline(t *testing.T) {
	tu := newTurns(1)
	require.NoError(t, tu.acquire(t.Context(), false))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := tu.acquire(ctx, false)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
	tu.release()
	assert.Zero(t, tu.inUse)
	assert.Empty(t, tu.waiting[0])
	assert.Empty(t, tu.waiting[1])
}

// A handshake under way gets the next slot before a new one that waited
// longer.
func TestAHandshakeUnderWayGoesFirst(t *testing.T) {
	tu := newTurns(1)
	require.NoError(t, tu.acquire(t.Context(), false))
	order := make(chan string, 2)
	queued := func(n int) {
		require.Eventually(t, func() bool {
			tu.mu.Lock()
			defer tu.mu.Unlock()
			return len(tu.waiting[0])+len(tu.waiting[1]) == n
		}, 5*time.Second, time.Millisecond)
	}
	go func() {
		if tu.acquire(t.Context(), false) == nil {
			order <- "new"
			tu.release()
		}
	}()
	queued(1)
	go func() {
		if tu.acquire(t.Context(), true) == nil {
			order <- "under way"
			tu.release()
		}
	}()
	queued(2)
	tu.release()
	assert.Equal(t, "under way", <-order)
	assert.Equal(t, "new", <-order)
}
