package sandboxes_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agent/network/nettest"
	"computeplane/internal/agentproto"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// A tenant's private network across two nodes, end to end: computed and
// two compute-agents (--network nftables) as real processes, each agent's
// taps and VMs in a node namespace of its own (--net-netns), the two
// nodes joined by a veth pair as the pool's own connection (each agent's
// uplink, its underlay address taken from it by default). Two sandboxes
// of one tenant's private template on the two nodes reach each other
// across the VXLAN overlay; another tenant's private sandboxes (one on
// each node, reaching each other) reach neither, even with a route to
// the first tenant's subnet.
func TestPrivateSandboxesOfATenantReachEachOtherAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("boots four VMs")
	}
	nettest.RequireRoot(t)
	im := qemutest.Image(t)
	nodeA, nodeB := nettest.NewNodes(t) // first made, last removed: after the agents and their VMs
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	const other = "beta"
	_, err := f.C.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: tenant, PoolId: pool, ToTenantId: other,
		Limits: client.Limits{Vcpu: client.NewOptInt64(8), MemoryMiB: client.NewOptInt64(4096), DiskGiB: client.NewOptInt64(100),
			Sandboxes: client.NewOptInt64(8), Instances: client.NewOptInt64(8)}})
	require.NoError(t, err)
	oc := f.Client(other)

	// Room for two sandboxes per node: the first node takes one of each
	// tenant, the second joins and takes the others.
	join := func(ns nettest.NS) *fleettest.Agent {
		return f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "4", "--memory-mib", "600", "--disk-gib", "1000",
			"--network", "nftables", "--net-uplink", nettest.UnderlayLink, "--net-netns", ns.Path())
	}
	template := func(c *computeclient.Client, tn string) string {
		res, err := c.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tn, Name: "private", PoolId: pool,
			Flavor: "small", ImageId: "computeplane/minimal", Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkPrivate)})
		require.NoError(t, err)
		return res.Data.TemplateId
	}
	mine, theirs := template(f.C, tenant), template(oc, other)
	start := func(c *computeclient.Client, tn, tmpl, key string) client.Sandbox {
		res, err := c.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: tn, TemplateId: client.NewOptString(tmpl),
			IdempotencyKey: key, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
		require.NoError(t, err, key)
		sb := res.Data
		t.Cleanup(func() {
			_, _ = c.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tn, SandboxId: sb.SandboxId})
		})
		// A TCG boot under load may take longer than one wait.
		require.Eventually(t, func() bool {
			got, err := c.SandboxesGet(t.Context(), &client.SandboxesGetInput{TenantId: tn, SandboxId: sb.SandboxId})
			require.NoError(t, err, key)
			sb = got.Data
			return sb.State != "creating" // a sandbox is creating until its guest runs
		}, 60*time.Second, 250*time.Millisecond, key)
		require.Equal(t, "running", string(sb.State), "%s: error %v", key, sb.Error)
		return sb
	}
	agentA := join(nodeA)
	a1, b1 := start(f.C, tenant, mine, "a1"), start(oc, other, theirs, "b1")
	agentB := join(nodeB)
	a2, b2 := start(f.C, tenant, mine, "a2"), start(oc, other, theirs, "b2")
	assert.Equal(t, []string{agentA.Node, agentA.Node, agentB.Node, agentB.Node}, []string{a1.NodeId, b1.NodeId, a2.NodeId, b2.NodeId})

	// The nodes told the control plane their underlay; each node's spec
	// lists both private networks with the other node as their peer.
	for _, n := range []struct{ node, underlay, peer string }{{agentA.Node, nettest.UnderlayA, nettest.UnderlayB}, {agentB.Node, nettest.UnderlayB, nettest.UnderlayA}} {
		var underlay string
		require.NoError(t, f.DB.QueryRow(t.Context(), `select inventory->>'underlay' from nodes where node_id = $1`, n.node).Scan(&underlay))
		assert.Equal(t, n.underlay, underlay)
		require.Eventually(t, func() bool {
			var b []byte
			require.NoError(t, f.DB.QueryRow(t.Context(), `select body from node_specs where node_id = $1`, n.node).Scan(&b))
			var body agentproto.SpecBody
			require.NoError(t, json.Unmarshal(b, &body))
			peer := []netip.Addr{netip.MustParseAddr(n.peer)}
			return len(body.Networks) == 2 && !slices.ContainsFunc(body.Networks, func(ns agentproto.NetworkSpec) bool {
				return !slices.Equal(ns.Peers, peer)
			})
		}, 10*time.Second, 100*time.Millisecond, "node %s's spec lists both networks with its peer", n.node)
	}

	addr := func(s client.Sandbox) string {
		p, err := netip.ParsePrefix(s.Address.Value)
		require.NoError(t, err)
		return p.Addr().String()
	}
	run := func(c *computeclient.Client, tn string, s client.Sandbox, script string) client.ExecResult {
		res, err := c.SandboxesExec(t.Context(), &client.SandboxesExecInput{TenantId: tn, SandboxId: s.SandboxId, Argv: []string{"/bin/sh", "-c", script}})
		require.NoError(t, err)
		return res.Data
	}
	// The guest's link comes up a moment after its agent answers: a ping
	// is tried up to tries times.
	ping := func(c *computeclient.Client, tn string, from client.Sandbox, to string, tries int) client.ExecResult {
		return run(c, tn, from, fmt.Sprintf("for i in $(seq %d); do ping -c 1 -W 2 %s && exit 0; sleep 1; done; exit 1", tries, to))
	}
	debug := func() string {
		var out strings.Builder
		for _, ns := range []nettest.NS{nodeA, nodeB} {
			b, _ := exec.Command("nsenter", "--net="+ns.Path(), "sh", "-c", "ip -d link; bridge fdb show; nft list ruleset").CombinedOutput()
			out.Write(b)
		}
		return out.String() + "\nagent A:\n" + proctest.Tail(agentA.Proc.Stderr.String(), 20) + "\nagent B:\n" + proctest.Tail(agentB.Proc.Stderr.String(), 20)
	}

	// One tenant's sandboxes reach each other across the nodes, both
	// ways; so do the other tenant's.
	if r := ping(f.C, tenant, a1, addr(a2), 20); r.ExitCode != 0 {
		t.Fatalf("a1 -> a2 (%s): %+v\n%s", addr(a2), r, debug())
	}
	assert.Zero(t, ping(f.C, tenant, a2, addr(a1), 5).ExitCode, "a2 -> a1")
	assert.Zero(t, ping(oc, other, b1, addr(b2), 20).ExitCode, "b1 -> b2 (the other tenant's own network)")
	// The overlay's MTU: the underlay's 1500 less VXLAN's 50.
	assert.Equal(t, "1450", strings.TrimSpace(run(f.C, tenant, a1, "cat /sys/class/net/eth0/mtu").Stdout))

	// The other tenant's sandboxes reach neither of the first tenant's,
	// on the same node or across, even with a route to its subnet.
	subnet := netip.MustParsePrefix(a1.Address.Value).Masked().String()
	for _, b := range []client.Sandbox{b1, b2} {
		require.Zero(t, run(oc, other, b, "ip route add "+subnet+" dev eth0").ExitCode)
		for _, a := range []client.Sandbox{a1, a2} {
			r := ping(oc, other, b, addr(a), 2)
			assert.NotZero(t, r.ExitCode, "%s (%s) must not reach %s (%s): %s", b.SandboxId, b.NodeId, a.SandboxId, a.NodeId, r.Stdout)
		}
	}
	// Nor does one posing with an address of the first tenant's subnet:
	// anti-spoofing holds.
	four := netip.MustParsePrefix(subnet).Addr().As4()
	four[3] = 200
	spoofed := netip.AddrFrom4(four).String()
	require.Zero(t, run(oc, other, b1, "ip addr add "+spoofed+"/32 dev eth0").ExitCode)
	r := run(oc, other, b1, "ping -c 2 -W 1 -I "+spoofed+" "+addr(a2))
	assert.NotZero(t, r.ExitCode, "a spoofed source gets nothing through: %s", r.Stdout)

	// a2 deleted: node B leaves the first tenant's network, and node A's
	// spec no longer names it as that network's peer (the other's stays).
	_, err = f.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: a2.SandboxId})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var b []byte
		require.NoError(t, f.DB.QueryRow(t.Context(), `select body from node_specs where node_id = $1`, agentA.Node).Scan(&b))
		var body agentproto.SpecBody
		require.NoError(t, json.Unmarshal(b, &body))
		peers := map[string]int{}
		for _, n := range body.Networks {
			peers[n.Tenant] = len(n.Peers)
		}
		return peers[tenant] == 0 && peers[other] == 1 && len(body.Networks) == 2
	}, 10*time.Second, 100*time.Millisecond, "node A's spec drops node B from the first tenant's network")
}
