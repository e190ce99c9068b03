package instances_test

// Instances (VPS) with networks on real VMs, end to end (issue 23):
// computed and a compute-agent run with --network nftables as processes,
// the agent's taps and qemu in a node namespace of the test's own
// (--net-netns) joined to an "internet" namespace (nettest). Instances
// have no exec: each guest runs a probe loop from its user data and
// writes one line per probe and round to its serial console, which the
// test reads from the agent's directory.

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"computeplane/gen/client"
	"computeplane/internal/agent/network"
	"computeplane/internal/agent/network/nettest"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// Addresses the test adds to its internet: a second upstream (policy
// changes), an address in a private range (the platform deny set must
// hold although the route exists) and one in the private range the
// operator allows (--net-allow-private).
const (
	upstream2    = "198.51.100.11"
	deniedPriv   = "172.16.77.1"
	allowedPriv  = "192.168.77.1"
	allowedRange = "192.168.77.0/24"
	nodePort     = "8080" // a service of the node, on every node address
)

// probe is one check a guest repeats: its exit status is the result, the
// first line of its output the body.
type probe struct{ label, cmd string }

// probeUserData is user data that starts the probe loop in the
// background (user data runs before the instance counts as running and
// has 60 s) and returns: each round writes "probe <round> <label>
// rc=<status> <body>" per probe to the console, then sleeps a second.
func probeUserData(probes []probe) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\ncat > /run/probe.sh <<'EOF'\ni=0\nwhile :; do\n  i=$((i+1))\n")
	for _, p := range probes {
		fmt.Fprintf(&b, "  out=$( { %s ; } 2>/dev/null ); rc=$?; echo \"probe $i %s rc=$rc $(echo \"$out\" | head -n 1)\"\n", p.cmd, p.label)
	}
	b.WriteString("  sleep 1\ndone\nEOF\nsetsid sh /run/probe.sh </dev/null >/dev/console 2>&1 &\n")
	return b.String()
}

func wgetProbe(label, url string) probe {
	return probe{label, "wget -q -T 2 -O - " + url}
}

var probeLine = regexp.MustCompile(`probe (\d+) (\S+) rc=(\d+) ?([^\r\n]*)`)

// result is one probe's line.
type result struct {
	round, rc int
	body      string
}

// TestAnInstanceReachesTheInternetAndItsPolicyHoldsLive: four instances
// booted once and shared by the subtests, in order: acme's egress one
// created with a deny list, two private ones of acme, and a none one.
// The last subtest SIGKILLs the agent and the egress VM's qemu and
// restarts the agent: what it made for the dead VM is gone, the living
// VMs keep their network.
func TestAnInstanceReachesTheInternetAndItsPolicyHoldsLive(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	nettest.RequireRoot(t)
	im := qemutest.Image(t)
	nw := nettest.NewWorld(t) // first made, last removed: after the agent and its VMs
	require.NoError(t, nw.Inet.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []string{upstream2, deniedPriv, allowedPriv} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		return nil
	}))
	serve := func(ns nettest.NS, addr, answer string) {
		var ln net.Listener
		require.NoError(t, ns.Do(func() (err error) { ln, err = net.Listen("tcp", addr); return err }))
		srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprintln(rw, answer) }),
			ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	serve(nw.Node, "0.0.0.0:"+nodePort, "the node answered") // the node's own service: its uplink and gateway addresses
	serve(nw.Inet, "0.0.0.0:25", "smtp answered")            // TCP port 25 is closed to VMs

	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000",
		"--network", "nftables", "--net-uplink", nettest.Uplink, "--net-netns", nw.Node.Path(), "--net-resolvers", nettest.DNS,
		"--net-allow-private", allowedRange)
	c := f.C
	dump := func() string {
		node, _ := exec.Command("nsenter", "--net="+nw.Node.Path(), "sh", "-c", "ip addr; ip route").CombinedOutput()
		return fmt.Sprintf("node:\n%s\nagent:\n%s", node, proctest.Tail(agent.Proc.Stderr.String(), 30))
	}

	egressProbes := []probe{
		wgetProbe("up", "http://"+nettest.Upstream+"/"),
		wgetProbe("name", "http://upstream.test/"),
		wgetProbe("up2", "http://"+upstream2+"/"),
		wgetProbe("meta", "http://"+nettest.Metadata+"/"),
		wgetProbe("node", "http://"+nettest.NodeAddr+":"+nodePort+"/"),
		wgetProbe("gw", "http://$(ip route | sed -n 's/^default via \\([0-9.]*\\).*/\\1/p'):"+nodePort+"/"),
		wgetProbe("priv", "http://"+deniedPriv+"/"),
		wgetProbe("privok", "http://"+allowedPriv+"/"),
		wgetProbe("smtp", "http://"+nettest.Upstream+":25/"),
	}
	privateProbes := []probe{
		{"ping2", "ping -c 1 -W 2 10.201.0.2 >/dev/null && echo pong"},
		{"ping3", "ping -c 1 -W 2 10.201.0.3 >/dev/null && echo pong"},
		wgetProbe("up", "http://"+nettest.Upstream+"/"),
		{"mtu", "cat /sys/class/net/eth0/mtu"},
	}
	type box struct {
		network client.InstancesCreateInputNetwork
		egress  client.OptEgressPolicy
		probes  []probe
		id      string
	}
	boxes := map[string]*box{
		"e": {network: client.InstancesCreateInputNetworkEgress, probes: egressProbes,
			egress: client.NewOptEgressPolicy(client.EgressPolicy{Deny: []string{upstream2}})},
		"p1":   {network: client.InstancesCreateInputNetworkPrivate, probes: privateProbes},
		"p2":   {network: client.InstancesCreateInputNetworkPrivate, probes: privateProbes},
		"none": {network: client.InstancesCreateInputNetworkNone, probes: []probe{{"ifs", "ls /sys/class/net | tr '\\n' ' '"}}},
	}
	// p1 before p2: their addresses are .2 and .3 of acme's private /24.
	for _, key := range []string{"e", "p1", "p2", "none"} {
		b := boxes[key]
		res, err := c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: pool, Flavor: "small",
			ImageId: "computeplane/minimal", Name: key, IdempotencyKey: "net-" + key, Network: client.NewOptInstancesCreateInputNetwork(b.network),
			Egress: b.egress, UserData: client.NewOptString(probeUserData(b.probes))})
		require.NoError(t, err)
		b.id = res.Data.InstanceId
		t.Cleanup(func() {
			_, _ = c.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: fleettest.Tenant, InstanceId: b.id})
		})
	}
	get := func(b *box) client.Instance {
		res, err := c.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: b.id})
		require.NoError(t, err)
		return res.Data
	}
	for key, b := range boxes {
		require.Eventually(t, func() bool {
			in := get(b)
			require.NotEqual(t, "failed", string(in.State), "%s: %v\n%s", key, in.Error, dump())
			return in.State == "running"
		}, 5*time.Minute, 200*time.Millisecond, "instance %s running\n%s", key, dump())
	}
	e, p1, p2, none := boxes["e"], boxes["p1"], boxes["p2"], boxes["none"]
	require.Equal(t, "10.201.0.2/24", get(p1).Address.Value)
	require.Equal(t, "10.201.0.3/24", get(p2).Address.Value)

	console := func(b *box) string {
		out, _ := os.ReadFile(filepath.Join(agent.Dir, "runtime", "vms", b.id, "console.log"))
		return string(out)
	}
	// results are a box's probe lines by label, oldest first.
	results := func(b *box) map[string][]result {
		out := map[string][]result{}
		for _, m := range probeLine.FindAllStringSubmatch(console(b), -1) {
			round, _ := strconv.Atoi(m[1])
			rc, _ := strconv.Atoi(m[3])
			out[m[2]] = append(out[m[2]], result{round, rc, strings.TrimSpace(m[4])})
		}
		return out
	}
	lastRound := func(b *box) (n int) {
		for _, rs := range results(b) {
			for _, r := range rs {
				n = max(n, r.round)
			}
		}
		return n
	}
	// after waits for a round of b's probes that began after now (two
	// rounds on from the last one seen: the one under way may have
	// probed before) and returns its results.
	after := func(b *box) map[string]result {
		t.Helper()
		from := lastRound(b) + 2
		got := map[string]result{}
		require.Eventually(t, func() bool {
			rs := results(b)
			for _, p := range b.probes {
				i := slices.IndexFunc(rs[p.label], func(r result) bool { return r.round >= from })
				if i < 0 {
					return false
				}
				got[p.label] = rs[p.label][i]
			}
			return true
		}, 3*time.Minute, 200*time.Millisecond, "a round %d of %s's probes; console:\n%s\n%s", from, b.id, proctest.Tail(console(b), 40), dump())
		return got
	}
	reached := func(r map[string]result, label string) {
		t.Helper()
		assert.Zero(t, r[label].rc, "%s must be reached: %+v", label, r[label])
	}
	blocked := func(r map[string]result, label string) {
		t.Helper()
		assert.NotZero(t, r[label].rc, "%s must be out of reach: %+v", label, r[label])
		assert.NotContains(t, r[label].body, "answered", label)
		assert.NotContains(t, r[label].body, "hello", label)
	}
	denySet := func(r map[string]result) {
		t.Helper()
		for _, l := range []string{"meta", "node", "gw", "priv", "smtp"} {
			blocked(r, l)
		}
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: network.Prefix + "_" + network.AgentID(agent.Node)}
	// sets reads the agent's inet table's sets on the node: name ->
	// element keys.
	sets := func() map[string][]string {
		out := map[string][]string{}
		require.NoError(t, nw.Node.Do(func() error {
			nc, err := nftables.New()
			if err != nil {
				return err
			}
			ss, err := nc.GetSets(table)
			if err != nil {
				return err
			}
			for _, s := range ss {
				els, err := nc.GetSetElements(s)
				if err != nil {
					return err
				}
				out[s.Name] = []string{}
				for _, el := range els {
					if a, ok := netip.AddrFromSlice(el.Key); ok && !el.IntervalEnd {
						out[s.Name] = append(out[s.Name], a.String())
					}
				}
			}
			return nil
		}))
		return out
	}
	key := network.VMKey(e.id)
	setPolicy := func(allow, deny []string, holds func(map[string][]string) bool) {
		t.Helper()
		start := time.Now()
		res, err := c.InstancesSetEgressPolicy(t.Context(), &client.InstancesSetEgressPolicyInput{TenantId: fleettest.Tenant, InstanceId: e.id,
			Egress: client.EgressPolicy{Allow: allow, Deny: deny}})
		require.NoError(t, err)
		assert.Equal(t, "running", string(res.Data.State))
		require.Eventually(t, func() bool { return holds(sets()) }, 10*time.Second, 20*time.Millisecond, "allow %v deny %v on the node\n%s", allow, deny, dump())
		t.Logf("allow %v deny %v: held on the node %s after the call", allow, deny, time.Since(start).Round(time.Millisecond))
		assert.Less(t, time.Since(start), 2*time.Second, "goal: within 1 s")
	}

	t.Run("egress reaches the internet, its create-time deny list and the platform deny set hold", func(t *testing.T) {
		in := get(e)
		assert.Equal(t, "egress", string(in.Network))
		assert.Equal(t, []string{upstream2 + "/32"}, in.Egress.Deny)
		r := after(e)
		reached(r, "up")
		assert.Equal(t, "hello "+nettest.NodeAddr+" from "+nettest.Upstream, r["up"].body, "masqueraded to the node's uplink")
		reached(r, "name")
		assert.Equal(t, "hello "+nettest.NodeAddr+" from upstream.test", r["name"].body, "by name, through the node's resolver")
		blocked(r, "up2")
		reached(r, "privok") // the operator's allowed private range
		denySet(r)
	})

	t.Run("a policy change on the running instance takes effect", func(t *testing.T) {
		setPolicy([]string{upstream2}, []string{}, func(s map[string][]string) bool {
			return slices.Contains(s["allow_"+key], upstream2) && len(s["deny_"+key]) == 0
		})
		r := after(e)
		reached(r, "up2")
		blocked(r, "up")
		blocked(r, "name")
		blocked(r, "privok") // an allow list admits its entries only
		denySet(r)

		setPolicy([]string{"upstream.test"}, []string{}, func(s map[string][]string) bool {
			return len(s["allow_"+key]) == 0 && len(s["domains4"]) > 0
		})
		r = after(e)
		reached(r, "name")
		assert.Equal(t, "hello "+nettest.NodeAddr+" from upstream.test", r["name"].body)
		blocked(r, "up")  // an address is no name
		blocked(r, "up2") // nor is any other destination
		blocked(r, "privok")
		denySet(r)

		setPolicy([]string{}, []string{}, func(s map[string][]string) bool {
			return len(s["allow_"+key]) == 0 && len(s["deny_"+key]) == 0 && len(s["domains4"]) == 0
		})
		r = after(e)
		reached(r, "up")
		reached(r, "up2")
		reached(r, "privok")
		denySet(r)
		assert.Equal(t, "running", string(get(e).State), "the instance kept running")
		assert.GreaterOrEqual(t, f.Events("instance.egress.changed", e.id), 3)
	})

	t.Run("private instances reach each other and nothing else; none has only lo", func(t *testing.T) {
		r1, r2 := after(p1), after(p2)
		reached(r1, "ping3")
		reached(r2, "ping2")
		blocked(r1, "up")
		blocked(r2, "up")
		assert.Equal(t, "1450", r1["mtu"].body, "the underlay (by default the uplink) less VXLAN's 50 bytes")
		assert.Equal(t, "lo", after(none)["ifs"].body)
	})

	t.Run("egress is metered", func(t *testing.T) {
		require.Eventually(t, func() bool {
			var bytes int64
			require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(quantity), 0) from counted_usage
				where instance_id = $1 and meter = 'vps.egress.bytes'`, e.id).Scan(&bytes))
			return bytes > 1000
		}, 60*time.Second, 500*time.Millisecond, "vps.egress.bytes counted for the instance")
		var private int64
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(quantity), 0) from counted_usage
			where instance_id = $1 and meter = 'vps.egress.bytes'`, p1.id).Scan(&private))
		assert.Zero(t, private, "private traffic never leaves the node: not egress")
	})

	t.Run("a killed agent's leftovers are gone after it restarts", func(t *testing.T) {
		agentTest(t, nw, f, agent, e.id, []string{p1.id, p2.id}, func(id string) map[string]result {
			for _, b := range boxes {
				if b.id == id {
					return after(b)
				}
			}
			return nil
		})
	})
}

// nodeObjects are what an agent made in its node's namespace.
type nodeObjects struct {
	links  map[string]string   // name -> alias
	addrs  map[string][]string // link name -> IPv4 addresses
	chains map[string]bool     // "family/chain" of the agent's tables
	maps   map[string][]string // inet table's maps and sets -> IPv4 keys
}

func readNode(t *testing.T, ns nettest.NS, agentID string) nodeObjects {
	t.Helper()
	o := nodeObjects{links: map[string]string{}, addrs: map[string][]string{}, chains: map[string]bool{}, maps: map[string][]string{}}
	require.NoError(t, ns.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			name := l.Attrs().Name
			if !strings.HasPrefix(name, network.Prefix+agentID) {
				continue
			}
			o.links[name] = l.Attrs().Alias
			as, err := netlink.AddrList(l, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			for _, a := range as {
				o.addrs[name] = append(o.addrs[name], a.IPNet.String())
			}
		}
		nc, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := nc.ListChains()
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Table.Name == network.Prefix+"_"+agentID {
				o.chains[fmt.Sprintf("%d/%s", ch.Table.Family, ch.Name)] = true
			}
		}
		table := &nftables.Table{Family: nftables.TableFamilyINet, Name: network.Prefix + "_" + agentID}
		ss, err := nc.GetSets(table)
		if err != nil {
			return err
		}
		for _, s := range ss {
			els, err := nc.GetSetElements(s)
			if err != nil {
				return err
			}
			o.maps[s.Name] = []string{}
			for _, el := range els {
				if a, ok := netip.AddrFromSlice(el.Key); ok && !el.IntervalEnd {
					o.maps[s.Name] = append(o.maps[s.Name], a.String())
				}
			}
		}
		return nil
	}))
	return o
}

// tapOf is the name of the tap whose alias names instance id ("" when
// there is none).
func (o nodeObjects) tapOf(id string) string {
	for name, alias := range o.links {
		if alias == "computeplane vm "+id {
			return name
		}
	}
	return ""
}

// kindOf lists the agent's links of one kind (network.Prefix + id + kind).
func (o nodeObjects) kindOf(agentID, kind string) []string {
	var out []string
	for name := range o.links {
		if strings.HasPrefix(name, network.Prefix+agentID+kind) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// agentTest SIGKILLs the agent, then the qemu of instance dead (the only
// egress VM: its tap, its tenant's egress bridge with the gateway address,
// its nftables chains and map entries are left behind), restarts the
// agent and checks that they are gone while the living VMs' network is
// kept and still works.
func agentTest(t *testing.T, nw *nettest.World, f *fleettest.Fleet, agent *fleettest.Agent, dead string, living []string,
	after func(id string) map[string]result) {
	id := network.AgentID(agent.Node)
	key := network.VMKey(dead)
	before := readNode(t, nw.Node, id)
	deadTap := before.tapOf(dead)
	require.NotEmpty(t, deadTap, "the egress VM's tap: %v", before.links)
	egressBridges := before.kindOf(id, "e")
	require.Len(t, egressBridges, 1, "acme's egress bridge: %v", before.links)
	require.Equal(t, []string{"10.200.0.1/24"}, before.addrs[egressBridges[0]], "the gateway address on the egress bridge")
	require.True(t, before.chains[fmt.Sprintf("%d/vm_%s", nftables.TableFamilyINet, key)], "the VM's chain: %v", before.chains)
	livingTaps := map[string]string{}
	for _, l := range living {
		livingTaps[l] = before.tapOf(l)
		require.NotEmpty(t, livingTaps[l])
	}
	privateBridges := before.kindOf(id, "p")
	require.Len(t, privateBridges, 1)

	pidFile := filepath.Join(agent.Dir, "runtime", "vms", dead, "qemu.pid")
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	qemuPid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	var epoch int64
	require.NoError(t, f.DB.QueryRow(t.Context(), `select session_epoch from nodes where node_id = $1`, agent.Node).Scan(&epoch))

	agent.Proc.Kill(t) // SIGKILL: no shutdown path runs
	require.NoError(t, syscall.Kill(qemuPid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return syscall.Kill(qemuPid, 0) != nil || zombie(qemuPid) }, 10*time.Second, 20*time.Millisecond)
	// With the agent dead, nothing removed them.
	left := readNode(t, nw.Node, id)
	require.Equal(t, deadTap, left.tapOf(dead), "the dead VM's tap is left behind")
	require.Contains(t, left.maps["fromvm4"], "10.200.0.2", "its map entry is left behind")

	agent.Run()
	require.Eventually(t, func() bool {
		var now int64
		_ = f.DB.QueryRow(t.Context(), `select session_epoch from nodes where node_id = $1 and session_gateway is not null`, agent.Node).Scan(&now)
		return now > epoch
	}, 60*time.Second, 50*time.Millisecond, "a new session; agent:\n%s", proctest.Tail(agent.Proc.Stderr.String(), 30))
	var state string
	require.Eventually(t, func() bool {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select state from instances where instance_id = $1`, dead).Scan(&state))
		return state == "failed"
	}, 60*time.Second, 100*time.Millisecond, "the dead VM is reported failed; agent:\n%s", proctest.Tail(agent.Proc.Stderr.String(), 30))

	now := readNode(t, nw.Node, id)
	assert.Empty(t, now.tapOf(dead), "the dead VM's tap is gone: %v", now.links)
	assert.NotContains(t, now.links, deadTap)
	assert.Empty(t, now.kindOf(id, "e"), "the egress bridge of its tenant (its last VM) is gone, with the gateway address: %v", now.links)
	for _, addrs := range now.addrs {
		assert.NotContains(t, addrs, "10.200.0.1/24", "the gateway address is gone")
	}
	for ch := range now.chains {
		assert.NotContains(t, ch, key, "the dead VM's chains are gone")
	}
	for name, els := range now.maps {
		assert.NotContains(t, name, key, "the dead VM's sets are gone")
		assert.NotContains(t, els, "10.200.0.2", "no map or set of the agent names the dead VM's address (%s)", name)
	}
	// The living VMs kept their taps and their tenant's bridge, and
	// their network works.
	for _, l := range living {
		assert.Equal(t, livingTaps[l], now.tapOf(l), "a living VM keeps its tap")
	}
	assert.Equal(t, privateBridges, now.kindOf(id, "p"))
	r1, r2 := after(living[0]), after(living[1])
	assert.Zero(t, r1["ping3"].rc, "%+v", r1)
	assert.Zero(t, r2["ping2"].rc, "%+v", r2)
	assert.Equal(t, "running", instanceState(t, f, living[0]))
}

func instanceState(t *testing.T, f *fleettest.Fleet, id string) string {
	var s string
	require.NoError(t, f.DB.QueryRow(t.Context(), `select state from instances where instance_id = $1`, id).Scan(&s))
	return s
}
