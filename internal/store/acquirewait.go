package store

import "time"

// AcquireObserver is told how long each of a call's waits for a free
// connection lasted, a failed one included (it waited its whole bound).
// The admission controller moves its in-flight limit on it: the wait for
// a connection is the queue the limit can shorten (internal/admission,
// waitlimit.go).
type AcquireObserver interface {
	Acquired(wait time.Duration)
}
