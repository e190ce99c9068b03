// Command loadbench drives one API method through the generated client for a
// fixed time against a running server and prints throughput and latency
// percentiles as JSON: at a fixed concurrency (a closed loop: the peak), or
// with -rate at a fixed arrival rate (an open loop: calls start on schedule
// whether or not earlier ones answered, so queueing shows, and latency
// counts from the scheduled start). scripts/bench.sh runs it next to
// pgbench on the same database and writes docs/benchmarks.md.
//
//	loadbench -url http://127.0.0.1:3000/api/compute -token cpk_... -method sites.get -tenant bench -site site_...
//	loadbench ... -method secrets.put -tenant bench
//	loadbench ... -method sites.get -rate 3000   # open loop, 3,000 calls/s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"computeplane/computeclient"
	"computeplane/gen/client"
)

// Result is what one run measured.
type Result struct {
	Method      string  `json:"method"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	Calls       int64   `json:"calls"`
	Errors      int64   `json:"errors"`
	PerSecond   float64 `json:"perSecond"`
	P50Ms       float64 `json:"p50Ms"`
	P99Ms       float64 `json:"p99Ms"`
	// Rate is the open loop's arrival rate; RateLimited the calls refused
	// with RATE_LIMITED (shed), apart from other errors (a closed loop's
	// caller then waits retryAfterMs, as clients are asked to).
	Rate        float64 `json:"rate,omitempty"`
	RateLimited int64   `json:"rateLimited,omitempty"`
	// Open loop only: p99 of how late the generator itself started calls
	// against their schedule (a generator short of CPU falls behind, and
	// that lateness is in the latencies too).
	LateP99Ms float64 `json:"lateP99Ms,omitempty"`
}

func main() {
	url := flag.String("url", "http://127.0.0.1:3000/api/compute", "API URL (origin and base path)")
	token := flag.String("token", os.Getenv("SERVICE_TOKEN"), "API key")
	method := flag.String("method", "sites.get", "sites.get or secrets.put")
	tenant := flag.String("tenant", "bench", "tenant")
	site := flag.String("site", "", "site id for sites.get")
	conc := flag.Int("c", 32, "concurrent callers")
	dur := flag.Duration("d", 10*time.Second, "duration")
	warm := flag.Duration("warmup", 2*time.Second, "warm-up, not measured")
	rate := flag.Float64("rate", 0, "open loop: calls started per second (0: closed loop at -c)")
	flag.Parse()
	generatorGC()

	// An open loop keeps about rate x latency connections busy, more when
	// the server slows down: keep them all rather than dial anew per call.
	idle := *conc * 2
	if *rate > 0 {
		idle = max(idle, 2048)
	}
	transport := &http.Transport{MaxIdleConns: idle, MaxIdleConnsPerHost: idle, IdleConnTimeout: time.Minute}
	c, err := computeclient.New(*url, computeclient.WithToken(*token), computeclient.WithHTTPClient(&http.Client{Transport: transport}))
	if err != nil {
		fail(err)
	}
	var seq atomic.Int64
	call := func(ctx context.Context) error {
		switch *method {
		case "sites.get":
			_, err := c.SitesGet(ctx, &client.SitesGetInput{TenantId: *tenant, SiteId: *site})
			return err
		case "secrets.put":
			n := seq.Add(1)
			_, err := c.SecretsPut(ctx, &client.SecretsPutInput{
				TenantId: *tenant, Name: fmt.Sprintf("bench-%d", n%64), Value: "value-of-a-benchmark-secret",
				IdempotencyKey: fmt.Sprintf("k-%d", n),
			})
			return err
		}
		return fmt.Errorf("unknown method %s", *method)
	}
	var res Result
	if *rate > 0 {
		openLoop(call, *rate, *warm) // warm-up
		res = openLoop(call, *rate, *dur)
	} else {
		run(call, *conc, *warm) // warm-up
		res = run(call, *conc, *dur)
	}
	res.Method = *method
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail(err)
	}
}

func run(call func(context.Context) error, conc int, d time.Duration) Result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	lat := make([][]time.Duration, conc)
	var errs, limited atomic.Int64
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t0 := time.Now()
				err := call(context.Background())
				if ctx.Err() != nil {
					return // the call straddled the end: not counted
				}
				if e, ok := computeclient.AsError(err); ok && e.Code == "RATE_LIMITED" {
					// Shed: a well-behaved client waits as told.
					limited.Add(1)
					if e.RetryAfterMs != nil {
						time.Sleep(time.Duration(*e.RetryAfterMs) * time.Millisecond)
					}
					continue
				}
				if err != nil {
					if errs.Add(1) == 1 {
						fmt.Fprintln(os.Stderr, "loadbench: first error:", err)
					}
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	res := summarize(all, secs)
	res.Concurrency, res.Errors, res.RateLimited = conc, errs.Load(), limited.Load()
	return res
}

// maxOutstanding bounds the calls an open loop has started and not seen
// answered; an arrival beyond it counts as an error (the server stalled).
const maxOutstanding = 20000

// openLoop starts calls at rate per second for d, each on schedule in its
// own goroutine, and measures each from its scheduled start.
func openLoop(call func(context.Context) error, rate float64, d time.Duration) Result {
	var (
		mu      sync.Mutex
		lat     []time.Duration
		late    = make([]time.Duration, 0, int(rate*d.Seconds())+1)
		errs    atomic.Int64
		limited atomic.Int64
		out     atomic.Int64
		wg      sync.WaitGroup
	)
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	n := int(d / interval)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		late = append(late, max(0, time.Since(at)))
		if out.Load() >= maxOutstanding {
			errs.Add(1)
			continue
		}
		out.Add(1)
		wg.Go(func() {
			defer out.Add(-1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := call(ctx)
			took := time.Since(at)
			if err != nil {
				if e, ok := computeclient.AsError(err); ok && e.Code == "RATE_LIMITED" {
					limited.Add(1)
				} else if errs.Add(1) == 1 {
					fmt.Fprintln(os.Stderr, "loadbench: first error:", err)
				}
				return
			}
			mu.Lock()
			lat = append(lat, took)
			mu.Unlock()
		})
	}
	wg.Wait()
	res := summarize(lat, d.Seconds())
	res.Rate, res.Errors, res.RateLimited = rate, errs.Load(), limited.Load()
	slices.Sort(late)
	if len(late) > 0 {
		res.LateP99Ms = float64(late[int(0.99*float64(len(late)-1))].Microseconds()) / 1000
	}
	return res
}

// summarize turns the latencies of the calls that succeeded within secs
// into a Result.
func summarize(all []time.Duration, secs float64) Result {
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000
	}
	return Result{Seconds: secs, Calls: int64(len(all)), PerSecond: float64(len(all)) / secs, P50Ms: pct(0.50), P99Ms: pct(0.99)}
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
