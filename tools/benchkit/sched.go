package benchkit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Sched is what the kernel's scheduler says of a set of processes: time
// on a CPU and time runnable but waiting for one (run_delay), summed
// over every thread (/proc/<pid>/task/<tid>/schedstat). A claim's slow
// tail that comes with waiting is the machine's contention; one that
// comes with running is work somebody did.
type Sched struct {
	Ran, Waited time.Duration
}

// SchedByGroup sums Sched over the processes that carry the vmowner
// mark in their environment (the fleet's computed, compute-agent and
// qemus) and PostgreSQL's backends of database (by their title),
// grouped by name: "computed", "compute-agent", "qemu", "postgres".
func SchedByGroup(mark, database string) map[string]Sched {
	out := map[string]Sched{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		group := groupOf(pid, mark, database)
		if group == "" {
			continue
		}
		s := out[group]
		tasks, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "task"))
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "task", t.Name(), "schedstat"))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) < 2 {
				continue
			}
			ran, _ := strconv.ParseInt(f[0], 10, 64)
			waited, _ := strconv.ParseInt(f[1], 10, 64)
			s.Ran += time.Duration(ran)
			s.Waited += time.Duration(waited)
		}
		out[group] = s
	}
	return out
}

func groupOf(pid int, mark, database string) string {
	dir := "/proc/" + strconv.Itoa(pid)
	cmd, err := os.ReadFile(dir + "/cmdline")
	if err != nil || len(cmd) == 0 {
		return ""
	}
	if database != "" && bytes.HasPrefix(cmd, []byte("postgres: ")) && bytes.Contains(cmd, []byte(" "+database+" ")) {
		return "postgres"
	}
	env, err := os.ReadFile(dir + "/environ")
	if err != nil || mark == "" || !bytes.Contains(env, []byte("="+mark)) {
		return ""
	}
	name := filepath.Base(string(bytes.SplitN(cmd, []byte{0}, 2)[0]))
	switch {
	case strings.HasPrefix(name, "qemu"):
		return "qemu"
	case name == "computed" || name == "compute-agent":
		return name
	}
	return ""
}

// SchedDelta formats after minus before, group by group, in ms:
// "computed 1.2/0.3" is 1.2 ms on a CPU and 0.3 ms waiting for one.
func SchedDelta(before, after map[string]Sched) string {
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		d := Sched{after[n].Ran - before[n].Ran, after[n].Waited - before[n].Waited}
		fmt.Fprintf(&b, " %s %.1f/%.1f", n, ms(d.Ran), ms(d.Waited))
	}
	return strings.TrimSpace(b.String())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// CPUPressure is the kernel's total time some task waited for a CPU
// (/proc/pressure/cpu, "some"), machine-wide; 0 when PSI is off.
func CPUPressure() time.Duration {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "some ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				us, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond
			}
		}
	}
	return 0
}
