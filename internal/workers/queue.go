package workers

import (
	"sync"
	"time"
)

// item is one key of one reconciler.
type item struct {
	rec, key string
}

// queue holds the keys waiting for a Sync, as controller-runtime's work
// queue does: a key is queued at most once, is never synced by two workers
// at a time (added while in a Sync, it is queued again when that Sync ends),
// and can be added after a delay. It counts failures per key for backoff.
type queue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	items  []item
	queued map[item]bool
	active map[item]bool
	dirty  map[item]bool
	fails  map[item]int
	timers map[item]*time.Timer
	closed bool
	timing Timing
}

func newQueue(t Timing) *queue {
	q := &queue{timing: t,
		queued: map[item]bool{}, active: map[item]bool{}, dirty: map[item]bool{},
		fails: map[item]int{}, timers: map[item]*time.Timer{},
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *queue) add(it item) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(it)
}

func (q *queue) addLocked(it item) {
	switch {
	case q.closed || q.queued[it]:
	case q.active[it]:
		q.dirty[it] = true
	default:
		q.queued[it] = true
		q.items = append(q.items, it)
		q.cond.Signal()
	}
}

// afterLocked adds it once d has passed; a key already waiting for a delay
// keeps that one.
func (q *queue) afterLocked(it item, d time.Duration) {
	if q.closed || q.timers[it] != nil {
		return
	}
	q.timers[it] = time.AfterFunc(d, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		delete(q.timers, it)
		q.addLocked(it)
	})
}

// pop waits for a key and marks it active; false once the queue is closed.
func (q *queue) pop() (item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return item{}, false
	}
	it := q.items[0]
	q.items[0] = item{}
	q.items = q.items[1:]
	delete(q.queued, it)
	q.active[it] = true
	return it, true
}

// done ends the Sync of it: a failure adds it again after the backoff for
// its failures in a row, SyncAgain after the SyncAgain delay; a key added
// during the Sync is queued again at once.
func (q *queue) done(it item, res Result, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.active, it)
	var retry time.Duration
	switch {
	case err != nil:
		q.fails[it]++
		retry = backoff(q.fails[it], q.timing.RetryMin, q.timing.RetryMax)
	case res == SyncAgain:
		delete(q.fails, it)
		retry = q.timing.SyncAgain
	default:
		delete(q.fails, it)
	}
	if q.dirty[it] {
		delete(q.dirty, it)
		q.addLocked(it)
	}
	if retry > 0 {
		q.afterLocked(it, retry)
	}
}

// drop ends the Sync of a key whose shard is no longer held, forgetting it.
func (q *queue) drop(it item) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.active, it)
	delete(q.dirty, it)
	delete(q.fails, it)
}

// close wakes every pop and stops the delayed adds.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for it, t := range q.timers {
		t.Stop()
		delete(q.timers, it)
	}
	q.cond.Broadcast()
}
