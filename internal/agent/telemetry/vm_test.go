package telemetry

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto"
	"computeplane/internal/qemu"
	"computeplane/internal/qemu/qemutest"
)

// A real VM (qemu, TCG) of the qemu runtime: its series reach the
// collector with its process's CPU time and resident memory.
func TestARealVMsSeriesReachTheCollector(t *testing.T) {
	im := qemutest.Image(t)
	endpoint, sink := startReceiver(t)
	dir, err := os.MkdirTemp("", "cptel") // short: unix socket paths
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r, err := vmruntime.NewQEMU(dir, qemu.AccelTCG, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = r.Apply(t.Context(), 2, agentproto.SpecBody{}) // deletes what runs
		require.Eventually(t, func() bool { return len(r.Observe(t.Context())) == 0 }, time.Minute, 100*time.Millisecond)
		_ = r.Close()
	})
	spec := agentproto.InstanceSpec{ID: "tel1", State: vmruntime.StateRunning, Hostname: "tel1", VCPU: 1, MemoryMiB: 128,
		Boot: agentproto.Boot{Format: im.Format, Location: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline}}
	_, err = r.Apply(t.Context(), 1, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{spec}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, st := range r.Observe(t.Context()) {
			if st.ID == "tel1" && st.State == vmruntime.StateRunning {
				return true
			}
		}
		return false
	}, 3*time.Minute, 200*time.Millisecond, "the VM boots")

	cfg, err := Config{Endpoint: endpoint, Interval: 5 * time.Second}.Check()
	require.NoError(t, err)
	exp, err := Start(t.Context(), cfg, "node_vm", "", "", r, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer func() { _ = exp.Shutdown(t.Context()) }()
	require.Eventually(t, func() bool { return len(sink.AllMetrics()) >= 1 }, time.Minute, 100*time.Millisecond)
	md := sink.AllMetrics()[0]
	find := func(name string) float64 {
		for _, p := range points(md, name) {
			if attr(p, AttrInstance) == "tel1" {
				return value(p)
			}
		}
		t.Errorf("no %s series for the VM", name)
		return 0
	}
	assert.Positive(t, find(MetricVMCPU), "the booted VM used CPU")
	assert.Greater(t, find(MetricVMMemory), float64(16<<20), "its qemu holds guest memory")
	assert.Len(t, points(md, MetricVMDisk), 2, "read and write")
}
