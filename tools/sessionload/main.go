// Command sessionload measures one gateway process under N daemon sessions
// over the real protocol and real TLS (issue 11's benchmark): the
// gateway's memory per idle session, the time for all sessions to connect,
// and the time for all to come back after the gateway is SIGKILLed and
// started again. It makes a database of its own on the server of
// -database, nodes and their certificates from a fresh PKI bundle, runs
// computed with the gateway role only as a child process, and writes its
// figures into docs/benchmarks.md and docs/benchmarks-notes.md (the
// section "Gateway sessions").
//
//	go run ./tools/sessionload [-n 10000] [-runs 3] [-dials 64] [-pin=true] [-cpuprofile DIR] [-database $SERVICE_DATABASE_URL]
//
// With -pin (the default on two cores or more) the gateway runs on core 0
// and this process, the daemons' side, on the others (taskset), so that
// the reconnect's wall time is the gateway's on one core rather than the
// two sides' contention; the gateway's CPU per returning session (less
// its own start) is the figure that drives it.
//
// The memory figures are read once the gateway's collector is back at its
// idle target: a gateway-only computed raises the target during a
// reconnect storm and sets it back (returning the storm's garbage to the
// OS) after 2 s without one (internal/gctarget); the run waits for its
// gctarget.storm counter to read 0, so that the figure is an idle
// gateway's. GOGC in this tool's environment is not passed to the
// gateways (GATEWAY_GOGC is, as GOGC).
//
// This process plays every daemon, which in a fleet each have a machine of
// their own, and its one core bounds the reconnect's wall time about as
// much as the gateway's does, so its collector runs at -gogc (400 by
// default; GOGC in the environment wins): at Go's default 100 the
// collector took 8 to 10 % of this process's CPU in a reconnect storm, at
// 400 3 % (docs/benchmarks-notes.md, "storm-aware collector target").
// Its daemons' sessions (daemon.go) do the daemon's protocol work and
// leave out the costs that come of playing them all in one process.
//
// -cpuprofile DIR (default $GATEWAY_PROFILES) keeps this process's CPU
// profile of each storm, load-<run>-full, -resumed and -drops.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/ids"
	"computeplane/internal/pki"
	"computeplane/tools/benchkit"
)

const secret = "sessionload-secret-0123456789abcdefghijklmnop"

func main() {
	n := flag.Int("n", 5000, "daemon sessions")
	database := flag.String("database", os.Getenv("SERVICE_DATABASE_URL"), "a PostgreSQL URL; a database of its own is made on that server")
	out := flag.String("out", "docs/benchmarks.md", "the benchmarks page to write the section into")
	notes := flag.String("notes", "docs/benchmarks-notes.md", "the notes page make bench appends (the section is kept there too)")
	computed := flag.String("computed", "", "a built computed binary (default: go build ./cmd/computed)")
	runs := flag.Int("runs", 3, "runs (a fresh gateway each), reported side by side for their spread")
	pin := flag.Bool("pin", runtime.NumCPU() >= 2, "run the gateway on core 0 and the load tool on the others (taskset)")
	gogc := flag.Int("gogc", 400, "this process's collector target (the daemons' side; GOGC in the environment wins); not the gateway's")
	profiles := flag.String("cpuprofile", os.Getenv("GATEWAY_PROFILES"), "a directory for this process's CPU profiles of each storm (load-<run>-full, -resumed, -drops); GATEWAY_PROFILES, the default, also keeps the gateway's there")
	dials := flag.Int("dials", 64, "handshakes in flight at once (daemons on their own machines do not share this one's CPU; unbounded, the load tool's own TLS work starves the handshakes past the gateway's timeout)")
	flag.Parse()
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gogc)
	}
	if *database == "" {
		log.Fatal("sessionload: -database or SERVICE_DATABASE_URL is required")
	}
	raiseNoFile(*n)
	if *pin {
		pinning = pinApart()
	}
	ctx := context.Background()
	work, err := os.MkdirTemp("", "sessionload")
	check(err)
	defer os.RemoveAll(work)
	// The gateways' logs go to GATEWAY_LOGS when set (kept), else into
	// the run's own directory.
	logs := cmpOr(os.Getenv("GATEWAY_LOGS"), work)
	if *computed == "" {
		*computed = filepath.Join(work, "computed")
		run(exec.Command("go", "build", "-o", *computed, "./cmd/computed"))
	}
	dbURL, drop, err := benchkit.FreshDatabase(ctx, *database, "sessionload")
	check(err)
	defer drop()

	// GOGC is this process's; the gateway gets GATEWAY_GOGC (below).
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOGC=") })
	env = append(env, "SERVICE_DATABASE_URL="+dbURL, "SERVICE_SECRET="+secret, "SERVICE_PKI="+filepath.Join(work, "pki.json"))
	cmd := exec.Command(*computed, "migrate")
	cmd.Env = env
	run(cmd)
	bundle, _, err := pki.Init(filepath.Join(work, "pki.json"), secret, "bench.local")
	check(err)
	roots := x509.NewCertPool()
	roots.AddCert(bundle.ServingCA.Cert)
	nodes := makeNodes(ctx, dbURL, bundle, roots, *n)
	postmaster = serverPid(ctx, dbURL)

	port, err := benchkit.FreePort()
	check(err)
	cfg := filepath.Join(work, "gateway.yaml")
	check(os.WriteFile(cfg, []byte(fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: bench, listen: \"127.0.0.1:%d\", maxStreams: %d, drainDelayMs: 0, sessionTicketDays: 7}\n",
		port, port, *n+100)), 0o600))
	env = append(env, "SERVICE_CONFIG="+cfg, "SERVICE_ROLES=gateway", "SERVICE_LOG_LEVEL="+cmpOr(os.Getenv("GATEWAY_LOG_LEVEL"), "warn"))
	if g := os.Getenv("GATEWAY_GOGC"); g != "" {
		env = append(env, "GOGC="+g)
	}
	// Every gateway serves pprof on a port of its own: the run reads the
	// runtime's figures (heap in use, stacks) from it.
	pprofPort, err := benchkit.FreePort()
	check(err)
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", pprofPort)
	env = append(env, "SERVICE_PPROF_ADDR="+pprofAddr)

	var results []result
	for r := 1; r <= *runs; r++ {
		res := once(r, *n, *dials, *computed, env, logs, port, pprofAddr, *profiles, nodes)
		results = append(results, res)
		log.Printf("run %d: %.1f KiB per session (heap %.1f, stacks %.1f), cold %s, back %s resuming (%s with full handshakes), %d of %d at the end",
			r, res.perSession, res.heapPer, res.stackPer, res.cold.Round(time.Millisecond), res.back.Round(time.Millisecond), res.backFull.Round(time.Millisecond), res.final, *n)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	section := report(*n, *dials, results, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Print(section)
	check(benchkit.WriteSection("## Gateway sessions", section, *out, *notes))
}

// pinning says where the gateway and the load tool ran (-pin), for the
// report; gatewayCPUs is the taskset list the gateway starts on, empty
// when not pinned.
var pinning, gatewayCPUs = "not pinned: the gateway and the load tool share the cores", ""

// pinApart puts this process (every thread: taskset -a) on cores 1 to
// n-1 and has the gateways start on core 0.
func pinApart() string {
	last := runtime.NumCPU() - 1
	loadCPUs := fmt.Sprintf("1-%d", last)
	if last == 1 {
		loadCPUs = "1"
	}
	if out, err := exec.Command("taskset", "-a", "-cp", loadCPUs, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		log.Printf("sessionload: taskset: %v %s; not pinned", err, out)
		return pinning
	}
	gatewayCPUs = "0"
	return fmt.Sprintf("pinned with taskset: the gateway on core 0, the load tool on core(s) %s (PostgreSQL not pinned)", loadCPUs)
}

// result is one run's figures.
type result struct {
	before, after     int64 // gateway RSS, KiB
	perSession        float64
	heapPer, stackPer float64 // KiB per session of heap in use and of goroutine stacks (runtime.MemStats)
	goroutinesPer     float64
	cold, back        time.Duration // back: after a restart, the sessions resuming
	backFull          time.Duration // after a restart, every session a full handshake
	held, final       int64         // sessions when the memory was read, and at the end
	finalFull         int64
	// KiB per session after the second restart: heap in use and stacks,
	// and the resident set.
	resumedPer, resumedRSS float64
	// The restarted gateway's CPU time until every session was back, and
	// the part of it spent before it listened (its own start).
	cpuFull, cpuResumed           time.Duration
	startCPUFull, startCPUResumed time.Duration
	// This process's CPU time (the daemons' side) over the same window.
	loadFull, loadResumed time.Duration
	// The restarted gateway's read and write system calls from its
	// listening to all back (/proc/<pid>/io): exact where the CPU
	// figures move with the machine's load.
	sysFull, sysResumed [2]int64
	// The restarted gateway's own counters (expvar; nil from a gateway
	// without them).
	varsFull, varsResumed map[string]int64
	// Every daemon's session dropped from its side, back to the running
	// gateway: the time, the sessions back, both sides' CPU and the
	// gateway's counters (cumulative since its start).
	rejoin                time.Duration
	rejoinFinal           int64
	cpuRejoin, loadRejoin time.Duration
	varsRejoin            map[string]int64
	// Each restart's timeline from the SIGKILL (timeline.go).
	timelineFull, timelineResumed timelineSummary
}

// once runs one gateway with n sessions: memory when idle, then a
// SIGKILL and a restart, and the time until all are back.
func once(r, n, dials int, computed string, env []string, work string, port int, pprofAddr, profiles string, nodes []*node) result {
	var res result
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	gw := startGateway(computed, env, filepath.Join(work, fmt.Sprintf("gateway-%d.log", r)), port, nil)
	time.Sleep(2 * time.Second)
	res.before = rssKiB(gw.Process.Pid)
	heap0, stack0, g0 := memStats(pprofAddr)
	alloc0 := heapAlloc(pprofAddr)

	// A cold connect is every daemon's first session after its own
	// start, which holds no ticket (daemons keep them in memory only): the
	// tickets of the run before would make runs after the first resume
	// their cold sessions, which hold about 3 KiB more each.
	for _, nd := range nodes {
		nd.forget()
	}
	welcomed := new(atomic.Int64)
	stop := make(chan struct{})
	dialing := make(chan struct{}, dials)
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); nd.hold(addr, welcomed, dialing, stop) }()
	}
	res.cold = waitAll(welcomed, int64(n), 300*time.Second)
	log.Printf("run %d: %d sessions welcomed in %s", r, welcomed.Load(), res.cold)
	// Idle: past the first status of every session (sent 5 s after its
	// welcome), which the gateway writes.
	time.Sleep(8 * time.Second)
	waitIdleTarget(r, pprofAddr)
	res.after = rssKiB(gw.Process.Pid)
	heap1, stack1, g1 := memStats(pprofAddr)
	res.held = welcomed.Load() // n, unless the cold connect ran out of time
	held := float64(max(res.held, 1))
	// The heap's objects against its spans in use: the difference is
	// free space inside spans that hold some live object (fragmentation).
	log.Printf("run %d: idle, per session: heap in use %.1f KiB, of it allocated %.1f KiB", r, float64(heap1-heap0)/1024/held, float64(heapAlloc(pprofAddr)-alloc0)/1024/held)
	res.perSession = float64(res.after-res.before) / held
	res.heapPer, res.stackPer = float64(heap1-heap0)/1024/held, float64(stack1-stack0)/1024/held
	res.goroutinesPer = float64(g1-g0) / held
	if d := os.Getenv("GATEWAY_PROFILES"); d != "" {
		// Kept for go tool pprof: the heap and the goroutines of the idle
		// gateway.
		for name, path := range map[string]string{"heap": "/debug/pprof/heap", "goroutine": "/debug/pprof/goroutine?debug=1"} {
			if b, err := httpGet(pprofAddr, path); err == nil {
				_ = os.WriteFile(filepath.Join(d, fmt.Sprintf("%s-%d", name, r)), b, 0o644)
			}
		}
	}

	// Two restarts: the daemons' tickets dropped first (every session a
	// full handshake), then with the tickets their sessions got (each
	// resumes), the comparison in the same run.
	timelines := map[string]timelineSummary{}
	restart := func(label string, forget bool) (time.Duration, int64, time.Duration, time.Duration, time.Duration, map[string]int64) {
		if forget {
			for _, nd := range nodes {
				nd.forget()
			}
		}
		stopProfile := profileLoad(profiles, r, label)
		self0 := selfCPU()
		tl := startTimeline(int64(n), welcomed, dialing, nodes)
		check(gw.Process.Kill())
		_, _ = gw.Process.Wait()
		restarted := time.Now()
		tl.exec = restarted.Sub(tl.killed)
		gw = startGateway(computed, env, filepath.Join(work, fmt.Sprintf("gateway-%d-%s.log", r, label)), port, func(pid int) { tl.gwPid.Store(int64(pid)) })
		listening := time.Since(restarted) // the process's own start, before any session
		tl.listen = time.Since(tl.killed)
		startCPU := cpuTime(gw.Process.Pid)
		sys0 := sysCalls(gw.Process.Pid)
		profiled := make(chan struct{})
		if d := os.Getenv("GATEWAY_PROFILES"); d != "" {
			// The restarted gateway's CPU during the reconnect storm.
			go func() {
				defer close(profiled)
				if b, err := httpGet(pprofAddr, "/debug/pprof/profile?seconds="+cmpOr(os.Getenv("GATEWAY_CPU_SECONDS"), "15")); err == nil {
					_ = os.WriteFile(filepath.Join(d, fmt.Sprintf("cpu-%d-%s", r, label)), b, 0o644)
				}
			}()
		} else {
			close(profiled)
		}
		waitAll(welcomed, int64(n), 300*time.Second)
		back := time.Since(restarted)
		timeline := tl.stop()
		timelines[label] = timeline
		log.Printf("run %d: timeline of the restart (%s), since the SIGKILL: %s\n%s", r, label, timeline, tl.series())
		log.Printf("run %d: the daemons of the restart (%s): %s", r, label, timeline.daemons)
		// The gateway's CPU time (its start and every session's handshake,
		// hello, row and welcome): the figure a loaded machine disturbs least.
		cpu := cpuTime(gw.Process.Pid)
		sys := sysCalls(gw.Process.Pid)
		sys = [2]int64{sys[0] - sys0[0], sys[1] - sys0[1]}
		if label == "full" {
			res.sysFull = sys
		} else {
			res.sysResumed = sys
		}
		self := selfCPU() - self0
		stopProfile()
		<-profiled
		// The sessions' first statuses (sent at once after the welcome,
		// as the daemon does) are in by now.
		time.Sleep(2 * time.Second)
		vars := gatewayVars(pprofAddr)
		log.Printf("run %d: back after a restart (%s) in %s (listening after %s), %d of %d, gateway CPU %s (%s of it before listening), load tool CPU %s, counters %v", r, label, back.Round(time.Millisecond),
			listening.Round(time.Millisecond), welcomed.Load(), n, cpu, startCPU, self, vars)
		return back, welcomed.Load(), cpu, startCPU, self, vars
	}
	// Odd runs restart with full handshakes first, even runs resuming
	// first, so that neither always meets the other's aftermath.
	full := func() {
		res.backFull, res.finalFull, res.cpuFull, res.startCPUFull, res.loadFull, res.varsFull = restart("full", true)
	}
	resumed := func() {
		res.back, res.final, res.cpuResumed, res.startCPUResumed, res.loadResumed, res.varsResumed = restart("resumed", false)
	}
	first, second := full, resumed
	if r%2 == 0 {
		first, second = resumed, full
	}
	first()
	time.Sleep(3 * time.Second) // every session past its welcome, its ticket read
	second()
	res.timelineFull, res.timelineResumed = timelines["full"], timelines["resumed"]
	// The memory of the sessions after the second restart (resumed ones
	// on odd runs, full handshakes on even ones: a resumed ClientHello
	// carries the ticket, and the ticket the certificate), over the first
	// gateway's figures before its sessions: the same binary and
	// configuration.
	time.Sleep(8 * time.Second)
	waitIdleTarget(r, pprofAddr)
	heap2, stack2, _ := memStats(pprofAddr)
	log.Printf("run %d: idle after the second restart, per session: heap in use %.1f KiB, of it allocated %.1f KiB", r, float64(heap2-heap0)/1024/float64(max(welcomed.Load(), 1)), float64(heapAlloc(pprofAddr)-alloc0)/1024/float64(max(welcomed.Load(), 1)))
	if d := os.Getenv("GATEWAY_PROFILES"); d != "" {
		if b, err := httpGet(pprofAddr, "/debug/pprof/heap"); err == nil {
			_ = os.WriteFile(filepath.Join(d, fmt.Sprintf("heap-%d-restarted", r)), b, 0o644)
		}
	}
	res.resumedPer = (float64(heap2-heap0) + float64(stack2-stack0)) / 1024 / float64(max(res.final, 1))
	res.resumedRSS = float64(rssKiB(gw.Process.Pid)-res.before) / float64(max(res.final, 1))

	// Every daemon drops its session and comes back to the same running
	// gateway with a full handshake (tickets dropped): what a network blip
	// or a fleet-wide daemon restart does. The gateway has seen each
	// client chain before (chaincache.go).
	for _, nd := range nodes {
		nd.forget()
	}
	stopProfile := profileLoad(profiles, r, "drops")
	cpu0, self0 := cpuTime(gw.Process.Pid), selfCPU()
	kicked := time.Now()
	for _, nd := range nodes {
		nd.kick()
	}
	for welcomed.Load() > int64(n)/2 && time.Since(kicked) < 10*time.Second {
		time.Sleep(time.Millisecond) // the drops seen before waiting for all
	}
	waitAll(welcomed, int64(n), 300*time.Second)
	res.rejoin, res.rejoinFinal = time.Since(kicked), welcomed.Load()
	res.cpuRejoin, res.loadRejoin = cpuTime(gw.Process.Pid)-cpu0, selfCPU()-self0
	stopProfile()
	time.Sleep(time.Second)
	res.varsRejoin = gatewayVars(pprofAddr)
	log.Printf("run %d: back after every daemon dropped its session in %s, %d of %d, gateway CPU %s, load tool CPU %s, counters %v",
		r, res.rejoin.Round(time.Millisecond), res.rejoinFinal, n, res.cpuRejoin, res.loadRejoin, res.varsRejoin)
	close(stop)
	_ = gw.Process.Signal(syscall.SIGTERM)
	_, _ = gw.Process.Wait()
	wg.Wait()
	return res
}

// profileLoad starts a CPU profile of this process, the daemons' side,
// into dir/load-<run>-<label> (nothing without dir), and answers the
// function that ends it.
func profileLoad(dir string, r int, label string) func() {
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("load-%d-%s", r, label)))
	check(err)
	check(pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func httpGet(addr, path string) ([]byte, error) {
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// selfCPU is this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// gatewayVars reads the gateway's counters (expvar "gateway" on the pprof
// address: hellos, their database round trips, statuses written and
// skipped); nil when the gateway has none (an older binary).
func gatewayVars(addr string) map[string]int64 {
	b, err := httpGet(addr, "/debug/vars")
	if err != nil {
		return nil
	}
	var v struct {
		Gateway map[string]int64 `json:"gateway"`
	}
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	return v.Gateway
}

// waitIdleTarget waits (up to 60 s) until the gateway's collector is back
// at its idle target after a storm (internal/gctarget's expvar
// gctarget.storm reads 0), so that memory is read on an idle gateway. A
// gateway without the counter (an older binary, or GOGC set) is not
// waited for.
func waitIdleTarget(r int, addr string) {
	start := time.Now()
	for {
		b, err := httpGet(addr, "/debug/vars")
		check(err)
		var v struct {
			GCTarget *struct {
				Storm, Storms, Freed int64
			} `json:"gctarget"`
		}
		check(json.Unmarshal(b, &v))
		if v.GCTarget == nil || v.GCTarget.Storm == 0 {
			if v.GCTarget != nil {
				log.Printf("run %d: gateway at its idle collector target (storms %d, freed %d; waited %s)", r, v.GCTarget.Storms, v.GCTarget.Freed, time.Since(start).Round(time.Millisecond))
			}
			return
		}
		if time.Since(start) > 60*time.Second {
			log.Fatalf("run %d: the gateway's storm target still set after 60 s", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var allocRe = regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)`)

// heapAlloc reads the gateway's bytes of allocated heap objects (live,
// and dead ones not yet swept).
func heapAlloc(addr string) int64 {
	b, err := httpGet(addr, "/debug/pprof/heap?debug=1")
	check(err)
	var v int64
	if m := allocRe.FindSubmatch(b); m != nil {
		v, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	return v
}

var memRe = regexp.MustCompile(`(?m)^# (HeapInuse|Stack) = (\d+)`)

// memStats reads the gateway's heap in use and stack bytes (the
// runtime.MemStats lines of /debug/pprof/heap?debug=1) and its goroutines.
func memStats(addr string) (heap, stack, goroutines int64) {
	b, err := httpGet(addr, "/debug/pprof/heap?debug=1")
	check(err)
	for _, m := range memRe.FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseInt(string(m[2]), 10, 64)
		if string(m[1]) == "HeapInuse" {
			heap = v
		} else {
			stack = v
		}
	}
	g, err := httpGet(addr, "/debug/pprof/goroutine?debug=1")
	check(err)
	if m := regexp.MustCompile(`total (\d+)`).FindSubmatch(g); m != nil {
		goroutines, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	return heap, stack, goroutines
}

func waitAll(c *atomic.Int64, n int64, limit time.Duration) time.Duration {
	start := time.Now()
	for c.Load() < n && time.Since(start) < limit {
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// serverPid is the PostgreSQL server's process (the parent of a
// backend's), 0 when it is not on this machine.
func serverPid(ctx context.Context, dbURL string) int {
	conn, err := pgx.Connect(ctx, dbURL)
	check(err)
	defer conn.Close(ctx)
	var pid int
	check(conn.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid))
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// makeNodes writes a site, a pool and n ready nodes, and issues each a
// node certificate.
func makeNodes(ctx context.Context, dbURL string, b *pki.Bundle, roots *x509.CertPool, n int) []*node {
	conn, err := pgx.Connect(ctx, dbURL)
	check(err)
	defer conn.Close(ctx)
	site, pool := ids.New("site"), ids.New("pool")
	_, err = conn.Exec(ctx, `insert into sites (site_id, tenant_id, kind, region, created_by, idem_request) values ($1, 'bench', 'custom', 'bench', 'sessionload', '{}')`, site)
	check(err)
	_, err = conn.Exec(ctx, `insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		values ($1, 'bench', $2, 'bench', 'vps-host', 'hosted', 'qemu', 'node-daemon', 'sessionload', '{}')`, pool, site)
	check(err)
	nodes := make([]*node, n)
	rows := make([][]any, n)
	for i := range nodes {
		id := ids.New("node")
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		check(err)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		check(err)
		csr, err := x509.ParseCertificateRequest(der)
		check(err)
		cert, err := b.IssueNode(csr, id)
		check(err)
		nodes[i] = newNode(id, tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}, roots)
		rows[i] = []any{id, pool, site, "host-" + strconv.Itoa(i), "ready", []byte("{}"), 0, 0, 0}
	}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"nodes"},
		[]string{"node_id", "pool_id", "site_id", "hostname", "state", "labels", "cap_vcpu", "cap_memory_mib", "cap_disk_gib"}, pgx.CopyFromRows(rows))
	check(err)
	return nodes
}

// startGateway starts a gateway and returns once it listens on port;
// started, when not nil, is told the process id as soon as it runs.
func startGateway(bin string, env []string, logPath string, port int, started func(pid int)) *exec.Cmd {
	logf, err := os.Create(logPath)
	check(err)
	cmd := exec.Command(bin, "serve")
	if gatewayCPUs != "" {
		// taskset execs the gateway: the pid is the gateway's.
		cmd = exec.Command("taskset", "-c", gatewayCPUs, bin, "serve")
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	check(cmd.Start())
	if started != nil {
		started(cmd.Process.Pid)
	}
	for i := 0; i < 300; i++ {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond); err == nil {
			_ = c.Close()
			return cmd
		}
		time.Sleep(20 * time.Millisecond)
	}
	log.Fatalf("sessionload: the gateway did not listen; see %s", logPath)
	return nil
}

var rssRe = regexp.MustCompile(`VmRSS:\s+(\d+) kB`)

// cpuTime is a process's user and system CPU time.
func cpuTime(pid int) time.Duration {
	d, err := benchkit.ProcessCPU(pid)
	check(err)
	return d
}

var sysRe = regexp.MustCompile(`(?m)^sysc([rw]): (\d+)$`)

// sysCalls is a process's read and write system calls so far
// (/proc/<pid>/io: syscr, syscw).
func sysCalls(pid int) [2]int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	check(err)
	var v [2]int64
	for _, m := range sysRe.FindAllSubmatch(b, -1) {
		n, _ := strconv.ParseInt(string(m[2]), 10, 64)
		if string(m[1]) == "r" {
			v[0] = n
		} else {
			v[1] = n
		}
	}
	return v
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	m := rssRe.FindSubmatch(b)
	if m == nil {
		log.Fatal("sessionload: no VmRSS")
	}
	v, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return v
}

// raiseNoFile lifts the open-file limit to its hard limit; the gateway
// child inherits it. The limit is per process: this one holds the n
// client ends and the gateway the n server ends, each with some room for
// the database, logs and the reconnects' overlap.
func raiseNoFile(n int) {
	var l syscall.Rlimit
	check(syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l))
	l.Cur = l.Max
	check(syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l))
	if l.Cur < uint64(n+500) {
		log.Fatalf("sessionload: the open-file limit %d is too low for %d sessions", l.Cur, n)
	}
}

func report(n, dials int, rs []result, load string) string {
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	row := func(name string, f func(result) string) string {
		line := "| " + name
		for _, r := range rs {
			line += " | " + f(r)
		}
		return line + " |\n"
	}
	// The goals are judged on the default configuration, where every
	// session is a full handshake; the resumed figures are for
	// gateway.sessionTicketDays.
	worstPer, worstBack, worstResumed, allBack := 0.0, time.Duration(0), time.Duration(0), true
	for _, r := range rs {
		worstPer, worstBack, worstResumed = max(worstPer, r.perSession), max(worstBack, r.backFull), max(worstResumed, r.back)
		allBack = allBack && r.final == int64(n) && r.finalFull == int64(n) && r.held == int64(n)
	}
	head, sep := "| Figure", "|---"
	for i := range rs {
		head += fmt.Sprintf(" | run %d", i+1)
		sep += "|---:"
	}
	kib := func(v float64) string { return fmt.Sprintf("%.1f KiB", v) }
	cpuBudget := "one core for"
	if gatewayCPUs == "" {
		cpuBudget = "at best both cores shared by the load tool and"
	}
	return fmt.Sprintf(`## Gateway sessions

Written by `+"`make bench-sessions`"+` (tools/sessionload) on %s: one gateway process
(computed with the gateway role only) and %d daemon sessions held by the load tool over
mutual TLS 1.3 and WebSocket, each a real node certificate, hello and welcome, and a
status at once and every 5 s, as the daemon sends them; %d runs, each a fresh gateway; the load tool (on the same machine) keeps
at most %d handshakes in flight; %s; %d cores, %s; load average %s when written (the machine
is shared).

%s |
%s|
%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s
Each run restarts its gateway twice (SIGKILL, then a new process on the same port): once
with the daemons' TLS session tickets dropped, so every session is a full handshake, once
with the tickets their sessions got, so each resumes (the gateway runs with
gateway.sessionTicketDays: 7; docs/gateway.md), full handshakes first on odd runs and
resuming first on even ones; then every daemon drops its session and comes back to the
running gateway with a full handshake (a network blip, a fleet-wide daemon restart: the
gateway has verified each client chain before and remembers it). The load tool dials
with the daemon's TLS configuration (agent.MTLSConfig, each node its own ticket cache) and
reconnects with its delays (agent.Run's: at once after a session that lasted, then 200 ms
doubling to 1 s, jittered). What it does differently from a daemon, since it plays all of
them on one core, is its own side's cost, not the gateway's work: it runs each handshake on
the session's goroutine over a TCP connection it dials itself and writes the upgrade request
as net/http does (no Transport per dial), encodes the hello once per node and the status
(no instances) once for all, bounds each step with a deadline on the connection rather
than a context, and keeps at most %d handshakes in flight (daemons on their own machines
would not queue). The gateway sees the same TCP connections, TLS 1.3 handshakes (hybrid
key exchange, client certificates, resumption), upgrade requests, hellos and statuses; it
sends no ping with each heartbeat, as the daemon does, so the gateway's pongs are not in
the figures.

"All back" is timed from the new gateway's exec (the killed one reaped) to the last
session's welcome; the timeline rows count from the SIGKILL (exec, the first successful
probe of the port, half and all of the sessions welcomed again), and the row after them
splits the storm from listening to all back between the three processes on the two cores:
the gateway (its core), the load tool (the other) and PostgreSQL (either); the next says how
busy each core was (what the three leave is other processes or idle). Each daemon's own
restart is timed too: when it saw its session end, its first dial, the dial that was
welcomed, and its welcome. The daemons queue for the load tool's dial slots, which stand in
for the gateway's own queue of a real fleet: a first dial long after the session's end with
a short welcomed dial says the gateway's rate, not the daemons' schedule, brought them back.

Goals: at most 24 KiB per idle session (worst run %.1f KiB: %s); all %d back within 10 s of
a restart (with full handshakes, the default: worst run %s: %s; resuming, with
gateway.sessionTicketDays: worst run %s). The figure that drives the reconnect is the restarted
gateway's CPU per returning session, less the CPU of its own start (before it listens): %s
the gateway, 10 s for all %d needs it under %.2f ms. Memory per session is the gateway's resident set with the
sessions less its resident set before, over %d; the heap and stack rows are the runtime's
own figures (runtime.MemStats: heap in use, goroutine stacks), so the rest of the resident
set is garbage not yet collected and the runtime's own. Every run's cold connect is full
handshakes (the daemons' tickets dropped first), as the default gateway.sessionTicketDays: 0
gives; a resumed session holds more (the row after the second restart, odd runs).

`, time.Now().UTC().Format("2006-01-02"), n, len(rs), dials, pinning, runtime.NumCPU(), runtime.Version(), load,
		head, sep,
		row("gateway RSS before / with the sessions", func(r result) string {
			return fmt.Sprintf("%d / %d KiB (%d)", r.before, r.after, r.held)
		}),
		row("memory per idle session (cold: full handshakes)", func(r result) string { return kib(r.perSession) }),
		row("of which heap in use", func(r result) string { return kib(r.heapPer) }),
		row("of which goroutine stacks", func(r result) string { return kib(r.stackPer) }),
		row("after the second restart (odd runs: resumed, even: full): memory / heap and stacks per session", func(r result) string {
			return fmt.Sprintf("%s / %s", kib(r.resumedRSS), kib(r.resumedPer))
		}),
		row("goroutines per session", func(r result) string { return fmt.Sprintf("%.2f", r.goroutinesPer) }),
		row(fmt.Sprintf("all %d connected (cold)", n), func(r result) string { return r.cold.Round(10 * time.Millisecond).String() }),
		row("all back after SIGKILL and a restart, full handshakes (tickets dropped)", func(r result) string {
			return fmt.Sprintf("%s (%d)", r.backFull.Round(10*time.Millisecond), r.finalFull)
		}),
		row("all back after SIGKILL and a restart, resuming", func(r result) string {
			return fmt.Sprintf("%s (%d)", r.back.Round(10*time.Millisecond), r.final)
		}),
		row("restart timeline since the SIGKILL, full; resuming: new gateway's exec / listening / half back / all back", func(r result) string {
			tl := func(t timelineSummary) string {
				return fmt.Sprintf("%.2f / %.2f / %.1f / %.1f s", t.exec.Seconds(), t.listen.Seconds(), t.half.Seconds(), t.all.Seconds())
			}
			return tl(r.timelineFull) + "; " + tl(r.timelineResumed)
		}),
		row("from listening to all back, full; resuming: share of its core used by the gateway / the load tool, CPU per session back of the gateway / the load tool / PostgreSQL", func(r result) string {
			tl := func(t timelineSummary) string {
				return fmt.Sprintf("%.0f / %.0f %%, %.2f / %.2f / %.2f ms", 100*t.gatewayShare, 100*t.loadShare, t.perSession[0], t.perSession[1], t.perSession[2])
			}
			return tl(r.timelineFull) + "; " + tl(r.timelineResumed)
		}),
		row("from listening to all back, full; resuming: core 0 / core 1 busy (by anything; what the gateway and the load tool leave is others' or idle)", func(r result) string {
			tl := func(t timelineSummary) string {
				return fmt.Sprintf("%.0f / %.0f %%", 100*t.coreBusy[0], 100*t.coreBusy[1])
			}
			return tl(r.timelineFull) + "; " + tl(r.timelineResumed)
		}),
		row("each daemon's restart, full; resuming: p50 / p90 / last, s since the SIGKILL: its session seen lost, its first dial, the dial that was welcomed, back", func(r result) string {
			tl := func(t timelineSummary) string {
				d := t.daemons
				f := func(v [4]float64) string { return fmt.Sprintf("%.2f / %.2f / %.2f", v[1], v[2], v[3]) }
				return fmt.Sprintf("%s, %s, %s, %s", f(d.lost), f(d.first), f(d.last), f(d.back))
			}
			return tl(r.timelineFull) + "; " + tl(r.timelineResumed)
		}),
		row("**restarted gateway's CPU per session back, less its start: full / resuming**", func(r result) string {
			per := func(d, start time.Duration, k int64) string {
				return fmt.Sprintf("**%.2f ms**", float64((d-start).Microseconds())/1000/float64(max(k, 1)))
			}
			return per(r.cpuFull, r.startCPUFull, r.finalFull) + " / " + per(r.cpuResumed, r.startCPUResumed, r.final)
		}),
		row("restarted gateway's CPU before it listened (its start): full / resuming", func(r result) string {
			return fmt.Sprintf("%d / %d ms", r.startCPUFull.Milliseconds(), r.startCPUResumed.Milliseconds())
		}),
		row("restarted gateway's CPU per session back: full / resuming", func(r result) string {
			per := func(d time.Duration, k int64) string {
				return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000/float64(max(k, 1)))
			}
			return per(r.cpuFull, r.finalFull) + " / " + per(r.cpuResumed, r.final)
		}),
		row("load tool's CPU per session back (the daemons' side): full / resuming", func(r result) string {
			per := func(d time.Duration, k int64) string {
				return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000/float64(max(k, 1)))
			}
			return per(r.loadFull, r.finalFull) + " / " + per(r.loadResumed, r.final)
		}),
		row("restarted gateway's read / write system calls per session back, from listening: full; resuming", func(r result) string {
			per := func(v [2]int64, k int64) string {
				return fmt.Sprintf("%.2f / %.2f", float64(v[0])/float64(max(k, 1)), float64(v[1])/float64(max(k, 1)))
			}
			return per(r.sysFull, r.finalFull) + "; " + per(r.sysResumed, r.final)
		}),
		row("restarted gateway: database round trips per hello (session rows), full / resuming", func(r result) string {
			per := func(v map[string]int64) string {
				if v == nil || v["hellos"] == 0 {
					return "n/a"
				}
				return fmt.Sprintf("%.2f", float64(v["helloRoundTrips"])/float64(v["hellos"]))
			}
			return per(r.varsFull) + " / " + per(r.varsResumed)
		}),
		row("restarted gateway: client chains verified / found verified before / of resumed sessions, not verified, full; resuming; with the drops", func(r result) string {
			per := func(v map[string]int64) string {
				if v == nil {
					return "n/a"
				}
				return fmt.Sprintf("%d / %d / %d", v["chainsVerified"], v["chainsCached"], v["chainsResumed"])
			}
			return per(r.varsFull) + "; " + per(r.varsResumed) + "; with the drops, since its start: " + per(r.varsRejoin)
		}),
		row("all back after every daemon dropped its session (gateway running, full handshakes)", func(r result) string {
			return fmt.Sprintf("%s (%d)", r.rejoin.Round(10*time.Millisecond), r.rejoinFinal)
		}),
		row("**gateway's CPU per session back after the drops** / load tool's", func(r result) string {
			per := func(d time.Duration) string {
				return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000/float64(max(r.rejoinFinal, 1)))
			}
			return "**" + per(r.cpuRejoin) + "** / " + per(r.loadRejoin)
		}),
		row("restarted gateway: statuses written / skipped (unchanged), full restart", func(r result) string {
			if r.varsFull == nil {
				return "n/a"
			}
			return fmt.Sprintf("%d / %d", r.varsFull["statusWrites"], r.varsFull["statusSkipped"])
		}),
		dials, worstPer, verdict(worstPer <= 24), n, worstBack.Round(10*time.Millisecond), verdict(allBack && worstBack <= 10*time.Second),
		worstResumed.Round(10*time.Millisecond), cpuBudget, n, 10000.0/float64(n), n)
}

func run(cmd *exec.Cmd) {
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil {
		log.Fatalf("sessionload: %s: %v %s", strings.Join(cmd.Args, " "), err, out)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal("sessionload: ", err)
	}
}
