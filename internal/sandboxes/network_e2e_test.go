package sandboxes_test

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agent/network"
	"computeplane/internal/agent/network/nettest"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// netBox is a sandbox of the network test and the client of its tenant.
type netBox struct {
	c      *computeclient.Client
	tenant string
	id     string
}

// Sandboxes with networks, end to end: computed and a compute-agent run
// with --network nftables as real processes, the agent's taps, its
// egress proxy and qemu in a node namespace of the test's own
// (--net-netns) joined to an "internet" namespace holding the upstream
// (HTTP, HTTPS with a self-signed certificate, DNS), while the daemon
// talks to computed on the host's loopback. Three sandboxes are booted
// once and shared by the subtests, in order: an egress one of acme, an
// egress one of globex (acme's pool offered to it) and a none one of
// acme. Everything the guests do goes through sandboxes.exec.
func TestASandboxReachesTheInternetAndItsPolicyHoldsLive(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	nettest.RequireRoot(t)
	im := qemutest.Image(t)
	nw := nettest.NewWorld(t) // first made, last removed: after the agent and its VMs
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000",
		"--network", "nftables", "--net-uplink", nettest.Uplink, "--net-netns", nw.Node.Path(), "--net-resolvers", nettest.DNS)
	_, err := f.C.PoolsOffer(t.Context(), &client.PoolsOfferInput{TenantId: tenant, PoolId: pool, ToTenantId: "globex",
		Limits: client.Limits{Vcpu: client.NewOptInt64(8), MemoryMiB: client.NewOptInt64(4096), DiskGiB: client.NewOptInt64(1000),
			Sandboxes: client.NewOptInt64(10), Instances: client.NewOptInt64(10)}})
	require.NoError(t, err)
	globex := f.Client("globex")

	template := func(c *computeclient.Client, tenant, name string, mode client.SandboxTemplatesCreateInputNetwork) string {
		res, err := c.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: name, PoolId: pool,
			Flavor: "small", ImageId: "computeplane/minimal", Network: client.NewOptSandboxTemplatesCreateInputNetwork(mode)})
		require.NoError(t, err)
		return res.Data.TemplateId
	}
	dump := func() string {
		node, _ := exec.Command("nsenter", "--net="+nw.Node.Path(), "sh", "-c", "ip addr; ip route").CombinedOutput()
		return fmt.Sprintf("node:\n%s\nagent:\n%s", node, proctest.Tail(agent.Proc.Stderr.String(), 30))
	}
	// The three boot at once (each a TCG boot of seconds).
	boxes := map[string]*netBox{
		"a":    {c: f.C, tenant: tenant},
		"g":    {c: globex, tenant: "globex"},
		"none": {c: f.C, tenant: tenant},
	}
	tmpl := map[string]string{
		"a":    template(f.C, tenant, "net", client.SandboxTemplatesCreateInputNetworkEgress),
		"g":    template(globex, "globex", "net", client.SandboxTemplatesCreateInputNetworkEgress),
		"none": template(f.C, tenant, "isolated", client.SandboxTemplatesCreateInputNetworkNone),
	}
	for key, b := range boxes {
		res, err := b.c.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: b.tenant, IdempotencyKey: "net-" + key,
			TemplateId: client.NewOptString(tmpl[key])})
		require.NoError(t, err)
		b.id = res.Data.SandboxId
		t.Cleanup(func() {
			_, _ = b.c.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: b.tenant, SandboxId: b.id})
		})
	}
	for key, b := range boxes {
		require.Eventually(t, func() bool {
			res, err := b.c.SandboxesGet(t.Context(), &client.SandboxesGetInput{TenantId: b.tenant, SandboxId: b.id})
			require.NoError(t, err)
			require.NotEqual(t, "failed", string(res.Data.State), "%s: %v\n%s", key, res.Data.Error, dump())
			return res.Data.State == "running"
		}, 5*time.Minute, 200*time.Millisecond, "sandbox %s running\n%s", key, dump())
	}
	a, g, none := boxes["a"], boxes["g"], boxes["none"]
	run := func(b *netBox, script string) client.ExecResult {
		t.Helper()
		res, err := b.c.SandboxesExec(t.Context(), &client.SandboxesExecInput{TenantId: b.tenant, SandboxId: b.id, Argv: []string{"/bin/sh", "-c", script},
			TimeoutMs: client.NewOptInt64(60_000)})
		require.NoError(t, err)
		return res.Data
	}
	// wget as a user types it: one try, 3 s at most.
	wget := func(b *netBox, url string) client.ExecResult {
		return run(b, "wget -q -T 3 --no-check-certificate -O - "+url)
	}
	addrOf := func(b *netBox) string {
		out := run(b, "ip -4 -o addr show dev eth0")
		m := regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/`).FindStringSubmatch(out.Stdout)
		require.NotNil(t, m, "eth0 of %s: %+v", b.id, out)
		return m[1]
	}
	setPolicy := func(b *netBox, allow, deny []string) {
		t.Helper()
		_, err := b.c.SandboxesSetEgressPolicy(t.Context(), &client.SandboxesSetEgressPolicyInput{TenantId: b.tenant, SandboxId: b.id,
			Egress: client.EgressPolicy{Allow: allow, Deny: deny}})
		require.NoError(t, err)
	}
	// sets reads the agent's inet table's sets on the node: name ->
	// element keys.
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: network.Prefix + "_" + network.AgentID(agent.Node)}
	sets := func() map[string][]string {
		out := map[string][]string{}
		require.NoError(t, nw.Node.Do(func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			ss, err := c.GetSets(table)
			if err != nil {
				return err
			}
			for _, s := range ss {
				els, err := c.GetSetElements(s)
				if err != nil {
					return err
				}
				out[s.Name] = []string{}
				for _, e := range els {
					if a, ok := netip.AddrFromSlice(e.Key); ok && !e.IntervalEnd {
						out[s.Name] = append(out[s.Name], a.String())
					}
				}
			}
			return nil
		}))
		return out
	}

	t.Run("egress reaches the upstream by address and name with a user's first wget", func(t *testing.T) {
		// The guest's link comes up a moment after its agent answers: the
		// first request is tried for a while.
		out := run(a, "for i in $(seq 30); do wget -q -T 2 -O - http://"+nettest.Upstream+"/ && exit 0; sleep 1; done; exit 1")
		require.Zero(t, out.ExitCode, "%+v\nguest: %s\n%s", out, run(a, "ip addr; ip route; cat /etc/resolv.conf").Stdout, dump())
		assert.Equal(t, "hello "+nettest.NodeAddr+" from "+nettest.Upstream+"\n", out.Stdout, "masqueraded to the node's uplink")
		out = wget(a, "http://upstream.test/")
		require.Zero(t, out.ExitCode, "by name, through the node's resolver: %+v", out)
		assert.Equal(t, "hello "+nettest.NodeAddr+" from upstream.test\n", out.Stdout)
		out = wget(a, "https://upstream.test/")
		require.Zero(t, out.ExitCode, "over TLS: %+v", out)
		assert.Equal(t, "hello "+nettest.NodeAddr+" from upstream.test over tls to upstream.test\n", out.Stdout)
		tap := network.Prefix + network.AgentID(agent.Node) + "t"
		assert.True(t, slices.ContainsFunc(nw.Node.Links(t), func(l string) bool { return strings.HasPrefix(l, tap) }),
			"the tap is in the node's namespace: %v", nw.Node.Links(t))
		require.Zero(t, run(g, "for i in $(seq 30); do wget -q -T 2 -O /dev/null http://"+nettest.Upstream+"/ && exit 0; sleep 1; done; exit 1").ExitCode)
	})

	t.Run("egress does not reach the metadata address", func(t *testing.T) {
		out := wget(a, "http://"+nettest.Metadata+"/")
		assert.NotZero(t, out.ExitCode, "%+v", out)
		assert.NotContains(t, out.Stdout, "hello")
	})

	t.Run("none has no interface but lo", func(t *testing.T) {
		out := run(none, "ls /sys/class/net")
		require.Zero(t, out.ExitCode, "%+v", out)
		assert.Equal(t, "lo\n", out.Stdout)
		assert.NotZero(t, wget(none, "http://"+nettest.Upstream+"/").ExitCode)
	})

	t.Run("another tenant's VM is out of reach", func(t *testing.T) {
		gAddr := addrOf(g)
		// globex's sandbox listens; it reaches itself, acme's does not.
		require.Zero(t, run(g, "(nc -ll -p 9000 -e /bin/echo from-globex </dev/null >/dev/null 2>&1 &); sleep 1").ExitCode)
		out := run(g, "nc -w 3 "+gAddr+" 9000 </dev/null")
		require.Contains(t, out.Stdout, "from-globex", "the listener answers on its own address: %+v", out)
		out = run(a, "nc -w 3 "+gAddr+" 9000 </dev/null")
		assert.NotContains(t, out.Stdout, "from-globex", "%+v", out)
		aAddr := addrOf(a)
		out = run(g, "nc -w 3 "+aAddr+" 9000 </dev/null")
		assert.NotZero(t, out.ExitCode, "nor the other way: %+v", out)
	})

	t.Run("a VM spoofing another address gets nothing through", func(t *testing.T) {
		gw := strings.TrimSpace(run(a, "ip route | sed -n 's/^default via \\([0-9.]*\\).*/\\1/p'").Stdout)
		require.NotEmpty(t, gw)
		gAddr := addrOf(g)
		spoofed := strings.Join(strings.Split(addrOf(a), ".")[:3], ".") + ".250" // a free one of its own subnet
		for _, src := range []string{gAddr, spoofed} {
			out := run(a, fmt.Sprintf("ip addr add %[1]s/32 dev eth0 && ip route add %[2]s/32 via %[3]s src %[1]s && "+
				"wget -q -T 3 -O - http://%[2]s/; rc=$?; ip route del %[2]s/32; ip addr del %[1]s/32 dev eth0; exit $rc", src, nettest.Upstream, gw))
			assert.NotZero(t, out.ExitCode, "from %s: %+v", src, out)
			assert.NotContains(t, out.Stdout, "hello")
		}
		out := wget(a, "http://"+nettest.Upstream+"/")
		assert.Zero(t, out.ExitCode, "its own address still works: %+v", out)
	})

	t.Run("an allow list with a domain admits exactly it, and holds within a second", func(t *testing.T) {
		start := time.Now()
		setPolicy(a, []string{"upstream.test"}, []string{})
		called := time.Since(start)
		// On the node: the VM's redirect to the domain filter is in place.
		require.Eventually(t, func() bool { return len(sets()["domains4"]) > 0 },
			10*time.Second, 20*time.Millisecond, "%s", dump())
		onNode := time.Since(start)
		// In the guest: another name is refused.
		require.Eventually(t, func() bool { return wget(a, "http://other.test/").ExitCode != 0 }, 10*time.Second, 50*time.Millisecond)
		inGuest := time.Since(start)
		t.Logf("allow [upstream.test]: API answered in %s, the node's rules held %s after the call, the guest saw it within %s",
			called.Round(time.Millisecond), onNode.Round(time.Millisecond), inGuest.Round(time.Millisecond))
		assert.Less(t, onNode, 2*time.Second, "goal: within 1 s")

		out := wget(a, "http://upstream.test/")
		require.Zero(t, out.ExitCode, "HTTP with an allowed Host: %+v\n%s", out, dump())
		assert.Equal(t, "hello "+nettest.NodeAddr+" from upstream.test\n", out.Stdout)
		out = wget(a, "https://upstream.test/")
		require.Zero(t, out.ExitCode, "HTTPS with an allowed SNI: %+v", out)
		assert.Equal(t, "hello "+nettest.NodeAddr+" from upstream.test over tls to upstream.test\n", out.Stdout)
		for _, url := range []string{"http://other.test/", "https://other.test/", "https://api.example.test/",
			"http://" + nettest.Upstream + "/", "https://" + nettest.Upstream + "/"} {
			out := wget(a, url)
			assert.NotZero(t, out.ExitCode, "%s: %+v", url, out)
			assert.NotContains(t, out.Stdout, "hello", url)
		}
		// A Host header naming the allowed domain on the same address
		// passes: the name is what the client says (docs/networking.md).
		out = run(a, "printf 'GET / HTTP/1.0\\r\\nHost: upstream.test\\r\\n\\r\\n' | nc -w 3 "+nettest.Upstream+" 80")
		assert.Contains(t, out.Stdout, "from upstream.test", "%+v", out)
		// The metadata address stays out of reach whatever the name.
		out = run(a, "printf 'GET / HTTP/1.0\\r\\nHost: upstream.test\\r\\n\\r\\n' | nc -w 3 "+nettest.Metadata+" 80")
		assert.NotContains(t, out.Stdout, "hello", "%+v", out)
		// The other tenant's sandbox is not filtered by acme's policy.
		assert.Zero(t, wget(g, "http://other.test/").ExitCode)
	})

	t.Run("a deny on a running sandbox holds within a second", func(t *testing.T) {
		setPolicy(a, []string{}, []string{})
		require.Eventually(t, func() bool { return wget(a, "http://other.test/").ExitCode == 0 }, 10*time.Second, 50*time.Millisecond)
		denied := func() bool {
			for name, els := range sets() {
				if strings.HasPrefix(name, "deny_") && slices.Contains(els, nettest.Upstream) {
					return true
				}
			}
			return false
		}
		start := time.Now()
		setPolicy(a, []string{}, []string{nettest.Upstream})
		called := time.Since(start)
		require.Eventually(t, denied, 10*time.Second, 20*time.Millisecond, "%s", dump())
		onNode := time.Since(start)
		require.Eventually(t, func() bool { return wget(a, "http://upstream.test/").ExitCode != 0 }, 10*time.Second, 50*time.Millisecond)
		inGuest := time.Since(start)
		t.Logf("deny [%s]: API answered in %s, the node's rules held %s after the call, the guest saw it within %s",
			nettest.Upstream, called.Round(time.Millisecond), onNode.Round(time.Millisecond), inGuest.Round(time.Millisecond))
		assert.Less(t, onNode, 2*time.Second, "goal: within 1 s")
		assert.Equal(t, "running", string(getBox(t, a).State), "the sandbox kept running")
	})

	t.Run("egress is metered", func(t *testing.T) {
		// The daemon's statuses carry the VM's counters and computed adds
		// their growth to the hour's vps.egress.bytes (docs/usage.md).
		require.Eventually(t, func() bool {
			var bytes int64
			require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(c.quantity), 0) from counted_usage c
				join sandboxes s on s.instance_id = c.instance_id where s.sandbox_id = $1 and c.meter = 'vps.egress.bytes'`, a.id).Scan(&bytes))
			return bytes > 100
		}, 30*time.Second, 500*time.Millisecond, "vps.egress.bytes counted")
	})
}

func getBox(t *testing.T, b *netBox) client.Sandbox {
	res, err := b.c.SandboxesGet(t.Context(), &client.SandboxesGetInput{TenantId: b.tenant, SandboxId: b.id})
	require.NoError(t, err)
	return res.Data
}
