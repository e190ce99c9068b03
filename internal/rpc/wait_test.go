package rpc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/uow"
)

// topics is a Subscriber whose wakes the test sends.
type topics struct{ ch chan struct{} }

func (s topics) Subscribe(string) (<-chan struct{}, func()) { return s.ch, func() {} }

// thenCall runs the function a mutation's ThenPoll left, as the envelope
// does after commit.
func thenCall(t *testing.T, wakes Subscriber, poll func(ctx context.Context)) (any, error) {
	t.Helper()
	ctx := context.WithValue(t.Context(), wakesKey{}, wakes)
	u, err := uow.Run(ctx, noTx{}, false, func(ctx context.Context, _ *uow.Unit) error { poll(ctx); return nil })
	require.NoError(t, err)
	then := u.Continuation()
	require.NotNil(t, then)
	return then(ctx)
}

// noTx runs a unit of work without a database.
type noTx struct{}

func (noTx) WithTx(ctx context.Context, _ bool, fn func(context.Context, pgx.Tx) error) error {
	return fn(ctx, nil)
}

// takingTopics is a Subscriber and Taker: the test offers a value, then
// wakes, as WakeUnit does after a commit in this process.
type takingTopics struct {
	topics
	fn atomic.Pointer[func(any)]
}

func (s *takingTopics) Take(_ string, fn func(any)) func() {
	s.fn.Store(&fn)
	return func() { s.fn.Store(nil) }
}

func (s *takingTopics) offerAndWake(v any) {
	if fn := s.fn.Load(); fn != nil {
		(*fn)(v)
	}
	s.ch <- struct{}{}
}

// A value offered with the wake that ends the wait answers it without a
// re-read; one the wait is not done with only wakes it (the read runs).
func TestThenPollAnswersAnOfferWithoutARead(t *testing.T) {
	wakes := &takingTopics{topics: topics{ch: make(chan struct{}, 1)}}
	var reads atomic.Int32
	out, err := thenCall(t, wakes, func(ctx context.Context) {
		ThenPoll(ctx, Poll{Timeout: 20 * time.Second, Topic: "instance/i-1", First: time.Hour,
			Offered: func(v any) (any, bool) { return v, v == "running" }},
			func(context.Context) (any, bool, error) {
				switch reads.Add(1) {
				case 1:
					wakes.offerAndWake("starting") // not done: read
					return "creating", false, nil
				case 2:
					wakes.offerAndWake("running")
					return "starting", false, nil
				}
				return "read", true, nil
			})
	})
	require.NoError(t, err)
	assert.Equal(t, "running", out, "the offered value answers")
	assert.EqualValues(t, 2, reads.Load(), "the first read and the one after the offer it was not done with; none after the last")
	assert.Nil(t, wakes.fn.Load(), "the wait stopped taking")
}

// A wake-up re-reads at once: with a backoff step of an hour, only the
// wake can end this wait before its timeout.
func TestThenPollReadsAgainAtAWakeUp(t *testing.T) {
	wakes := topics{ch: make(chan struct{}, 1)}
	var reads atomic.Int32
	start := time.Now()
	out, err := thenCall(t, wakes, func(ctx context.Context) {
		ThenPoll(ctx, Poll{Timeout: 20 * time.Second, Topic: "instance/i-1", First: time.Hour}, func(context.Context) (any, bool, error) {
			if reads.Add(1) == 1 {
				wakes.ch <- struct{}{} // changed right after the first read
				return "creating", false, nil
			}
			return "running", true, nil
		})
	})
	require.NoError(t, err)
	assert.Equal(t, "running", out)
	assert.EqualValues(t, 2, reads.Load())
	assert.Less(t, time.Since(start), 10*time.Second, "answered at the wake-up, not at the timeout")
}

// Without a topic (or a notifier) the backoff alone re-reads; the timeout
// answers the last output, or TimedOut.
func TestThenPollBacksOffAndTimesOut(t *testing.T) {
	var reads atomic.Int32
	out, err := thenCall(t, nil, func(ctx context.Context) {
		ThenPoll(ctx, Poll{Timeout: 300 * time.Millisecond, Initial: "initial", First: 10 * time.Millisecond}, func(context.Context) (any, bool, error) {
			reads.Add(1)
			return nil, false, nil
		})
	})
	require.NoError(t, err)
	assert.Equal(t, "initial", out, "a timeout is not an error")
	// 10, 20, 40, 80, 160 ms: six reads with the first, give or take
	// a slow scheduler.
	assert.GreaterOrEqual(t, reads.Load(), int32(3))
	assert.LessOrEqual(t, reads.Load(), int32(7), "it backs off")

	// Nothing was ever read back (and no Initial): UNAVAILABLE, repeat
	// the call.
	_, err = thenCall(t, nil, func(ctx context.Context) {
		ThenPoll(ctx, Poll{Timeout: 30 * time.Millisecond}, func(context.Context) (any, bool, error) { return nil, false, nil })
	})
	var e *api.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, api.CodeUnavailable, e.Code)
	assert.Contains(t, e.Details, "retryAfterMs")

	timedOut := errors.New("no answer")
	_, err = thenCall(t, nil, func(ctx context.Context) {
		ThenPoll(ctx, Poll{Timeout: 30 * time.Millisecond, TimedOut: timedOut}, func(context.Context) (any, bool, error) { return nil, false, nil })
	})
	assert.ErrorIs(t, err, timedOut)
}
