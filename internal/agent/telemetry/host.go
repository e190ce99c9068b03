package telemetry

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// hostCPU is /proc/stat's first line: seconds per CPU state, all CPUs
// together.
func hostCPU() map[string]float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return nil
	}
	states := []string{"user", "nice", "system", "idle", "iowait", "interrupt", "softirq", "steal"}
	out := map[string]float64{}
	for i, s := range states {
		n, _ := strconv.ParseFloat(f[i+1], 64)
		out[s] = n / 100 // USER_HZ
	}
	return out
}

// hostMemory is used and available bytes (/proc/meminfo).
func hostMemory() (used, available int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	var total int64
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = n * 1024
		case "MemAvailable:":
			available = n * 1024
		}
	}
	return total - available, available, total > 0
}

// ioCounter is one device's bytes in and out.
type ioCounter struct {
	device    string
	read, wrt int64 // disks: read, written; interfaces: received, sent
}

// hostDisks is the bytes read and written per whole block device
// (/proc/diskstats; partitions, loop and ram devices left out).
func hostDisks() []ioCounter {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return nil
	}
	var out []ioCounter
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		name := f[2]
		if strings.HasPrefix(name, "loop") || strings.HasPrefix(name, "ram") {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/block", name)); err != nil {
			continue // a partition
		}
		r, _ := strconv.ParseInt(f[5], 10, 64)
		w, _ := strconv.ParseInt(f[9], 10, 64)
		out = append(out, ioCounter{device: name, read: r * 512, wrt: w * 512})
	}
	return out
}

// hostInterfaces is the bytes received and sent per network interface
// of the host's namespace (/proc/net/dev), loopback left out; the VMs'
// taps are among them (the host's view; the per-VM series name the VM).
func hostInterfaces() []ioCounter {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return nil
	}
	var out []ioCounter
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if len(f) < 9 || name == "lo" {
			continue
		}
		rx, _ := strconv.ParseInt(f[0], 10, 64)
		tx, _ := strconv.ParseInt(f[8], 10, 64)
		out = append(out, ioCounter{device: name, read: rx, wrt: tx})
	}
	return out
}
