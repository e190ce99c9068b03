// Command instancebench measures instances.create to running on real VMs
// (issue 13's benchmark): it runs computed (every role, the gateway
// included) and one compute-agent with the qemu runtime as child
// processes on a database of its own, creates -runs instances one after
// another and splits each one's time into the control plane's share
// (admission, placement and commit, then the spec reaching the daemon,
// which acknowledges it by its observed generation) and the host's share
// (the VM booting until its guest agent answers). It writes the section
// "Instances" of docs/benchmarks.md and docs/benchmarks-notes.md.
//
//	go run ./tools/instancebench [-runs 100] [-database $SERVICE_DATABASE_URL]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"computeplane/gen/client"
	"computeplane/internal/images"
	"computeplane/tools/benchkit"
)

func main() {
	runs := flag.Int("runs", 100, "instances created, one after another (the nearest-rank p99 of 50 runs is their maximum, of 100 the second largest)")
	database := flag.String("database", os.Getenv("SERVICE_DATABASE_URL"), "a PostgreSQL URL; a database of its own is made on that server")
	imagesDir := flag.String("images", ".service/images", "the image source with computeplane/minimal (make images)")
	out := flag.String("out", "docs/benchmarks.md", "the benchmarks page")
	notes := flag.String("notes", "docs/benchmarks-notes.md", "the notes page make bench appends")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	ctx := context.Background()
	if _, err := (&images.Dir{Path: *imagesDir}).Get(ctx, "computeplane/minimal"); err != nil {
		log.Fatalf("instancebench: %v (run make images)", err)
	}
	f := benchkit.StartFleet(ctx, "instancebench", *database, *imagesDir)
	defer f.Close()
	check = func(err error) {
		if err != nil {
			f.Fatal(err.Error())
		}
	}
	c, db, node, work := f.C, f.DB, f.Node, f.Work
	pool := f.PoolID
	im, err := (&images.Dir{Path: *imagesDir}).Get(ctx, "computeplane/minimal")
	check(err)
	var admit, deliver, host, total, bare []time.Duration
	for i := 0; i < *runs; i++ {
		// The same image booted by qemu alone, in the same run: the host
		// share's baseline.
		d, err := benchkit.BareBoot(ctx, work, im, i)
		check(err)
		bare = append(bare, d)
		var gen0 int64
		_ = db.QueryRow(ctx, `select observed_generation from nodes where node_id = $1`, node).Scan(&gen0)
		t0 := time.Now()
		res, err := c.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: "bench", PoolId: pool, Flavor: "small", Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone),
			ImageId: "computeplane/minimal", Name: "vm-" + strconv.Itoa(i), IdempotencyKey: "i" + strconv.Itoa(i)})
		check(err)
		t1 := time.Now()
		id := res.Data.InstanceId
		var t2, t3 time.Time
		for t3.IsZero() {
			var gen int64
			var state string
			check(db.QueryRow(ctx, `select n.observed_generation, i.state from nodes n, instances i where n.node_id = $1 and i.instance_id = $2`, node, id).Scan(&gen, &state))
			if t2.IsZero() && gen > gen0 {
				t2 = time.Now()
			}
			if state == "running" {
				t3 = time.Now()
				if t2.IsZero() {
					t2 = t3
				}
			}
			if state == "failed" {
				log.Fatalf("instancebench: instance %s failed", id)
			}
			time.Sleep(2 * time.Millisecond)
		}
		admit, deliver, host, total = append(admit, t1.Sub(t0)), append(deliver, t2.Sub(t1)), append(host, t3.Sub(t2)), append(total, t3.Sub(t0))
		_, err = c.InstancesDelete(ctx, &client.InstancesDeleteInput{TenantId: "bench", InstanceId: id})
		check(err)
		for {
			var state string
			check(db.QueryRow(ctx, `select state from instances where instance_id = $1`, id).Scan(&state))
			if state == "deleted" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		log.Printf("run %d: total %s (admission %s, delivery %s, host %s) %s created at %s", i+1, t3.Sub(t0).Round(time.Millisecond),
			t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond), id, t0.UTC().Format("15:04:05.000000"))
	}
	cp := make([]time.Duration, len(admit))
	for i := range admit {
		cp[i] = admit[i] + deliver[i]
	}
	section := fmt.Sprintf(`## Instances

Written by `+"`make bench-instances`"+` (tools/instancebench) on %s: computed (every role, the
gateway included) and one compute-agent with the qemu runtime on this machine, %d instances
(1 vCPU, 256 MiB, the minimal image: its own guest kernel (images/kernel) and an initramfs with
compute-guest) created one after another, each deleted before the next; TCG, not KVM (see
../shared/design/TOOLING.md); %d cores, %s. The control plane's share is the create call
(admission, placement, quota, commit) plus the spec reaching the daemon (its observed
generation acknowledges it); the host's share is the VM booting until compute-guest answers
and took its identity.

| Figure | p50 | p99 |
|---|---:|---:|
| create to running, end to end | %s | %s |
| control plane: create call | %s | %s |
| control plane: spec delivered and acknowledged | %s | %s |
| control plane, together | %s | %s |
| host: boot to a ready guest | %s | %s |
| bare qemu boot of the same image to a ready guest (baseline) | %s | %s |

The host share is %.0f %% above the bare boot at p50 (goal: at most 10 %%); the create
call's p99 is %s (goal of issue 26: at most 10 ms) and the control plane's, together,
%s (goal: under 20 ms). Load average when the run ended (uptime): %s.

`, time.Now().UTC().Format("2006-01-02"), *runs, runtime.NumCPU(), runtime.Version(),
		benchkit.Pct(total, 50), benchkit.Pct(total, 99), benchkit.Pct(admit, 50), benchkit.Pct(admit, 99), benchkit.Pct(deliver, 50), benchkit.Pct(deliver, 99), benchkit.Pct(cp, 50), benchkit.Pct(cp, 99), benchkit.Pct(host, 50), benchkit.Pct(host, 99), benchkit.Pct(bare, 50), benchkit.Pct(bare, 99),
		100*(float64(benchkit.Quantile(host, 50))/float64(benchkit.Quantile(bare, 50))-1), benchkit.Pct(admit, 99), benchkit.Pct(cp, 99), loadAverage())
	fmt.Print(section)
	check(benchkit.WriteSection("## Instances", section, *out, *notes))
}

// check ends the tool on an error (after the fleet is cleaned up, once
// it runs).
var check = func(err error) {
	if err != nil {
		log.Fatal("instancebench: ", err)
	}
}

// loadAverage is the machine's load (1, 5 and 15 minutes) as
// /proc/loadavg says, for figures taken on a shared machine.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return "unknown"
}
