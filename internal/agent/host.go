package agent

import (
	"bufio"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"computeplane/internal/agentproto"
)

// Declared overrides what the host reports (flags; tests declare
// capacity), and says what its flags make it offer: the VM network modes
// it wires and its underlay address (agentproto.Inventory).
type Declared struct {
	VCPU      int
	MemoryMiB int64
	DiskGiB   int64
	Networks  []string
	Underlay  netip.Addr
}

// inventory reads the host: CPUs, memory from /proc/meminfo, disk from
// statfs of the volume directory, overridden by what is declared.
func inventory(volumes string, d Declared, rt, accel string) agentproto.Inventory {
	host, _ := os.Hostname()
	inv := agentproto.Inventory{Hostname: host, OS: runtime.GOOS, Arch: runtime.GOARCH, VCPU: runtime.NumCPU(),
		MemoryMiB: memTotalMiB(), Runtime: rt, Accel: accel, Networks: d.Networks, Underlay: d.Underlay}
	var st syscall.Statfs_t
	if syscall.Statfs(volumes, &st) == nil {
		inv.DiskGiB = int64(st.Blocks) * int64(st.Bsize) >> 30
	}
	if d.VCPU > 0 {
		inv.VCPU = d.VCPU
	}
	if d.MemoryMiB > 0 {
		inv.MemoryMiB = d.MemoryMiB
	}
	if d.DiskGiB > 0 {
		inv.DiskGiB = d.DiskGiB
	}
	return inv
}

func memTotalMiB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb / 1024
		}
	}
	return 0
}
