// Command loadbench drives one API method through the generated client at a
// fixed concurrency for a fixed time against a running server and prints
// throughput and latency percentiles as JSON. scripts/bench.sh runs it next
// to pgbench on the same database and writes docs/benchmarks.md.
//
//	loadbench -url http://127.0.0.1:3000/api/compute -token cpk_... -method sites.get -tenant bench -site site_...
//	loadbench ... -method secrets.put -tenant bench
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
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
	flag.Parse()

	transport := &http.Transport{MaxIdleConns: *conc * 2, MaxIdleConnsPerHost: *conc * 2, IdleConnTimeout: time.Minute}
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
	run(call, *conc, *warm) // warm-up
	res := run(call, *conc, *dur)
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
	var errs atomic.Int64
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
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000
	}
	return Result{Concurrency: conc, Seconds: secs, Calls: int64(len(all)), Errors: errs.Load(),
		PerSecond: float64(len(all)) / secs, P50Ms: pct(0.50), P99Ms: pct(0.99)}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadbench:", err)
	os.Exit(1)
}
