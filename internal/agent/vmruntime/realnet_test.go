package vmruntime

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent/network"
	"computeplane/internal/agent/network/nettest"
	"computeplane/internal/agentproto"
	"computeplane/internal/qemu"
	"computeplane/internal/qemu/qemutest"
)

// A real VM (TCG) with an egress network through the manager, on a node
// and an internet that are namespaces of the test's own (qemu runs in the
// node's, as compute-agent would on a host): the guest, addressed by
// compute-guest from its kernel command line, reaches the upstream (its
// packets masqueraded to the node's uplink address) and not the metadata
// address; its egress bytes are counted; deleted, it leaves no tap.
func TestARealVMReachesTheInternetThroughItsNetwork(t *testing.T) {
	nettest.RequireRoot(t)
	im := qemutest.Image(t)
	w := nettest.NewWorld(t)
	m, err := network.New(network.Config{ID: "rtvm", Uplink: nettest.Uplink, EgressPool: netip.MustParsePrefix("10.200.0.0/16"),
		PrivatePool: netip.MustParsePrefix("10.201.0.0/16"), NetNS: w.Node.Path()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })

	// qemu opens its tap by name in the node's namespace.
	bin := filepath.Join(t.TempDir(), "qemu-in-node")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\nexec nsenter --net="+w.Node.Path()+" qemu-system-x86_64 \"$@\"\n"), 0o755))
	old := qemu.Binary
	qemu.Binary = bin
	t.Cleanup(func() { qemu.Binary = old })

	dir, err := os.MkdirTemp("", "cpnet") // short: unix socket paths
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r, err := NewQEMU(dir, qemu.AccelTCG, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = r.Apply(t.Context(), 3, agentproto.SpecBody{}) // deletes what runs, if the test failed
		_ = r.Close()
	})
	r.netHook = func(spec agentproto.InstanceSpec) *network.VM {
		return &network.VM{VMNetwork: agentproto.VMNetwork{Mode: network.ModeEgress, Tenant: "t1", MAC: "52:54:00:00:01:02",
			Address: netip.MustParsePrefix("10.200.1.2/24"), Gateway: netip.MustParseAddr("10.200.1.1")}}
	}
	require.NoError(t, r.UseNetwork(m, 0))

	spec := agentproto.InstanceSpec{ID: "net1", State: StateRunning, Hostname: "net1", VCPU: 1, MemoryMiB: 256,
		Boot: agentproto.Boot{Format: im.Format, Location: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline}}
	_, err = r.Apply(t.Context(), 1, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{spec}})
	require.NoError(t, err)
	st := waitStateWithin(t, r, "net1", StateRunning, 3*time.Minute)
	require.Empty(t, st.Error)
	tap := r.vms["net1"].port.Tap
	assert.Contains(t, w.Node.Links(t), tap)

	sh := func(cmd string) agentproto.ExecOutput {
		out, err := r.Exec(t.Context(), agentproto.ExecArgs{InstanceID: "net1", Argv: []string{"sh", "-c", cmd}, TimeoutMs: 30_000})
		require.NoError(t, err)
		return out
	}
	// HTTP by nc (wget works too: docs/networking.md, "wget exit 139").
	// The guest's link comes up a moment after its agent answers (and the
	// node answers no ping): the first request is tried for a while.
	get := func(addr string, tries int) agentproto.ExecOutput {
		return sh(fmt.Sprintf("for i in $(seq %d); do printf 'GET / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' | nc -w 3 %s 80 && exit 0; sleep 1; done; exit 1", tries, addr, addr))
	}
	out := get(nettest.Upstream, 15)
	if out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "200 OK") {
		host, _ := exec.Command("nsenter", "--net="+w.Node.Path(), "sh", "-c", "ip addr; ip route; nft list ruleset").CombinedOutput()
		t.Fatalf("upstream: %+v\nguest: %s\nnode: %s", out, sh("ip addr; ip route; cat /proc/net/arp").Stdout, host)
	}
	assert.True(t, strings.HasSuffix(string(out.Stdout), "hello "+nettest.NodeAddr+" from "+nettest.Upstream+"\n"), "masqueraded to the node's uplink: %s", out.Stdout)

	out = get(nettest.Metadata, 1)
	assert.NotContains(t, string(out.Stdout), "200 OK", "the metadata address is out of reach")
	assert.NotEqual(t, 0, out.ExitCode)

	counted := uint64(0)
	for _, st := range r.Observe(t.Context()) {
		if st.ID == "net1" {
			counted = st.EgressTxBytes
		}
	}
	assert.Greater(t, counted, uint64(100), "the VM's egress is counted in its status")

	// Deleted: the VM's tap and bridge go with it.
	_, err = r.Apply(t.Context(), 2, agentproto.SpecBody{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, l := range w.Node.Links(t) {
			if strings.HasPrefix(l, network.Prefix+"rtvm") {
				return false
			}
		}
		return true
	}, 20*time.Second, 100*time.Millisecond, "left: %v", w.Node.Links(t))
}
