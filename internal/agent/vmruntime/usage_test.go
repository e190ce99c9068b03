package vmruntime

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

// A VM's usage is its qemu process's, read from /proc: here a process
// that burns CPU and writes to a file, read the same way.
func TestProcessUsageReadsProc(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command("sh", "-c", `dd if=/dev/zero of="$1" bs=1M count=8 conv=fsync 2>/dev/null; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 30`, "sh", out)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		u, ok := processUsage(cmd.Process.Pid)
		return ok && u.CPUSeconds > 0 && u.MemoryBytes > 0 && u.DiskWriteBytes >= 8<<20
	}, 60e9, 100e6)
	_, ok := processUsage(1 << 30)
	assert.False(t, ok, "no such process")
}

// The recording runtime reports its running and paused instances with
// what usage.json plays for them.
func TestRecordingUsage(t *testing.T) {
	r := &Recording{Dir: t.TempDir()}
	_, err := r.Apply(t.Context(), 1, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "b", State: "paused"}, {ID: "a", State: "running"}, {ID: "c", State: "stopped"}}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(r.Dir, RecordingUsage), []byte(`{"a": {"cpuSeconds": 2, "netRxBytes": 7}}`), 0o600))
	assert.Equal(t, []Usage{{ID: "a", CPUSeconds: 2, NetRxBytes: 7}, {ID: "b"}}, r.Usage(t.Context()))
}
