// Command sandboxbench measures sandboxes.create to running on real VMs
// (issue 14's benchmark): a warm claim, a cold boot and a restore from a
// snapshot, -runs of each, one after another on one compute-agent with the
// qemu runtime (benchkit.StartFleet). Each create waits for the sandbox
// to run (its guest answered with its own identity); the host's share is
// what the daemon measured (the VM started, resumed or restored until the
// guest took its identity and checked out), the control plane's share the
// rest of the end-to-end time. It writes the section "Sandboxes" of
// docs/benchmarks.md and docs/benchmarks-notes.md.
//
//	go run ./tools/sandboxbench [-runs 100] [-rounds 3] [-database $SERVICE_DATABASE_URL]
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"computeplane/gen/client"
	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/images"
	"computeplane/tools/benchkit"
)

var slowestN *int

// series is one kind of start's figures.
type series struct {
	name                 string
	total, control, host []time.Duration
	claims               []claim
}

// claim is one create's timeline, from the client's clock and the
// sandbox's row (the same host's clock): the call reaching the server
// (created_at), the VM taken (placed_at), the status that found it ready
// begun (ready_at), the answer back; with the daemon's host share and
// what the scheduler says of the fleet's processes meanwhile.
type claim struct {
	n                                     int
	total, toServer, placed, ready, reply time.Duration
	host                                  time.Duration
	sched                                 string
}

func main() {
	runs := flag.Int("runs", 100, "sandboxes created of each kind per round (the nearest-rank p99 of 50 is their maximum, of 100 the second largest)")
	rounds := flag.Int("rounds", 3, "rounds of every kind, reported side by side for their spread (the machines are noisy)")
	database := flag.String("database", os.Getenv("SERVICE_DATABASE_URL"), "a PostgreSQL URL; a database of its own is made on that server")
	imagesDir := flag.String("images", ".service/images", "the image source with computeplane/minimal (make images)")
	out := flag.String("out", "docs/benchmarks.md", "the benchmarks page")
	notes := flag.String("notes", "docs/benchmarks-notes.md", "the notes page make bench appends")
	only := flag.String("only", "", "run only this kind: warm, restore or cold (while iterating; the report then has that kind's rows only)")
	slowestN = flag.Int("slowest", 5, "the slowest warm claims of all rounds traced by phase in the report")
	restorePool := flag.Int("restore-pool", -1, "the agent's --restore-pool (qemus started ahead per snapshot); -1 leaves its default (an A/B: 0 against 1)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if *restorePool >= 0 {
		benchkit.AgentArgs = append(benchkit.AgentArgs, "--restore-pool", strconv.Itoa(*restorePool))
	}
	ctx := context.Background()
	if _, err := (&images.Dir{Path: *imagesDir}).Get(ctx, "computeplane/minimal"); err != nil {
		log.Fatalf("sandboxbench: %v (run make images)", err)
	}
	f := benchkit.StartFleet(ctx, "sandboxbench", *database, *imagesDir)
	defer f.Close()
	check := func(err error) {
		if err != nil {
			f.Fatal(err.Error())
		}
	}
	template := func(name string, warm int64) string {
		res, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: "bench", Name: name, PoolId: f.PoolID, Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
			Flavor: "small", ImageId: "computeplane/minimal", Warm: client.NewOptWarm(client.Warm{Min: warm})})
		check(err)
		return res.Data.TemplateId
	}
	n := 0
	create := func(in client.SandboxesCreateInput, s *series) client.Sandbox {
		n++
		in.TenantId, in.IdempotencyKey, in.Wait = "bench", "k"+strconv.Itoa(n), client.NewOptWait(client.Wait{TimeoutMs: 30000})
		s0, p0 := f.Sched(), benchkit.CPUPressure()
		t0 := time.Now()
		res, err := f.C.SandboxesCreate(ctx, &in)
		total := time.Since(t0)
		check(err)
		sb := res.Data
		// A wait is at most 30 s; on a loaded machine a boot can take
		// longer: follow the sandbox until it runs.
		for deadline := time.Now().Add(5 * time.Minute); (sb.State == "creating" || sb.State == "starting") && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			g, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: "bench", SandboxId: sb.SandboxId})
			check(err)
			sb = g.Data
		}
		total = time.Since(t0)
		s1, p1 := f.Sched(), benchkit.CPUPressure()
		if sb.State != "running" || sb.Timings.HostReadyMs.Null {
			f.Fatal(fmt.Sprintf("sandbox %s is %s (%v)", sb.SandboxId, sb.State, sb.Error))
		}
		host := time.Duration(sb.Timings.HostReadyMs.Value) * time.Millisecond
		if s != nil {
			s.total, s.host, s.control = append(s.total, total), append(s.host, host), append(s.control, max(total-host, 0))
			var created, placed, ready time.Time
			check(f.DB.QueryRow(ctx, `select created_at, placed_at, ready_at from sandboxes where sandbox_id = $1`, sb.SandboxId).Scan(&created, &placed, &ready))
			s.claims = append(s.claims, claim{n: len(s.total), total: total, toServer: created.Sub(t0), placed: placed.Sub(created),
				ready: ready.Sub(placed), reply: t0.Add(total).Sub(ready), host: host, sched: benchkit.SchedDelta(s0, s1)})
			log.Printf("%s %d: %s (host %s; the database saw it ready after %d ms) %s started %s", s.name, len(s.total), total.Round(time.Millisecond), host, sb.Timings.ReadyMs.Value, sb.SandboxId, t0.UTC().Format("15:04:05.000000"))
			log.Printf("  sched (ms ran/waited): %s; machine's CPU pressure %.1f ms", benchkit.SchedDelta(s0, s1), float64(p1-p0)/1e6)
		}
		return sb
	}
	remove := func(id string) {
		_, err := f.C.SandboxesDelete(ctx, &client.SandboxesDeleteInput{TenantId: "bench", SandboxId: id})
		check(err)
	}
	// settled waits for a template's warm pool to be full and quiet (no VM
	// booting on the host), so a claim is measured on an idle host.
	settled := func(tmpl string, want int) {
		for {
			var ready, busy int
			check(f.DB.QueryRow(ctx, `select count(*) filter (where kind = 'warm' and template_id = $1 and state = 'paused' and reported_identity = identity_generation),
				count(*) filter (where state in ('pending', 'starting') and desired_state <> 'deleted') from instances`, tmpl).Scan(&ready, &busy))
			if ready >= want && busy == 0 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// poolSettled waits, as settled does for the warm pool, until the
	// agent's restore pool is full and quiet (every pooled qemu waits to
	// be taken, none is starting), at most a minute.
	poolSize := *restorePool
	if poolSize < 0 {
		poolSize = 1 // the agent's default
	}
	poolSettled := func() {
		dir := vmruntime.PoolDir(filepath.Join(f.AgentDir, "runtime"))
		for deadline := time.Now().Add(time.Minute); poolSize > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			entries, _ := os.ReadDir(dir)
			slots, ready := 0, 0
			for _, e := range entries {
				if e.IsDir() { // (a link is a taken one's)
					slots++
					if _, err := os.Stat(filepath.Join(dir, e.Name(), vmruntime.ReadyFile)); err == nil {
						ready++
					}
				}
			}
			if ready >= poolSize && slots == ready {
				return
			}
		}
	}

	im, err := (&images.Dir{Path: *imagesDir}).Get(ctx, "computeplane/minimal")
	check(err)
	wt, ct := template("warm", 2), template("cold", 0)
	src := create(client.SandboxesCreateInput{TemplateId: client.NewOptString(ct)}, nil)
	snap, err := f.C.SandboxSnapshotsCreate(ctx, &client.SandboxSnapshotsCreateInput{TenantId: "bench", SandboxId: src.SandboxId, Keep: client.NewOptBool(true),
		IdempotencyKey: "snap", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	check(err)
	for deadline := time.Now().Add(5 * time.Minute); snap.Data.State != "ready" && snap.Data.State != "failed" && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		g, err := f.C.SandboxSnapshotsGet(ctx, &client.SandboxSnapshotsGetInput{TenantId: "bench", SnapshotId: snap.Data.SnapshotId})
		check(err)
		snap.Data = g.Data
	}
	if snap.Data.State != "ready" {
		f.Fatal("the snapshot is " + string(snap.Data.State))
	}
	var all [][]*series // per round: warm, restore, cold, bare
	for r := 0; r < *rounds; r++ {
		warm, restore, cold := &series{name: "warm claim"}, &series{name: "restore"}, &series{name: "cold boot"}
		bare := &series{name: "bare qemu boot (baseline)"}
		for i := 0; i < *runs && (*only == "" || *only == "warm"); i++ {
			settled(wt, 2)
			remove(create(client.SandboxesCreateInput{TemplateId: client.NewOptString(wt)}, warm).SandboxId)
		}
		for i := 0; i < *runs && (*only == "" || *only == "restore"); i++ {
			settled(ct, 0)
			poolSettled()
			remove(create(client.SandboxesCreateInput{FromSnapshot: client.NewOptString(snap.Data.SnapshotId)}, restore).SandboxId)
		}
		for i := 0; i < *runs && (*only == "" || *only == "cold"); i++ {
			settled(ct, 0)
			// The same image booted by qemu alone, in the same run and
			// on the same host: the cold boot's baseline.
			d, err := benchkit.BareBoot(ctx, f.Work, im, i)
			check(err)
			bare.total = append(bare.total, d)
			remove(create(client.SandboxesCreateInput{TemplateId: client.NewOptString(ct)}, cold).SandboxId)
		}
		all = append(all, []*series{warm, restore, cold, bare})
		log.Printf("round %d done", r+1)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	section := report(*runs, poolSize, all, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Print(section)
	check(benchkit.WriteSection("## Sandboxes", section, *out, *notes))
}

// report is the section: per kind and round, p50 and p99 of end to end,
// control plane and host.
func report(runs, restorePool int, all [][]*series, load string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `## Sandboxes

Written by `+"`make bench-sandboxes`"+` (tools/sandboxbench) on %s: computed (every role, the
gateway included) and one compute-agent with the qemu runtime on this machine; %d rounds of %d
sandboxes of each kind (1 vCPU, 256 MiB, the minimal image, guest memory in a shared file on a
tmpfs, a restore mapping its snapshot's memory file copy-on-write), created one after another
with wait and deleted before the next, a warm pool of 2 refilled at nice 10 and the agent's
restore pool (%s per snapshot: a qemu started ahead, its state loaded, refilled at nice 10),
each full before a claim or a restore is measured; before each cold
boot the same image is booted by qemu alone (the runtime's machine and flags) until
compute-guest is ready, the cold boot's baseline; TCG, not KVM (see
../shared/design/TOOLING.md); %d cores, %s; load average %s when written (the machine is
shared). End to end is the client's create call until the answer says running (the guest
answered with the sandbox's own identity and its root filesystem checked out); the host's share
is what the daemon measured from the VM's start, resume or restore to that point; the control
plane's share is the rest (admission, placement, commit, the spec reaching the daemon, its
status written, the wait noticing it).

| Start | round | end to end p50 | p99 | control plane p50 | p99 | host p50 | p99 |
|---|---:|---:|---:|---:|---:|---:|---:|
`, time.Now().UTC().Format("2006-01-02"), len(all), runs, strconv.Itoa(restorePool), runtime.NumCPU(), runtime.Version(), load)
	for k := range all[0] {
		for r, round := range all {
			s := round[k]
			if len(s.total) == 0 {
				continue // not run (-only)
			}
			if s.control == nil {
				fmt.Fprintf(&b, "| %s | %d | %s | %s | | | | |\n", s.name, r+1, benchkit.Pct(s.total, 50), benchkit.Pct(s.total, 99))
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", s.name, r+1, benchkit.Pct(s.total, 50), benchkit.Pct(s.total, 99),
				benchkit.Pct(s.control, 50), benchkit.Pct(s.control, 99), benchkit.Pct(s.host, 50), benchkit.Pct(s.host, 99))
		}
	}
	worst := func(k int, pick func(*series) []time.Duration) time.Duration {
		var w time.Duration
		for _, round := range all {
			if len(pick(round[k])) == 0 {
				continue
			}
			w = max(w, benchkit.Quantile(pick(round[k]), 99))
		}
		return w
	}
	total := func(s *series) []time.Duration { return s.total }
	control := func(s *series) []time.Duration { return s.control }
	verdict := func(d, goal time.Duration) string {
		if d <= goal {
			return "met"
		}
		return "missed"
	}
	slowest(&b, all, *slowestN)
	w, wc, rs, cb := worst(0, total), worst(0, control), worst(1, total), worst(2, total)
	fmt.Fprintf(&b, `
Goals (issue 26), judged on the worst round: a warm claim p99 at most 15 ms end to end (%s: %s)
with at most 10 ms of control plane (%s: %s); a restore p99 at most 150 ms (%s: %s); a cold boot
p99 at most 1.5 s (%s: %s).

`, w, verdict(w, 15*time.Millisecond), wc, verdict(wc, 10*time.Millisecond), rs, verdict(rs, 150*time.Millisecond), cb, verdict(cb, 1500*time.Millisecond))
	return b.String()
}

// slowest writes the n slowest warm claims of all rounds by phase: where
// a tail claim's time went, and whether the fleet's processes ran (work)
// or waited for a CPU (contention) meanwhile.
func slowest(b *strings.Builder, all [][]*series, n int) {
	type ranked struct {
		c     claim
		round int
	}
	var rk []ranked
	for r, rs := range all {
		for _, c := range rs[0].claims {
			rk = append(rk, ranked{c, r + 1})
		}
	}
	if n <= 0 || len(rk) == 0 {
		return
	}
	slices.SortFunc(rk, func(a, b ranked) int { return cmp.Compare(b.c.total, a.c.total) })
	fmt.Fprintf(b, `
The %d slowest warm claims by phase (from the client's clock and the sandbox's row: the call
reaching the server, the VM claimed, the status that found it ready begun, the answer back; the
host's share is inside "claimed to ready"); then, per process of the fleet, CPU time used / time
spent runnable waiting for a CPU during the claim (/proc/<pid>/task/*/schedstat, ms):

| round | claim | end to end | to the server | to claimed | claimed to ready | host | ready to answer | ran / waited (ms) |
|---:|---:|---:|---:|---:|---:|---:|---:|---|
`, min(n, len(rk)))
	for _, x := range rk[:min(n, len(rk))] {
		c := x.c
		fmt.Fprintf(b, "| %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", x.round, c.n, ms(c.total), ms(c.toServer), ms(c.placed), ms(c.ready),
			ms(c.host), ms(c.reply), c.sched)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
