package vmruntime

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Usage is one VM's resource use as node telemetry exports it: CPU time
// and I/O are counters since the VM started, memory is what it holds now.
type Usage struct {
	ID             string  `json:"-"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	MemoryBytes    int64   `json:"memoryBytes"`
	DiskReadBytes  int64   `json:"diskReadBytes"`
	DiskWriteBytes int64   `json:"diskWriteBytes"`
	// NetRxBytes and NetTxBytes are what the VM received and sent.
	NetRxBytes int64 `json:"netRxBytes"`
	NetTxBytes int64 `json:"netTxBytes"`
}

// UsageReporter is a runtime that reports its VMs' resource use.
type UsageReporter interface {
	Usage(ctx context.Context) []Usage
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times; 100
// on every Linux architecture this runs on.
const clockTicks = 100

// Usage reads each running VM's qemu process (/proc/<pid>: CPU time,
// resident memory, bytes it read and wrote to storage) and its tap's
// counters (the tap sends what the VM receives).
func (r *QEMU) Usage(context.Context) []Usage {
	type vm struct {
		id, tap string
		pid     int
	}
	var vms []vm
	r.mu.Lock()
	for id, st := range r.vms {
		if st.vm == nil || (st.state != StateRunning && st.state != StatePaused) {
			continue
		}
		v := vm{id: id, pid: st.vm.Pid()}
		if c := st.vm.Config(); c != nil && c.Net != nil {
			v.tap = c.Net.Tap
		}
		vms = append(vms, v)
	}
	r.mu.Unlock()
	out := make([]Usage, 0, len(vms))
	for _, v := range vms {
		u, ok := processUsage(v.pid)
		if !ok {
			continue // ended since
		}
		u.ID = v.id
		if v.tap != "" {
			u.NetRxBytes = readCounter(filepath.Join("/sys/class/net", v.tap, "statistics", "tx_bytes"))
			u.NetTxBytes = readCounter(filepath.Join("/sys/class/net", v.tap, "statistics", "rx_bytes"))
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// processUsage reads a process's CPU time, resident memory and storage
// bytes from /proc.
func processUsage(pid int) (Usage, bool) {
	var u Usage
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return u, false
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		f := strings.Fields(s[i+1:])
		if len(f) > 12 { // f[0] is field 3 (state): utime is 14, stime 15
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			u.CPUSeconds = float64(ut+st) / clockTicks
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "status")); err == nil {
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				f := strings.Fields(rest)
				if len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					u.MemoryBytes = kb * 1024
				}
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "io")); err == nil {
		for line := range strings.Lines(string(b)) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "read_bytes":
				u.DiskReadBytes = n
			case "write_bytes":
				u.DiskWriteBytes = n
			}
		}
	}
	return u, true
}

func readCounter(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// RecordingUsage is the file of the recording runtime's usage
// ({"<id>": {"cpuSeconds": 1.5, "memoryBytes": n, ...}}, written by a test
// to play a node's VMs).
const RecordingUsage = "usage.json"

// Usage reports every running or paused instance it recorded, with what
// dir/usage.json holds for it (zeros without the file: it runs nothing).
func (r *Recording) Usage(ctx context.Context) []Usage {
	var recorded map[string]Usage
	if b, err := os.ReadFile(filepath.Join(r.Dir, RecordingUsage)); err == nil {
		_ = json.Unmarshal(b, &recorded)
	}
	var out []Usage
	for _, in := range r.Observe(ctx) {
		if in.State != StateRunning && in.State != StatePaused {
			continue
		}
		u := recorded[in.ID]
		u.ID = in.ID
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
