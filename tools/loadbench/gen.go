package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// generator sends one call kind to one server over keep-alive HTTP/1.1
// connections, each driven by its own goroutine. An open loop hands each
// arrival, stamped with its scheduled time, to whichever connection is
// free, and opens another connection when none is (up to maxConns), so a
// slow answer never delays the next arrival: latency counts from the
// schedule (no coordinated omission), and a call that waited for a free
// connection shows that wait.
type generator struct {
	addr     string
	req      *requestTemplate
	timeout  time.Duration // one call's bound, from its scheduled start
	maxConns int

	jobs  chan job
	seq   atomic.Int64
	conns atomic.Int64
	idle  atomic.Int64
	wg    sync.WaitGroup // the connections' goroutines
}

// job is one call: its scheduled start and the phase it counts in.
type job struct {
	at time.Time
	ph *phase
}

// phase collects the outcomes of the calls scheduled in one run.
type phase struct {
	start, end time.Time // the window whose completed calls are goodput
	pending    sync.WaitGroup

	mu       sync.Mutex
	ok       []time.Duration // latency of each 200, from its schedule
	okInTime int64           // 200s that completed within [start, end]
	shed     int64           // 429 RATE_LIMITED with retryAfterMs and Retry-After
	badShed  int64           // 429 without them (counted as errors too)
	errs     int64
	firstErr string
	late     []time.Duration // how late the generator handed each call out
	dropped  int64           // arrivals with no connection to take them

	timeline []callTime // open loop with -timeline: every answered call
}

// callTime is one answered call: when it was due (from the phase's start)
// and how long it took, to see whether the slow calls of a run cluster in
// time (a stall of a process) or spread out (a queue).
type callTime struct {
	due, took time.Duration
	status    int
}

func newGenerator(addr string, req *requestTemplate, maxConns int, timeout time.Duration) *generator {
	return &generator{addr: addr, req: req, timeout: timeout, maxConns: maxConns, jobs: make(chan job, 1<<16)}
}

// spawn opens one more connection goroutine. It counts as idle from now:
// the dispatcher must not open another for the same call while this one
// waits for its first turn on the CPU.
func (g *generator) spawn() {
	g.conns.Add(1)
	g.idle.Add(1)
	g.wg.Go(g.serve)
}

// close ends every connection once the jobs queued are done.
func (g *generator) close() {
	close(g.jobs)
	g.wg.Wait()
}

// closeConns closes every connection, so that the next run opens what its
// rate needs, as a fresh generator would.
func (g *generator) closeConns() {
	g.close()
	g.jobs = make(chan job, cap(g.jobs))
}

// serve runs one connection: take a job, send it, read its answer.
func (g *generator) serve() {
	defer g.conns.Add(-1)
	var (
		c    net.Conn
		br   *bufio.Reader
		buf  []byte
		keep = make([]byte, 512)
		r    response
		// The deadline is moved every timeout/2, not per call (a timer
		// update each): a call is bounded by 1.5 x timeout at most.
		deadline time.Time
	)
	for first := true; ; first = false {
		if !first {
			g.idle.Add(1)
		}
		j, ok := <-g.jobs
		g.idle.Add(-1)
		if !ok {
			break
		}
		if c == nil {
			var err error
			if c, err = net.DialTimeout("tcp", g.addr, g.timeout); err != nil {
				j.ph.record(j.at, time.Now(), nil, err)
				c = nil
				continue
			}
			br, deadline = bufio.NewReaderSize(c, maxLine), time.Time{}
		}
		buf = g.req.encode(buf, g.seq.Add(1))
		if d := j.at.Add(g.timeout); d.Sub(deadline) > g.timeout/2 {
			deadline = d
			_ = c.SetDeadline(deadline)
		}
		_, err := c.Write(buf)
		if err == nil {
			err = readResponse(br, &r, keep)
		}
		j.ph.record(j.at, time.Now(), &r, err)
		if err != nil || r.Close {
			c.Close()
			c = nil
		}
	}
	if c != nil {
		c.Close()
	}
}

// record counts one call's outcome.
func (ph *phase) record(at, done time.Time, r *response, err error) {
	defer ph.pending.Done()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.timeline != nil && err == nil {
		ph.timeline = append(ph.timeline, callTime{due: at.Sub(ph.start), took: done.Sub(at), status: r.Status})
	}
	switch {
	case err != nil:
		ph.fail(fmt.Sprint("transport: ", err))
	case r.Status == 200:
		ph.ok = append(ph.ok, done.Sub(at))
		if !done.After(ph.end) {
			ph.okInTime++
		}
	case r.Status == 429:
		code, ms := envelopeError(r.Body)
		if code == "RATE_LIMITED" && ms > 0 && r.RetryAfter != "" {
			ph.shed++
			return
		}
		ph.badShed++
		ph.fail(fmt.Sprintf("429 without RATE_LIMITED, retryAfterMs and Retry-After: %q (Retry-After %q)", r.Body, r.RetryAfter))
	default:
		ph.fail(fmt.Sprintf("status %d: %s", r.Status, r.Body))
	}
}

func (ph *phase) fail(msg string) {
	ph.errs++
	if ph.firstErr == "" {
		ph.firstErr = msg
	}
}

// openLoop schedules rate calls per second for d and waits for their
// answers. Arrivals are due every 1/rate from the start; the dispatcher
// sleeps until the next is due and then hands out every call due by then
// (the runtime's timers wake it up to about a millisecond late), each with
// its own scheduled time.
func (g *generator) openLoop(rate float64, d time.Duration, timeline bool) Result {
	interval := time.Duration(float64(time.Second) / rate)
	n := int(rate * d.Seconds())
	start := time.Now()
	ph := &phase{start: start, end: start.Add(d), late: make([]time.Duration, 0, n)}
	ph.ok = make([]time.Duration, 0, n)
	if timeline {
		ph.timeline = make([]callTime, 0, n)
	}
	ph.pending.Add(n)
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		now := time.Now()
		woke := false
		if wait := at.Sub(now); wait > 0 {
			time.Sleep(wait)
			now, woke = time.Now(), true
		}
		ph.late = append(ph.late, now.Sub(at))
		// No connection free for this call (all busy, or those free
		// already promised to calls queued): open one more, at most one
		// per wake-up. After a stall of the generator (its core taken
		// by other work) many calls are due at once; a connection each
		// would leave thousands open, which costs both sides CPU, while
		// the calls queued here are counted from their schedule anyway.
		if (woke || i == 0) && int(g.idle.Load()) <= len(g.jobs) && int(g.conns.Load()) < g.maxConns {
			g.spawn()
		}
		select {
		case g.jobs <- job{at: at, ph: ph}:
		default:
			ph.mu.Lock()
			ph.dropped++
			ph.fail("generator: no connection free and its queue full")
			ph.mu.Unlock()
			ph.pending.Done()
		}
	}
	ph.pending.Wait()
	res := ph.result(d)
	res.Rate = rate
	res.Conns = int(g.conns.Load())
	res.timeline = ph.timeline
	return res
}

// writeTimeline writes one line per answered call, in the order they were
// due: seconds from the run's start, latency in milliseconds, HTTP status.
func writeTimeline(path string, calls []callTime) error {
	slices.SortFunc(calls, func(a, b callTime) int { return int(a.due - b.due) })
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "dueS tookMs status")
	for _, c := range calls {
		fmt.Fprintf(w, "%.6f %.3f %d\n", c.due.Seconds(), float64(c.took.Microseconds())/1000, c.status)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// closedLoop runs conc callers for d, each sending its next call when the
// previous answered (a shed caller waits the answer's retryAfterMs).
func (g *generator) closedLoop(conc int, d time.Duration) Result {
	start := time.Now()
	ph := &phase{start: start, end: start.Add(d)}
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			var (
				c    net.Conn
				br   *bufio.Reader
				buf  []byte
				keep = make([]byte, 512)
				r    response
			)
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for {
				at := time.Now()
				if at.After(ph.end) {
					return
				}
				if c == nil {
					var err error
					if c, err = net.DialTimeout("tcp", g.addr, g.timeout); err != nil {
						ph.pending.Add(1)
						ph.record(at, time.Now(), nil, err)
						c = nil
						time.Sleep(10 * time.Millisecond)
						continue
					}
					br = bufio.NewReaderSize(c, maxLine)
				}
				buf = g.req.encode(buf, g.seq.Add(1))
				_ = c.SetDeadline(at.Add(g.timeout))
				_, err := c.Write(buf)
				if err == nil {
					err = readResponse(br, &r, keep)
				}
				done := time.Now()
				if done.After(ph.end) {
					return // straddled the end: not counted
				}
				ph.pending.Add(1)
				ph.record(at, done, &r, err)
				if err != nil || r.Close {
					c.Close()
					c = nil
				}
				if err == nil && r.Status == 429 {
					if _, ms := envelopeError(r.Body); ms > 0 {
						time.Sleep(time.Duration(ms) * time.Millisecond)
					}
				}
			}
		})
	}
	wg.Wait()
	res := ph.result(time.Since(start))
	res.Concurrency = conc
	return res
}

// result summarizes a phase: goodput is the 200s completed within the
// window per second of it (a server that falls behind serves the backlog
// after the window, which is not goodput); latencies are every 200's.
func (ph *phase) result(d time.Duration) Result {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	slices.Sort(ph.ok)
	secs := d.Seconds()
	res := Result{
		Seconds: secs, Calls: int64(len(ph.ok)), PerSecond: float64(ph.okInTime) / secs,
		P50Ms: pct(ph.ok, 0.50), P99Ms: pct(ph.ok, 0.99),
		Errors: ph.errs, RateLimited: ph.shed,
	}
	if ph.late != nil {
		slices.Sort(ph.late)
		res.LateP99Ms = pct(ph.late, 0.99)
	}
	if ph.firstErr != "" {
		fmt.Fprintln(os.Stderr, "loadbench: first error:", ph.firstErr)
	}
	return res
}

// pct is the p-th quantile of sorted durations, in milliseconds.
func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(p*float64(len(sorted)-1))].Microseconds()) / 1000
}
