package store

import (
	"context"
	"sync/atomic"
)

// Head is work a call's gate puts at the head of the call's transaction:
// its statements go out right after BEGIN (and the call's time limits) in
// the transaction's first pipeline, and Check runs when their results
// came, before any result of the statements queued after them is read.
// The gate's admission then costs no round trip of its own.
//
// The statements after the head run speculatively: when Check fails (a
// refusal), the transaction is rolled back, so they leave nothing, and
// every later statement of it, and its commit, answer Check's error.
type Head struct {
	Pipeline
	// Check reads the head's outcome (what its queued functions kept); ctx
	// is the call's.
	Check func(ctx context.Context) error

	taken atomic.Bool
}

// TakesHeads reports whether t's transactions take the head their
// context carries (a Store's do): a head another transactor would drop
// must not be relied on.
func TakesHeads(t any) bool {
	_, ok := t.(*Store)
	return ok
}

type headKey struct{}

// WithHead returns ctx carrying h for the next transaction begun with it;
// h nil hides a head ctx carries.
func WithHead(ctx context.Context, h *Head) context.Context {
	return context.WithValue(ctx, headKey{}, h)
}

// takeHead returns the head ctx carries, once: a transaction begun later
// in the same call (a nested WithTx) does not run it again.
func takeHead(ctx context.Context) *Head {
	h, _ := ctx.Value(headKey{}).(*Head)
	if h == nil || !h.taken.CompareAndSwap(false, true) {
		return nil
	}
	return h
}
