//go:build netbench

// Package netbench is the network benchmark (issue 23), kept out of `make
// test` by its build tag: `make bench-network` runs it as root. It
// measures, on real VMs (TCG) through the generated client, what an
// egress network adds to a sandbox's cold boot and warm claim (p50, p99,
// against the same with network none), and a guest's TCP throughput and
// connection rate to the test's upstream, routed and through the domain
// filter. It writes the section "Network" into NETBENCH_OUT
// (docs/benchmarks.md) and NETBENCH_NOTES (docs/benchmarks-notes.md, which
// make bench copies, so its next run keeps the section).
package netbench

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/agent/network/nettest"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/tools/benchkit"
)

func TestMain(m *testing.M) { qemutest.Main(m) }

type series struct{ total, host []time.Duration }

func TestNetworkBenchmark(t *testing.T) {
	nettest.RequireRoot(t)
	runs := 20
	if v, err := strconv.Atoi(os.Getenv("RUNS")); err == nil && v > 0 {
		runs = v
	}
	im := qemutest.Image(t)
	nw := nettest.NewWorld(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	memory, err := os.MkdirTemp("/dev/shm", "netbench") // guest memory on a tmpfs, as sandboxbench
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(memory) })
	f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "16", "--memory-mib", "16384", "--disk-gib", "1000", "--memory-dir", memory,
		"--network", "nftables", "--net-uplink", nettest.Uplink, "--net-netns", nw.Node.Path(), "--net-resolvers", nettest.DNS)
	const tenant = fleettest.Tenant

	template := func(name string, mode client.SandboxTemplatesCreateInputNetwork, warm int64) string {
		res, err := f.C.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: name, PoolId: pool,
			Flavor: "small", ImageId: "computeplane/minimal", Network: client.NewOptSandboxTemplatesCreateInputNetwork(mode),
			Warm: client.NewOptWarm(client.Warm{Min: warm})})
		require.NoError(t, err)
		return res.Data.TemplateId
	}
	n := 0
	create := func(tmpl string, s *series) client.Sandbox {
		n++
		t0 := time.Now()
		res, err := f.C.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: tenant, IdempotencyKey: "k" + strconv.Itoa(n),
			TemplateId: client.NewOptString(tmpl), Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
		require.NoError(t, err)
		sb := res.Data
		// A boot slower than the longest wait (a loaded machine): polled.
		for sb.State != "running" && sb.State != "failed" && time.Since(t0) < 5*time.Minute {
			time.Sleep(50 * time.Millisecond)
			got, err := f.C.SandboxesGet(t.Context(), &client.SandboxesGetInput{TenantId: tenant, SandboxId: sb.SandboxId})
			require.NoError(t, err)
			sb = got.Data
		}
		total := time.Since(t0)
		require.Equal(t, "running", string(sb.State), "%v", sb.Error)
		if s != nil {
			s.total = append(s.total, total)
			s.host = append(s.host, time.Duration(sb.Timings.HostReadyMs.Value)*time.Millisecond)
		}
		return sb
	}
	remove := func(id string) {
		_, err := f.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: id})
		require.NoError(t, err)
	}
	// settled: the template's warm pool is full and no VM is booting.
	settled := func(tmpl string, want int) {
		require.Eventually(t, func() bool {
			var ready, busy int
			require.NoError(t, f.DB.QueryRow(t.Context(), `select count(*) filter (where kind = 'warm' and template_id = $1 and state = 'paused' and reported_identity = identity_generation),
				count(*) filter (where state in ('pending', 'starting') and desired_state <> 'deleted') from instances`, tmpl).Scan(&ready, &busy))
			return ready >= want && busy == 0
		}, 10*time.Minute, 20*time.Millisecond)
	}

	modes := []client.SandboxTemplatesCreateInputNetwork{client.SandboxTemplatesCreateInputNetworkNone, client.SandboxTemplatesCreateInputNetworkEgress}
	cold, warm := map[string]*series{}, map[string]*series{}
	for _, mode := range modes {
		m := string(mode)
		cold[m], warm[m] = &series{}, &series{}
		ct := template("cold-"+m, mode, 0)
		for i := 0; i < runs; i++ {
			settled(ct, 0)
			remove(create(ct, cold[m]).SandboxId)
		}
		wt := template("warm-"+m, mode, 2)
		for i := 0; i < runs; i++ {
			settled(wt, 2)
			remove(create(wt, warm[m]).SandboxId)
		}
		t.Logf("%s: cold p50 %s p99 %s, warm p50 %s p99 %s", m, benchkit.Pct(cold[m].total, 50), benchkit.Pct(cold[m].total, 99),
			benchkit.Pct(warm[m].total, 50), benchkit.Pct(warm[m].total, 99))
	}

	// Throughput and connection rate from one egress sandbox: the
	// guest's own exec duration of a download (minus an empty exec), and
	// of a loop of connections.
	sb := create(template("io", client.SandboxTemplatesCreateInputNetworkEgress, 0), nil)
	exec := func(script string) client.ExecResult {
		res, err := f.C.SandboxesExec(t.Context(), &client.SandboxesExecInput{TenantId: tenant, SandboxId: sb.SandboxId,
			Argv: []string{"/bin/sh", "-c", script}, TimeoutMs: client.NewOptInt64(300_000)})
		require.NoError(t, err)
		require.Zero(t, res.Data.ExitCode, "%s: %+v", script, res.Data)
		return res.Data
	}
	exec("for i in $(seq 30); do wget -q -T 2 -O /dev/null http://" + nettest.Upstream + "/ && exit 0; sleep 1; done; exit 1")
	const size, conns = 8 << 20, 50
	measure := func(host string) (mbps, perSec float64) {
		base := exec("true").DurationMs
		d := exec(fmt.Sprintf("wget -q -O /dev/null 'http://%s/bytes?n=%d'", host, size)).DurationMs - base
		mbps = float64(size) * 8 / 1e6 / (float64(max(d, 1)) / 1000)
		// Each connection a wget of a short answer: HTTP, as the domain
		// filter needs a name.
		d = exec(fmt.Sprintf("i=0; while [ $i -lt %d ]; do wget -q -O /dev/null http://%s/ || exit 1; i=$((i+1)); done", conns, host)).DurationMs
		spawn := exec(fmt.Sprintf("i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done", conns)).DurationMs
		perSec = float64(conns) / (float64(max(d-spawn, 1)) / 1000)
		return mbps, perSec
	}
	routedMbps, routedRate := measure(nettest.Upstream)
	_, err = f.C.SandboxesSetEgressPolicy(t.Context(), &client.SandboxesSetEgressPolicyInput{TenantId: tenant, SandboxId: sb.SandboxId,
		Egress: client.EgressPolicy{Allow: []string{"upstream.test"}, Deny: []string{}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		res, err := f.C.SandboxesExec(t.Context(), &client.SandboxesExecInput{TenantId: tenant, SandboxId: sb.SandboxId,
			Argv: []string{"/bin/sh", "-c", "wget -q -T 2 -O /dev/null http://other.test/"}})
		return err == nil && res.Data.ExitCode != 0
	}, 30*time.Second, 100*time.Millisecond, "the domain filter holds")
	proxiedMbps, proxiedRate := measure("upstream.test")
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m := regexp.MustCompile(`model name\s*:\s*(.*)`).FindSubmatch(b); m != nil {
			cpu = strings.TrimSpace(string(m[1]))
		}
	}

	row := func(name string, s map[string]*series) string {
		none, egress := s["none"], s["egress"]
		d50 := benchkit.Quantile(egress.total, 50) - benchkit.Quantile(none.total, 50)
		d99 := benchkit.Quantile(egress.total, 99) - benchkit.Quantile(none.total, 99)
		return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name,
			benchkit.Pct(none.total, 50), benchkit.Pct(none.total, 99), benchkit.Pct(egress.total, 50), benchkit.Pct(egress.total, 99),
			d50.Round(time.Millisecond), d99.Round(time.Millisecond), benchkit.Pct(egress.host, 50), benchkit.Pct(egress.host, 99))
	}
	section := fmt.Sprintf(`## Network

Written by `+"`make bench-network`"+` (tools/netbench, as root) on %s: computed and one compute-agent
with the qemu runtime (TCG) and `+"`--network nftables`"+`, its taps, rules, domain filter and qemu in a
node namespace joined by a veth pair to an "internet" namespace holding the upstream
(internal/agent/network/nettest); %d sandboxes of each kind (1 vCPU, 256 MiB, the minimal image,
guest memory on a tmpfs), created one after another with wait and deleted before the next; a warm
pool of 2. %d cores (%s, shared with other work), %s. End to end is the client's create call until
the answer says running; host is the daemon's share of the egress runs.

| Start | none p50 | p99 | egress p50 | p99 | added p50 | added p99 | egress host p50 | p99 |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
%s%s
Goals: the network adds at most 20 ms to a cold boot p50 and at most 5 ms to a warm claim p99.
A cold boot wires the VM's tap and rules (netlink, one nftables transaction) before qemu starts
and the guest configures its card before it answers; a warm claim keeps the VM's network.

Guest to upstream, one egress sandbox (the guest's own timing of the command, an empty exec
subtracted; connections are sequential busybox wget runs of a short answer, the cost of starting
%d processes in the guest subtracted):

| Path | TCP throughput (Mbit/s, one %d MiB download) | Connections per second |
|---|---:|---:|
| routed (masquerade) | %.0f | %.0f |
| through the domain filter (allow list with a name) | %.0f | %.0f |

`, time.Now().UTC().Format("2006-01-02"), runs, runtime.NumCPU(), cpu, runtime.Version(),
		row("cold boot", cold), row("warm claim", warm), conns, size>>20, routedMbps, routedRate, proxiedMbps, proxiedRate)
	t.Log("\n" + section)
	require.NoError(t, benchkit.WriteSection("## Network", section, os.Getenv("NETBENCH_OUT"), os.Getenv("NETBENCH_NOTES")))
}
