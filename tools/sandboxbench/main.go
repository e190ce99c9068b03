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
//	go run ./tools/sandboxbench [-runs 100] [-database $SERVICE_DATABASE_URL]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strconv"
	"time"

	"computeplane/gen/client"
	"computeplane/tools/benchkit"
)

// series is one kind of start's figures.
type series struct {
	name                 string
	total, control, host []time.Duration
}

func main() {
	runs := flag.Int("runs", 100, "sandboxes created of each kind (the nearest-rank p99 of 50 is their maximum, of 100 the second largest)")
	database := flag.String("database", os.Getenv("SERVICE_DATABASE_URL"), "a PostgreSQL URL; a database of its own is made on that server")
	imagesDir := flag.String("images", ".service/images", "the image source with computeplane/minimal (make images)")
	out := flag.String("out", "docs/benchmarks.md", "the benchmarks page")
	notes := flag.String("notes", "docs/benchmarks-notes.md", "the notes page make bench appends")
	flag.Parse()
	ctx := context.Background()
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
		t0 := time.Now()
		res, err := f.C.SandboxesCreate(ctx, &in)
		total := time.Since(t0)
		check(err)
		sb := res.Data
		if sb.State != "running" || sb.Timings.HostReadyMs.Null {
			f.Fatal(fmt.Sprintf("sandbox %s is %s (%v)", sb.SandboxId, sb.State, sb.Error))
		}
		host := time.Duration(sb.Timings.HostReadyMs.Value) * time.Millisecond
		if s != nil {
			s.total, s.host, s.control = append(s.total, total), append(s.host, host), append(s.control, max(total-host, 0))
			log.Printf("%s %d: %s (host %s; the database saw it ready after %d ms)", s.name, len(s.total), total.Round(time.Millisecond), host, sb.Timings.ReadyMs.Value)
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

	warm := &series{name: "warm claim"}
	wt := template("warm", 2)
	for i := 0; i < *runs; i++ {
		settled(wt, 2)
		remove(create(client.SandboxesCreateInput{TemplateId: client.NewOptString(wt)}, warm).SandboxId)
	}
	cold := &series{name: "cold boot"}
	ct := template("cold", 0)
	for i := 0; i < *runs; i++ {
		settled(ct, 0)
		remove(create(client.SandboxesCreateInput{TemplateId: client.NewOptString(ct)}, cold).SandboxId)
	}
	restore := &series{name: "restore"}
	src := create(client.SandboxesCreateInput{TemplateId: client.NewOptString(ct)}, nil)
	snap, err := f.C.SandboxSnapshotsCreate(ctx, &client.SandboxSnapshotsCreateInput{TenantId: "bench", SandboxId: src.SandboxId, Keep: client.NewOptBool(true),
		IdempotencyKey: "snap", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	check(err)
	if snap.Data.State != "ready" {
		f.Fatal("the snapshot is " + string(snap.Data.State))
	}
	for i := 0; i < *runs; i++ {
		settled(ct, 0)
		remove(create(client.SandboxesCreateInput{FromSnapshot: client.NewOptString(snap.Data.SnapshotId)}, restore).SandboxId)
	}

	row := func(s *series) string {
		return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |\n", s.name, benchkit.Pct(s.total, 50), benchkit.Pct(s.total, 99),
			benchkit.Pct(s.control, 50), benchkit.Pct(s.control, 99), benchkit.Pct(s.host, 50), benchkit.Pct(s.host, 99))
	}
	section := fmt.Sprintf(`## Sandboxes

Written by `+"`make bench-sandboxes`"+` (tools/sandboxbench) on %s: computed (every role, the
gateway included) and one compute-agent with the qemu runtime on this machine; %d sandboxes of
each kind (1 vCPU, 256 MiB, the minimal image, guest memory in a shared file on a tmpfs, a
restore mapping its snapshot's memory file copy-on-write), created one after another with wait
and deleted before the next, a warm pool of 2 refilled at nice 10; TCG, not KVM (see
../shared/design/TOOLING.md); %d cores, %s. End to end is the client's create call until the
answer says running (the guest answered with the sandbox's own identity and its root filesystem
checked out); the host's share
is what the daemon measured from the VM's start, resume or restore to that point; the control
plane's share is the rest (admission, placement, commit, the spec reaching the daemon, its
status written, the wait noticing it).

| Start | end to end p50 | p99 | control plane p50 | p99 | host p50 | p99 |
|---|---:|---:|---:|---:|---:|---:|
%s%s%s
Goals on these machines: a warm claim ready p99 under 100 ms with under 20 ms of control-plane
time (here %s and %s); a restore from a snapshot p99 under 300 ms (here %s); a cold boot p99
under 3 s (here %s).

`, time.Now().UTC().Format("2006-01-02"), *runs, runtime.NumCPU(), runtime.Version(), row(warm), row(restore), row(cold),
		benchkit.Pct(warm.total, 99), benchkit.Pct(warm.control, 99), benchkit.Pct(restore.total, 99), benchkit.Pct(cold.total, 99))
	fmt.Print(section)
	for _, p := range []string{*out, *notes} {
		check(benchkit.ReplaceSection(p, "## Sandboxes", section))
	}
}
