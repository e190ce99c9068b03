package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"computeplane/tools/benchkit"
)

// Dial attempts of every simulated daemon, counted for the timeline of a
// restart: started, and failed before a welcome (refused while the
// gateway is down, or cut off).
var dialsStarted, dialsFailed, dialsRefused atomic.Int64

// welcomes counts every welcome since the tool's start (the held sessions
// fall after a kill as each daemon sees its end; this only grows).
var welcomes atomic.Int64

// restartAt is the SIGKILL of the restart being timed, in Unix
// nanoseconds (0: none), for each daemon's own times (daemonTimes).
var restartAt atomic.Int64

// daemonTimes is one daemon's restart, in nanoseconds since the SIGKILL
// (0: not yet): when it saw its session end, when it started its first
// dial (a dial slot taken), when it started the dial that was welcomed,
// and the welcome. They say whether the daemons' reconnect schedule or
// the gateway's rate brings them back.
type daemonTimes struct{ lostAt, firstDial, lastDial, backAt atomic.Int64 }

// sinceRestart is the time since the timed restart's SIGKILL (at least
// 1 ns), 0 without one.
func sinceRestart() int64 {
	k := restartAt.Load()
	if k == 0 {
		return 0
	}
	return max(time.Now().UnixNano()-k, 1)
}

func (d *daemonTimes) lost() {
	if t := sinceRestart(); t > 0 {
		d.lostAt.CompareAndSwap(0, t)
	}
}

// dialed notes a dial's start and answers its time (0: no restart timed).
func (d *daemonTimes) dialed() int64 {
	t := sinceRestart()
	if t > 0 {
		d.firstDial.CompareAndSwap(0, t)
	}
	return t
}

// welcomed notes the welcome of the dial started at dialAt.
func (d *daemonTimes) welcomed(dialAt int64) {
	if t := sinceRestart(); t > 0 && dialAt > 0 && d.backAt.CompareAndSwap(0, t) {
		d.lastDial.Store(dialAt)
	}
}

func (d *daemonTimes) reset() {
	d.lostAt.Store(0)
	d.firstDial.Store(0)
	d.lastDial.Store(0)
	d.backAt.Store(0)
}

// daemonSpread summarises the daemons' times of one restart: for each
// (lost, first dial, welcomed dial, back, and that dial's duration) the
// 10th, 50th and 90th percentile and the last, in seconds since the
// SIGKILL, over the daemons that came back.
type daemonSpread struct {
	lost, first, last, back, dial [4]float64
	count                         int
}

func spreadOf(nodes []*node) daemonSpread {
	var ds daemonSpread
	var lost, first, last, back, dial []int64
	for _, nd := range nodes {
		t := &nd.restart
		if t.backAt.Load() == 0 {
			continue
		}
		lost = append(lost, t.lostAt.Load())
		first = append(first, t.firstDial.Load())
		last = append(last, t.lastDial.Load())
		back = append(back, t.backAt.Load())
		dial = append(dial, t.backAt.Load()-t.lastDial.Load())
	}
	ds.count = len(back)
	q := func(v []int64) [4]float64 {
		var out [4]float64
		if len(v) == 0 {
			return out
		}
		slices.Sort(v)
		for i, p := range []float64{0.1, 0.5, 0.9, 1} {
			out[i] = float64(v[min(int(p*float64(len(v))), len(v)-1)]) / 1e9
		}
		return out
	}
	ds.lost, ds.first, ds.last, ds.back, ds.dial = q(lost), q(first), q(last), q(back), q(dial)
	return ds
}

func (ds daemonSpread) String() string {
	f := func(v [4]float64) string { return fmt.Sprintf("%.2f / %.2f / %.2f / %.2f", v[0], v[1], v[2], v[3]) }
	return fmt.Sprintf("%d daemons back, p10 / p50 / p90 / last, s since the SIGKILL: session seen lost %s; first dial %s; the dial welcomed started %s; back %s; that dial's own time %s",
		ds.count, f(ds.lost), f(ds.first), f(ds.last), f(ds.back), f(ds.dial))
}

// timeline samples one restart's storm from the SIGKILL: the sessions
// back, the handshakes in flight (the -dials slots taken), the dial
// attempts and both sides' CPU, so that the wall time of "all back"
// splits into the gateway's start, the daemons' reconnect schedule and
// the handshakes' CPU (docs/benchmarks-notes.md, wt-sess3).
type timeline struct {
	n       int64
	welcome *atomic.Int64
	dialing chan struct{}
	gwPid   atomic.Int64 // the restarted gateway, once started
	killed  time.Time
	samples []sample
	nodes   []*node
	done    chan struct{}
	stopped chan struct{}

	exec, listen time.Duration // since the kill
}

type sample struct {
	at                  time.Duration // since the kill
	back                int64         // welcomes since the kill
	held                int64         // sessions held
	inFlight            int
	started, failed     int64 // dial attempts since the kill
	refused             int64 // of failed: ECONNREFUSED (nothing listening)
	gatewayCPU, loadCPU time.Duration
	busy, total         [2]int64 // /proc/stat ticks of cores 0 and 1: busy (all but idle and iowait), all
	irq                 [2]int64 // of busy: hardware and software interrupts (loopback's packets)
	postgres            time.Duration
}

const tick = 100 * time.Millisecond

func startTimeline(n int64, welcomed *atomic.Int64, dialing chan struct{}, nodes []*node) *timeline {
	for _, nd := range nodes {
		nd.restart.reset()
	}
	t := &timeline{n: n, welcome: welcomed, dialing: dialing, nodes: nodes, killed: time.Now(), done: make(chan struct{}), stopped: make(chan struct{})}
	restartAt.Store(t.killed.UnixNano())
	s0, f0, r0, w0 := dialsStarted.Load(), dialsFailed.Load(), dialsRefused.Load(), welcomes.Load()
	go func() {
		defer close(t.stopped)
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for {
			var gw time.Duration
			if pid := t.gwPid.Load(); pid != 0 {
				gw, _ = processCPU(int(pid))
			}
			t.samples = append(t.samples, sample{at: time.Since(t.killed), back: welcomes.Load() - w0, held: t.welcome.Load(), inFlight: len(t.dialing),
				started: dialsStarted.Load() - s0, failed: dialsFailed.Load() - f0, refused: dialsRefused.Load() - r0, gatewayCPU: gw, loadCPU: selfCPU()})
			last := &t.samples[len(t.samples)-1]
			last.busy, last.total, last.irq = coreTicks()
			last.postgres = childrenCPU(postmaster)
			select {
			case <-t.done:
				return
			case <-tk.C:
			}
		}
	}()
	return t
}

// stop ends the sampling (at all back) and answers the summary line.
func (t *timeline) stop() timelineSummary {
	close(t.done)
	<-t.stopped
	restartAt.Store(0)
	s := t.summary()
	s.daemons = spreadOf(t.nodes)
	return s
}

// timelineSummary is what a restart's timeline says, all since the
// SIGKILL: the new gateway's exec and listen, when the first session, half
// and all of them were back; each side's share of its core from the
// listen to all back; the dial slots' mean use over the same span; the
// dial attempts refused or failed before the listen and after it.
type timelineSummary struct {
	exec, listen, first, half, ninety, all time.Duration
	gatewayShare, loadShare                float64
	coreBusy                               [2]float64 // cores 0 and 1, by anything
	coreIRQ                                [2]float64 // of it interrupts
	postgresShare                          float64    // of one core
	perSession                             [3]float64 // ms of CPU per session back from listening to all back: gateway, load tool, PostgreSQL
	meanInFlight                           float64
	failedBefore, failedAfter              int64
	firstFull                              time.Duration // the first sample with every slot taken
	daemons                                daemonSpread
}

func (t *timeline) summary() timelineSummary {
	s := timelineSummary{exec: t.exec, listen: t.listen}
	var atListen, atAll *sample
	var flight, k float64
	for i := range t.samples {
		x := &t.samples[i]
		if x.at < t.listen {
			s.failedBefore = x.failed
			continue
		}
		if atListen == nil {
			atListen = x
		}
		if x.back > 0 && s.first == 0 {
			s.first = x.at
		}
		if x.back >= t.n/2 && s.half == 0 {
			s.half = x.at
		}
		if x.back >= t.n*9/10 && s.ninety == 0 {
			s.ninety = x.at
		}
		if x.inFlight == cap(t.dialing) && s.firstFull == 0 {
			s.firstFull = x.at
		}
		if atAll == nil {
			flight += float64(x.inFlight)
			k++
		}
		if x.held >= t.n && atAll == nil {
			atAll = x
			s.all = x.at
		}
		s.failedAfter = x.failed - s.failedBefore
	}
	if atAll == nil && len(t.samples) > 0 {
		atAll = &t.samples[len(t.samples)-1]
		s.all = atAll.at
	}
	if atListen != nil && atAll != nil && atAll.at > atListen.at {
		span := float64(atAll.at - atListen.at)
		s.gatewayShare = float64(atAll.gatewayCPU-atListen.gatewayCPU) / span
		s.loadShare = float64(atAll.loadCPU-atListen.loadCPU) / span
		for i := range s.coreBusy {
			s.coreBusy[i] = float64(atAll.busy[i]-atListen.busy[i]) / float64(max(atAll.total[i]-atListen.total[i], 1))
			s.coreIRQ[i] = float64(atAll.irq[i]-atListen.irq[i]) / float64(max(atAll.total[i]-atListen.total[i], 1))
		}
		back := float64(max(atAll.back-atListen.back, 1))
		s.perSession = [3]float64{float64((atAll.gatewayCPU - atListen.gatewayCPU).Microseconds()) / 1000 / back,
			float64((atAll.loadCPU - atListen.loadCPU).Microseconds()) / 1000 / back,
			float64((atAll.postgres - atListen.postgres).Microseconds()) / 1000 / back}
		if atListen.postgres > 0 {
			s.postgresShare = float64(atAll.postgres-atListen.postgres) / span
		}
	}
	if k > 0 {
		s.meanInFlight = flight / k
	}
	return s
}

func (s timelineSummary) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }
	return fmt.Sprintf("exec %s, listening %s, first back %s, half %s, 90%% %s, all %s; slots all taken first at %s, %.0f of them taken on average from listening to all back; from listening to all back the gateway used %.0f%% of its core, the load tool %.0f%% of its, cores 0 and 1 were busy %.0f%% and %.0f%% (anything; interrupts %.0f%% and %.0f%%), PostgreSQL used %.0f%% of a core; CPU per session back over that span: gateway %.2f ms, load tool %.2f ms, PostgreSQL %.2f ms; dials failed before listening %d, after %d",
		ms(s.exec), ms(s.listen), ms(s.first), ms(s.half), ms(s.ninety), ms(s.all), ms(s.firstFull), s.meanInFlight, 100*s.gatewayShare, 100*s.loadShare, 100*s.coreBusy[0], 100*s.coreBusy[1], 100*s.coreIRQ[0], 100*s.coreIRQ[1], 100*s.postgresShare, s.perSession[0], s.perSession[1], s.perSession[2], s.failedBefore, s.failedAfter)
}

// series is the timeline sampled every second, for the log.
func (t *timeline) series() string {
	var b strings.Builder
	b.WriteString("at | back | held | slots | dials started / failed (refused) | gateway CPU | load CPU | PostgreSQL CPU | core 0 busy | core 1 busy\n")
	var last sample
	for i, x := range t.samples {
		if i%10 != 0 && i != len(t.samples)-1 && x.at > t.listen+time.Second {
			continue
		}
		if i > 0 {
			core := func(i int) float64 {
				return 100 * float64(x.busy[i]-last.busy[i]) / float64(max(x.total[i]-last.total[i], 1))
			}
			fmt.Fprintf(&b, "%.2fs | %d | %d | %d | %d / %d (%d) | %.0f%% | %.0f%% | %.0f%% | %.0f%% | %.0f%%\n", x.at.Seconds(), x.back, x.held, x.inFlight, x.started, x.failed, x.refused,
				100*float64(x.gatewayCPU-last.gatewayCPU)/float64(x.at-last.at), 100*float64(x.loadCPU-last.loadCPU)/float64(x.at-last.at), 100*float64(x.postgres-last.postgres)/float64(x.at-last.at), core(0), core(1))
		}
		last = x
	}
	return b.String()
}

// processCPU is a process's CPU time, 0 once it is gone.
func processCPU(pid int) (time.Duration, error) { return benchkit.ProcessCPU(pid) }

// coreTicks reads /proc/stat's ticks of cores 0 and 1: busy (every state
// but idle and iowait), in all, and of busy the interrupts'.
func coreTicks() (busy, total, irq [2]int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return busy, total, irq
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || (f[0] != "cpu0" && f[0] != "cpu1") {
			continue
		}
		i := int(f[0][3] - '0')
		for j, v := range f[1:] {
			k, _ := strconv.ParseInt(v, 10, 64)
			total[i] += k
			if j != 3 && j != 4 { // idle, iowait
				busy[i] += k
			}
			if j == 5 || j == 6 { // irq, softirq
				irq[i] += k
			}
		}
	}
	return busy, total, irq
}

// postmaster is the run's PostgreSQL server process (0: unknown); its
// children are the backends and the server's own workers.
var postmaster int

// childrenCPU sums the CPU time of ppid's child processes.
func childrenCPU(ppid int) time.Duration {
	if ppid == 0 {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 13 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		if d, err := processCPU(pid); err == nil {
			sum += d
		}
	}
	return sum
}
