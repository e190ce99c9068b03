package store

import (
	"context"
	"time"
)

// AcquireObserver is told how long each of a call's waits for a free
// connection lasted, a failed one included (it waited its whole bound).
// The admission controller moves its in-flight limit on it: the wait for
// a connection is the queue the limit can shorten (internal/admission,
// waitlimit.go).
type AcquireObserver interface {
	Acquired(wait time.Duration)
}

type acquireObserverKey struct{}

// WithAcquireObserver reports the waits for a connection of ctx's calls
// to o; nil stops reporting.
func WithAcquireObserver(ctx context.Context, o AcquireObserver) context.Context {
	if o == nil && ctx.Value(acquireObserverKey{}) == nil {
		return ctx
	}
	return context.WithValue(ctx, acquireObserverKey{}, o)
}

// acquireObserver is ctx's observer, nil when none.
func acquireObserver(ctx context.Context) AcquireObserver {
	o, _ := ctx.Value(acquireObserverKey{}).(AcquireObserver)
	return o
}
