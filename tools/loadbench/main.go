// Command loadbench drives one API method for a fixed time against a
// running server and prints throughput and latency percentiles as JSON: at
// a fixed concurrency (a closed loop), with -rate at a fixed arrival rate
// (an open loop: calls start on schedule whether or not earlier ones
// answered, so queueing shows, and latency counts from the scheduled
// start), or with -search the sustained peak found by an open loop whose
// rate rises while the server keeps up with it (search.go). scripts/bench.sh runs
// it next to pgbench on the same database and writes docs/benchmarks.md.
//
// It speaks HTTP/1.1 itself (httpwire.go, gen.go): requests encoded once,
// keep-alive connections, answers read for their status, Retry-After and
// length only, so that one core sends well over the server's peak. Each
// result carries the generator's own CPU per call (cpuUsPerCall).
//
//	loadbench -url http://127.0.0.1:3000/api/compute -token cpk_... -method sites.get -tenant bench -site site_...
//	loadbench ... -method secrets.put -tenant bench
//	loadbench ... -method sites.get -rate 3000   # open loop, 3,000 calls/s
//	loadbench ... -method sites.get -search      # open-loop peak search
//	loadbench -canned 127.0.0.1:9000             # a trivial server, to measure loadbench itself
//	loadbench -url http://127.0.0.1:9000/api/compute -method canned -rate 30000
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	"time"
)

// Result is what one run measured.
type Result struct {
	Method      string  `json:"method"`
	Concurrency int     `json:"concurrency,omitempty"`
	Seconds     float64 `json:"seconds"`
	// Calls is the calls answered 200; PerSecond the goodput: those that
	// completed within the run's window, per second of it.
	Calls     int64   `json:"calls"`
	Errors    int64   `json:"errors"`
	PerSecond float64 `json:"perSecond"`
	P50Ms     float64 `json:"p50Ms"`
	P99Ms     float64 `json:"p99Ms"`
	// Rate is the open loop's arrival rate; RateLimited the calls refused
	// with RATE_LIMITED, retryAfterMs and Retry-After (shed), apart from
	// other errors (a closed loop's caller then waits retryAfterMs, as
	// clients are asked to).
	Rate        float64 `json:"rate,omitempty"`
	RateLimited int64   `json:"rateLimited,omitempty"`
	// Open loop only: p99 of how late the generator itself started calls
	// against their schedule (a generator short of CPU falls behind, and
	// that lateness is in the latencies too), and the connections open.
	LateP99Ms float64 `json:"lateP99Ms,omitempty"`
	Conns     int     `json:"conns,omitempty"`
	// CPUUsPerCall is the generator's own CPU time (user and system) per
	// call sent, in microseconds: 1e6 / it is the calls per second one
	// core of it can send.
	CPUUsPerCall float64 `json:"cpuUsPerCall,omitempty"`
	// Search only: the rates tried, in order, and the bound on p99.
	Steps      []Result `json:"steps,omitempty"`
	P99BoundMs float64  `json:"p99BoundMs,omitempty"`
	PeakMethod string   `json:"peakMethod,omitempty"`

	timeline []callTime // -timeline: the measured run's calls
}

func main() {
	apiURL := flag.String("url", "http://127.0.0.1:3000/api/compute", "API URL (origin and base path)")
	token := flag.String("token", os.Getenv("SERVICE_TOKEN"), "API key")
	method := flag.String("method", "sites.get", "sites.get, secrets.put, or canned (against -canned)")
	tenant := flag.String("tenant", "bench", "tenant")
	site := flag.String("site", "", "site id for sites.get")
	conc := flag.Int("c", 32, "closed loop: concurrent callers")
	dur := flag.Duration("d", 10*time.Second, "duration")
	warm := flag.Duration("warmup", 2*time.Second, "warm-up, not measured")
	rate := flag.Float64("rate", 0, "open loop: calls started per second (0: closed loop at -c)")
	maxConns := flag.Int("max-conns", 4096, "open loop: most connections open at once")
	timeout := flag.Duration("timeout", 15*time.Second, "one call's bound, from its scheduled start")
	search := flag.Bool("search", false, "open-loop peak search (see -search-from, -search-step, -p99-bound)")
	from := flag.Float64("search-from", 500, "search: the first rate")
	step := flag.Float64("search-step", 1.25, "search: each rate is the previous one times this")
	stepDur := flag.Duration("search-d", 3*time.Second, "search: each rate's duration")
	bound := flag.Duration("p99-bound", 100*time.Millisecond, "search: a rate whose p99 passes this is past the peak")
	canned := flag.String("canned", "", "serve a canned answer on this address (a trivial server to measure the generator against)")
	cpuprofile := flag.String("cpuprofile", "", "write the generator's CPU profile here")
	timeline := flag.String("timeline", "", "open loop: write each answered call of the measured run here (due s, latency ms, status)")
	flag.Parse()
	generatorGC()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *canned != "" {
		if err := serveCanned(*canned); err != nil {
			fail(err)
		}
		return
	}

	u, err := url.Parse(*apiURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fail(fmt.Errorf("-url %q: want http://host:port/base", *apiURL))
	}
	req, err := requestFor(*method, u, *token, *tenant, *site)
	if err != nil {
		fail(err)
	}
	g := newGenerator(u.Host, req, *maxConns, *timeout)
	cpu0 := cpuTime()
	var res Result
	switch {
	case *search:
		res = g.searchPeak(*from, *step, *stepDur, *bound)
	case *rate > 0:
		g.openLoop(*rate, *warm, false) // warm-up: connections opened, server warm
		cpu0 = cpuTime()
		res = g.openLoop(*rate, *dur, *timeline != "")
	default:
		g.closedLoop(*conc, *warm)
		cpu0 = cpuTime()
		res = g.closedLoop(*conc, *dur)
	}
	if sent := g.seq.Load(); sent > 0 && !*search {
		res.CPUUsPerCall = float64((cpuTime() - cpu0).Microseconds()) / float64(res.sent())
	}
	g.close()
	if *timeline != "" {
		if err := writeTimeline(*timeline, res.timeline); err != nil {
			fail(err)
		}
	}
	res.Method = *method
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail(err)
	}
}

// sent is the calls a run sent (answered in any way).
func (r Result) sent() int64 { return max(1, r.Calls+r.Errors+r.RateLimited) }

// requestFor encodes method's request once.
func requestFor(method string, u *url.URL, token, tenant, site string) (*requestTemplate, error) {
	path := func(p string) string { return u.Path + p }
	switch method {
	case "sites.get":
		if site == "" {
			return nil, fmt.Errorf("sites.get needs -site")
		}
		return newRequest(u.Host, path("/sites/get"), token, jsonObject("tenantId", tenant, "siteId", site))
	case "secrets.put":
		// 64 names (the rows pgbench's script updates), a new idempotency
		// key per call.
		body := `{"tenantId":` + jsonString(tenant) + `,"name":"bench-%02d","value":"value-of-a-benchmark-secret","idempotencyKey":"k-%016d"}`
		return newRequest(u.Host, path("/secrets/put"), token, body, 64)
	case "canned":
		return newRequest(u.Host, path("/canned"), token, `{}`)
	}
	return nil, fmt.Errorf("unknown method %s", method)
}

func jsonObject(kv ...string) string {
	s := "{"
	for i := 0; i < len(kv); i += 2 {
		if i > 0 {
			s += ","
		}
		s += jsonString(kv[i]) + ":" + jsonString(kv[i+1])
	}
	return s + "}"
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// cpuTime is the process's CPU time so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// generatorGCPercent is the generator's collector target. Every latency
// counts from the call's scheduled start, so a generator that stops for
// its own collection (the mark worker and assists take its one pinned
// core) adds its pause to the calls in flight: at the default 100 an open
// loop at 1,000 calls/s collected about twice a second, with up to 90 ms
// of assist CPU in a cycle on a loaded machine. Its heap is small (tens
// of MB), so a larger target costs little memory. GOGC in the
// environment wins.
const generatorGCPercent = 800

func generatorGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(generatorGCPercent)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadbench:", err)
	os.Exit(1)
}
