// Command vmphases boots the minimal image with internal/qemu the way the
// qemu runtime does (microvm, TCG, 1 vCPU, 256 MiB, memory in a file) and
// prints where a cold boot and a restore spend their time, by phase, with
// qemu's own CPU time (utime+stime from /proc, which load disturbs least):
//
//	cold boot: exec -> QMP answers -> guest channel open -> first answer
//	restore:   exec -> QMP answers, state loaded, cont -> first answer
//
// go run ./tools/vmphases -images .service/images -runs 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"computeplane/internal/guestproto"
	"computeplane/internal/images"
	"computeplane/internal/qemu"
	"computeplane/tools/benchkit"
)

func main() {
	dirImages := flag.String("images", ".service/images", "image directory (images/build.sh)")
	runs := flag.Int("runs", 5, "boots")
	restores := flag.Int("restores", 5, "restores of each kind")
	extra := flag.String("cmdline", "", "appended to the image's kernel command line")
	keep := flag.Bool("keep", false, "keep the VMs' directories (console.log of each boot) and print where")
	binary := flag.String("qemu", qemu.Binary, "the qemu binary (a wrapper script, for an A/B of qemu's flags)")
	vcpu := flag.Int("vcpu", 1, "vCPUs of each VM")
	idle := flag.Duration("idle", 0, "after each boot's first answer, leave the guest idle this long and print qemu's CPU time meanwhile")
	execute := flag.String("exec", "", "after each boot's first answer, run this shell command in the guest and print its output and time (e.g. to check the guest's timers)")
	memory := flag.String("memory", "", "directory of the guest memory files (the runtime's --memory-dir, e.g. /dev/shm); \"anon\": qemu's anonymous memory, as a bare boot; default the work directory")
	identity := flag.Bool("identity", false, "after each boot's first answer, give the guest an identity and ping it, as the runtime does for a sandbox, and print each call's time")
	flag.Parse()
	qemu.Binary = *binary
	ctx := context.Background()
	im, err := (&images.Dir{Path: *dirImages}).Get(ctx, "computeplane/minimal")
	must(err)
	work, err := os.MkdirTemp("", "vmph")
	must(err)
	if *keep {
		fmt.Println("work directory:", work)
	} else {
		defer os.RemoveAll(work)
	}
	memDir := work
	switch *memory {
	case "":
	case "anon":
		if *restores > 0 {
			must(errors.New("vmphases: a restore needs a memory file: -memory anon takes -restores 0"))
		}
	default:
		memDir, err = os.MkdirTemp(*memory, "vmph")
		must(err)
		defer os.RemoveAll(memDir)
	}
	cfg := func(id string) *qemu.Config {
		c := benchkit.RuntimeMachine(id, filepath.Join(work, id), im, *extra)
		if *memory != "anon" {
			c.MemoryFile = filepath.Join(memDir, id+".mem")
		}
		c.VCPU = *vcpu
		return c
	}
	var boot [4][]float64 // qmp, channel, ready, cpu
	var snapVM *qemu.VM
	for i := 0; i < *runs; i++ {
		c := cfg(fmt.Sprintf("b%d", i))
		t0 := time.Now()
		v, err := qemu.Start(ctx, c)
		must(err)
		started = append(started, v)
		tq := time.Since(t0)
		cctx, cancel := context.WithTimeout(ctx, 120*time.Second)
		g, err := benchkit.GuestChannel(cctx, v)
		must(err)
		tc := time.Since(t0)
		_, err = g.Ready(cctx)
		cancel()
		must(err)
		tr := time.Since(t0)
		cpu := cpuOf(v.Pid)
		fmt.Printf("boot %d: qmp %v channel %v ready %v qemu-cpu %.2fs | %s\n", i, ms(tq), ms(tc), ms(tr), cpu, readyLine(c))
		if *identity {
			// The runtime's greet for a sandbox: its identity, then the check.
			ictx, cancel := context.WithTimeout(ctx, 120*time.Second)
			t1 := time.Now()
			_, err := g.Call(ictx, guestproto.Request{Op: guestproto.OpIdentity, Identity: &guestproto.Identity{
				Hostname: "sbx-bench", MachineID: "0123456789abcdef0123456789abcdef", Env: map[string]string{"A": "b"}}})
			must(err)
			ti := time.Since(t1)
			_, err = g.Call(ictx, guestproto.Request{Op: guestproto.OpPing})
			cancel()
			must(err)
			fmt.Printf("boot %d: identity %v ping %v\n", i, ms(ti), ms(time.Since(t1)-ti))
		}
		if *execute != "" {
			t1 := time.Now()
			ectx, cancel := context.WithTimeout(ctx, 120*time.Second)
			r, err := g.Call(ectx, guestproto.Request{Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", *execute}}})
			cancel()
			must(err)
			fmt.Printf("boot %d: exec %v: exit %d\n%s%s", i, ms(time.Since(t1)), r.Exec.ExitCode, r.Exec.Stdout, r.Exec.Stderr)
		}
		if *idle > 0 {
			time.Sleep(*idle)
			fmt.Printf("boot %d: idle %v qemu-cpu %.3fs\n", i, *idle, cpuOf(v.Pid)-cpu)
		}
		boot[0], boot[1], boot[2], boot[3] = append(boot[0], sec(tq)), append(boot[1], sec(tc)), append(boot[2], sec(tr)), append(boot[3], cpu)
		if i == 0 && *restores > 0 {
			snapVM = v
			continue
		}
		_ = v.Kill()
		if c.MemoryFile != "" {
			_ = os.Remove(c.MemoryFile) // (a tmpfs's memory)
		}
	}
	if snapVM == nil {
		fmt.Printf("cold boot medians: qmp %.3fs channel %.3fs ready %.3fs qemu-cpu %.2fs\n", med(boot[0]), med(boot[1]), med(boot[2]), med(boot[3]))
		return
	}
	// A snapshot of the first VM, as the runtime takes it.
	snap := filepath.Join(work, "snap")
	must(os.MkdirAll(snap, 0o700))
	must(snapVM.Pause())
	must(snapVM.SaveState(ctx, filepath.Join(snap, "state")))
	copyFile(snapVM.Config.MemoryFile, filepath.Join(snap, "memory"))
	_ = snapVM.Kill()
	// Restores of two kinds, interleaved so that the machine's load falls
	// on each alike: qemu started at the restore, and a qemu prestarted
	// with its state loaded and its guest run to a ping (the runtime's
	// restore pool), timed from its cont.
	kinds := []string{"started", "prestarted"}
	rest := make([][3][]float64, len(kinds))
	for i := 0; i < *restores; i++ {
		for k, kind := range kinds {
			c := cfg(fmt.Sprintf("r%d-%d", i, k))
			c.MemoryFile, c.MemoryPrivate, c.Incoming = filepath.Join(snap, "memory"), true, filepath.Join(snap, "state")
			var v *qemu.VM
			var t0 time.Time
			cpu0 := 0.0
			if kind == "prestarted" {
				v, err = qemu.Prestart(ctx, c)
				must(err)
				time.Sleep(200 * time.Millisecond) // as in a pool: started well before
				t0 = time.Now()
				cpu0 = cpuOf(v.Pid)
				must(v.Restore(ctx))
			} else {
				t0 = time.Now()
				v, err = qemu.Start(ctx, c)
				must(err)
			}
			started = append(started, v)
			ts := time.Since(t0)
			g, err := v.Guest()
			must(err)
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			_, err = g.Call(cctx, guestproto.Request{Op: guestproto.OpPing})
			cancel()
			must(err)
			ta := time.Since(t0)
			cpu := cpuOf(v.Pid) - cpu0
			fmt.Printf("restore %d (%s): ..cont %v first answer %v qemu-cpu %.2fs phases %s\n", i, kind, ms(ts), ms(ta), cpu, v.StartPhases)
			r := &rest[k]
			r[0], r[1], r[2] = append(r[0], sec(ts)), append(r[1], sec(ta)), append(r[2], cpu)
			_ = v.Kill()
		}
	}
	fmt.Printf("cold boot medians: qmp %.3fs channel %.3fs ready %.3fs qemu-cpu %.2fs\n", med(boot[0]), med(boot[1]), med(boot[2]), med(boot[3]))
	for k, kind := range kinds {
		fmt.Printf("restore medians (%s): ..cont %.3fs first answer %.3fs qemu-cpu %.2fs\n", kind, med(rest[k][0]), med(rest[k][1]), med(rest[k][2]))
	}
}

func readyLine(c *qemu.Config) string {
	b, _ := os.ReadFile(c.Console())
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "compute-guest: READY") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// cpuOf is qemu's CPU time in seconds (0 once it is gone).
func cpuOf(pid int) float64 {
	d, _ := benchkit.ProcessCPU(pid)
	return d.Seconds()
}
func copyFile(from, to string) {
	in, err := os.Open(from)
	must(err)
	defer in.Close()
	out, err := os.Create(to)
	must(err)
	_, err = io.Copy(out, in)
	must(err)
	must(out.Close())
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
func sec(d time.Duration) float64      { return d.Seconds() }
func med(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// started are the VMs to end on a failure: qemu runs detached (its own
// session) and would outlive this program.
var started []*qemu.VM

func must(err error) {
	if err != nil {
		for _, v := range started {
			_ = v.Kill()
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
