package sandboxes_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/agent/network"
	"computeplane/internal/agent/network/nettest"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// A sandbox with an egress network, end to end: computed and a
// compute-agent run with --network nftables as real processes, the
// agent's taps and qemu in a node namespace of the test's own
// (--net-netns) joined to an "internet" namespace holding the upstream,
// while the daemon talks to computed on the host's loopback. Through the
// API's exec the guest reaches the upstream (masqueraded to the node's
// uplink) and not the metadata address; a deny of the upstream set
// through sandboxes.setEgressPolicy holds on the running sandbox within
// seconds.
func TestASandboxReachesTheInternetAndItsPolicyHoldsLive(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	nettest.RequireRoot(t)
	im := qemutest.Image(t)
	nw := nettest.NewWorld(t) // first made, last removed: after the agent and its VMs
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "4", "--memory-mib", "2048", "--disk-gib", "1000",
		"--network", "nftables", "--net-uplink", nettest.Uplink, "--net-netns", nw.Node.Path())

	tmpl, err := f.C.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: "net", PoolId: pool,
		Flavor: "small", ImageId: "computeplane/minimal", Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkEgress)})
	require.NoError(t, err)
	w := &world{Fleet: f, t: t, agent: agent, pool: pool}
	sb := w.running("net1", client.SandboxesCreateInput{TemplateId: client.NewOptString(tmpl.Data.TemplateId)})
	t.Cleanup(func() {
		_, _ = f.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: sb.SandboxId})
	})

	// HTTP by nc (busybox's wget segfaults through exec, docs/networking.md);
	// the guest's link comes up a moment after its agent answers, so a
	// request is tried up to tries times.
	get := func(addr string, tries int) client.ExecResult {
		return w.exec(sb.SandboxId, "/bin/sh", "-c", fmt.Sprintf(
			"for i in $(seq %d); do printf 'GET / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' | nc -w 3 %s 80 && exit 0; sleep 1; done; exit 1", tries, addr, addr))
	}
	out := get(nettest.Upstream, 15)
	if out.ExitCode != 0 || !strings.Contains(out.Stdout, "200 OK") {
		node, _ := exec.Command("nsenter", "--net="+nw.Node.Path(), "sh", "-c", "ip addr; ip route; nft list ruleset").CombinedOutput()
		t.Fatalf("upstream: %+v\nguest: %s\nnode: %s\nagent:\n%s", out, w.exec(sb.SandboxId, "/bin/sh", "-c", "ip addr; ip route").Stdout, node,
			proctest.Tail(agent.Proc.Stderr.String(), 30))
	}
	assert.True(t, strings.HasSuffix(out.Stdout, "hello "+nettest.NodeAddr+" from "+nettest.Upstream+"\n"), "masqueraded to the node's uplink: %s", out.Stdout)
	tap := network.Prefix + network.AgentID(agent.Node) + "t"
	assert.True(t, slices.ContainsFunc(nw.Node.Links(t), func(l string) bool { return strings.HasPrefix(l, tap) }),
		"the tap is in the node's namespace: %v", nw.Node.Links(t))

	out = get(nettest.Metadata, 1)
	assert.NotEqual(t, 0, out.ExitCode, "the metadata address is out of reach: %s", out.Stdout)
	assert.NotContains(t, out.Stdout, "200 OK")

	// A deny of the upstream holds on the running sandbox, no reboot.
	_, err = f.C.SandboxesSetEgressPolicy(t.Context(), &client.SandboxesSetEgressPolicyInput{TenantId: tenant, SandboxId: sb.SandboxId,
		Egress: client.EgressPolicy{Allow: []string{}, Deny: []string{nettest.Upstream}}})
	require.NoError(t, err)
	denied := time.Now()
	require.Eventually(t, func() bool { return get(nettest.Upstream, 1).ExitCode != 0 }, 20*time.Second, 500*time.Millisecond,
		"the deny holds; agent:\n%s", proctest.Tail(agent.Proc.Stderr.String(), 30))
	t.Logf("the deny held within %s", time.Since(denied).Round(100*time.Millisecond))
	assert.Equal(t, "running", string(w.get(sb.SandboxId).State), "the sandbox kept running")

	// Metered: the daemon's statuses carry the VM's counters and computed
	// adds their growth to the hour's vps.egress.bytes (usage.list shows
	// it once the hour has closed and the rollup windowed it,
	// docs/usage.md).
	require.Eventually(t, func() bool {
		var bytes int64
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(c.quantity), 0) from counted_usage c
			join sandboxes s on s.instance_id = c.instance_id where s.sandbox_id = $1 and c.meter = 'vps.egress.bytes'`, sb.SandboxId).Scan(&bytes))
		return bytes > 100
	}, 30*time.Second, 500*time.Millisecond, "vps.egress.bytes counted")
}
