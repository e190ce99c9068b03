package gateway

import (
	"sync"
	"sync/atomic"
	"time"
)

// A burst of a session's messages (the frame read, the decoding, the
// database) runs off the session's long-lived goroutine, so that the one
// goroutine an idle session keeps stays at the runtime's initial 2 KiB
// stack (idle.go). A fresh goroutine per burst starts at that size too,
// and its stack is grown and copied twice (2 to 4 to 8 KiB) on every
// burst: with thousands of sessions each heartbeat is such a burst, and in
// a reconnect storm the copies (runtime.newstack, copystack) were about 3 %
// of the gateway's CPU. burstPool keeps a few goroutines between bursts
// instead, whose stacks have grown already; a burst finding none waiting
// takes a fresh goroutine as before, so a slow burst (a status written to
// a stalled database) never holds another session's.

// The same holds for a connection's TLS handshake, upgrade and hello, on
// a goroutine of their own that ends once the session is open: its stack
// grows from 2 KiB to 16 or 32 KiB in every handshake (copied at each
// doubling; 2.5 % of a storm's CPU). Those run on kept goroutines too,
// which go soon after a storm, so that an idle gateway keeps none.

const (
	// handshakeWorkers bounds the goroutines kept for handshakes (each
	// with a stack of 16 to 32 KiB while kept), handshakeLinger how long
	// one waits for the next connection.
	handshakeWorkers = 64
	handshakeLinger  = 2 * time.Second
	// burstWorkers bounds the goroutines kept between bursts: bursts are
	// short and run on few cores, and each kept one holds its grown stack
	// (8 KiB or so: well under 0.1 KiB a session at 10,000 sessions).
	burstWorkers = 64
	// burstLinger is how long a kept goroutine waits for another burst.
	burstLinger = 10 * time.Second
)

// burstPool runs functions on goroutines it keeps between calls.
type burstPool struct {
	tasks   chan *burstTask // unbuffered: a send succeeds only to a waiting worker
	workers atomic.Int32    // kept goroutines, running or waiting
	max     int32
	linger  time.Duration
}

type burstTask struct {
	fn   func() bool
	done chan bool // one result, then the task is reused; nil when spawned
}

var burstTasks = sync.Pool{New: func() any { return &burstTask{done: make(chan bool, 1)} }}

func newBurstPool(max int, linger time.Duration) *burstPool {
	return &burstPool{tasks: make(chan *burstTask), max: int32(max), linger: linger}
}

// run runs fn on another goroutine and waits for its result.
func (p *burstPool) run(fn func() bool) bool {
	t := burstTasks.Get().(*burstTask)
	t.fn = fn
	p.hand(t)
	ok := <-t.done
	t.fn = nil
	burstTasks.Put(t)
	return ok
}

// spawn runs fn on another goroutine, as go fn() does.
func (p *burstPool) spawn(fn func()) {
	p.hand(&burstTask{fn: func() bool { fn(); return true }})
}

// hand gives t to a waiting kept goroutine, else to a new one.
func (p *burstPool) hand(t *burstTask) {
	select {
	case p.tasks <- t: // a kept goroutine was waiting
	default:
		if p.workers.Add(1) <= p.max {
			go p.work(t)
		} else {
			p.workers.Add(-1)
			go t.run() // all kept ones are busy: a goroutine for this task alone
		}
	}
}

// run runs t and hands its result to run's caller, if one waits.
func (t *burstTask) run() {
	done, ok := t.done, t.fn() // t is reused once done has the result
	if done != nil {
		done <- ok
	}
}

// work runs t, then the bursts handed to it, until none comes for linger.
func (p *burstPool) work(t *burstTask) {
	defer p.workers.Add(-1)
	timer := time.NewTimer(p.linger)
	defer timer.Stop()
	for {
		t.run()
		timer.Reset(p.linger)
		select {
		case t = <-p.tasks:
		case <-timer.C:
			return
		}
	}
}
