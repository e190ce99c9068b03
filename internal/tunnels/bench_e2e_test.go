//go:build tunnelbench

package tunnels_test

// The tunnels benchmark of docs/benchmarks.md ("Tunnels"), through real
// processes (computed with the gateway role alone, computed with the
// others, a compute-agent with the qemu runtime) and a sandbox that is a real VM (TCG):
//
//	go test -tags tunnelbench -count=1 -run TestTunnelBenchmark -timeout 30m -v ./internal/tunnels
//
// or `make bench-tunnels`. It prints the figures; a full run (no
// TUNNEL_BENCH_ONLY) writes the section "Tunnels" into TUNNELBENCH_OUT
// (docs/benchmarks.md) and TUNNELBENCH_NOTES (docs/benchmarks-notes.md,
// which make bench copies, so its next run keeps the section).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
	"computeplane/tools/benchkit"
)

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// rssKiB is a process's resident set (VmRSS).
func rssKiB(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestTunnelBenchmark(t *testing.T) {
	const idle = 1000
	im := qemutest.Image(t)
	// The gateway runs as a process of its own (the goal is its memory).
	pprofs := map[string]string{"api": fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), "gateway": fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))),
		fleettest.TunnelLimits(fmt.Sprintf("{tunnelsPerMinute: 100000, openPerNode: %d, openPerGateway: %d}", 2*idle, 2*idle)),
		fleettest.Env(map[string]string{"SERVICE_PPROF_ADDR": pprofs["api"]}),
		fleettest.SplitGateway(map[string]string{"SERVICE_PPROF_ADDR": pprofs["gateway"]}))
	// TUNNEL_BENCH_ONLY=latency, throughput or memory measures that alone.
	only := os.Getenv("TUNNEL_BENCH_ONLY")
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	ctx := t.Context()
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool,
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone), Flavor: "small", ImageId: "computeplane/minimal"})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	id := sbx.Data.SandboxId
	require.Eventually(t, func() bool {
		g, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: id})
		require.NoError(t, err)
		return g.Data.State == "running"
	}, 120*time.Second, 100*time.Millisecond)
	target := client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id}
	var report tunnelReport
	report.loadStart = loadAverage()
	t.Logf("machine: %d cores, load average %s", runtime.NumCPU(), report.loadStart)

	// dial opens a tunnel and returns the time of tunnels.open (the
	// control plane) and of the upgrade until the first frame from the
	// node (the data path), and the connection.
	dial := func(in *client.TunnelsOpenInput) (time.Duration, time.Duration, *websocket.Conn) {
		start := time.Now()
		tk, err := f.C.TunnelsOpen(ctx, in)
		require.NoError(t, err)
		cp := time.Since(start)
		start = time.Now()
		ws, _, err := websocket.Dial(ctx, tk.Data.URL, nil)
		require.NoError(t, err)
		ws.SetReadLimit(tunnel.MaxFrame + 1)
		return cp, time.Since(start), ws
	}
	firstFrame := func(ws *websocket.Conn) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, _, err := ws.Read(rctx)
		require.NoError(t, err)
	}

	// Open latency: an exec of echo (a program started in the guest) and
	// a console (no guest program: the path alone), 100 of each.
	for _, kind := range []string{"exec", "console"} {
		if only != "" && only != "latency" {
			break
		}
		var control, path []time.Duration
		for i := 0; i < 100; i++ {
			in := &client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKind(kind), Target: target}
			if kind == "exec" {
				in.Argv = []string{"echo", "hi"}
			}
			cp, up, ws := dial(in)
			start := time.Now()
			firstFrame(ws)
			control, path = append(control, cp), append(path, up+time.Since(start))
			ws.CloseNow()
		}
		row := fmt.Sprintf("| %s | %s ms | %s ms | %s ms | %s ms |\n", kind, ms(pct(control, .5)), ms(pct(control, .99)), ms(pct(path, .5)), ms(pct(path, .99)))
		report.latency += row
		t.Logf("open latency %s", row)
	}

	// Throughput of one tcp tunnel: busybox httpd in the guest serves a
	// 32 MiB file of zeros, fetched through the tunnel.
	if only == "" || only == "throughput" {
		report.throughput = throughput(t, dial, id)
	}
	if only == "" || only == "memory" {
		report.memory = memory(t, f, dial, target, idle, pprofs)
	}
	report.loadEnd = loadAverage()
	if only == "" {
		section := report.section(idle)
		t.Log("\n" + section)
		require.NoError(t, benchkit.WriteSection("## Tunnels", section, os.Getenv("TUNNELBENCH_OUT"), os.Getenv("TUNNELBENCH_NOTES")))
	}
}

// tunnelReport is a run's figures, its table rows already formatted.
type tunnelReport struct {
	loadStart, loadEnd string
	latency            string
	throughput         [3]float64 // MiB/s: tcp tunnel, exec tunnel, the guest alone
	memory             string
}

func (r tunnelReport) section(idle int) string {
	return fmt.Sprintf(`## Tunnels

Written by `+"`make bench-tunnels`"+` (internal/tunnels, TestTunnelBenchmark) on %s: computed with the
gateway role alone as one process, computed with the other roles (the api's relay) as another, one
compute-agent with the qemu runtime, a running sandbox (1 vCPU, 256 MiB, the minimal image, TCG,
not KVM), the client in the test process on loopback; %d cores, %s. Load average (uptime) at the
start %s, at the end %s. Analysis and the figures before the relay work: "Tunnels: before and
after the relay work" below.

| Open latency (100 opens each) | tunnels.open p50 | p99 | upgrade to first frame p50 | p99 |
|---|---:|---:|---:|---:|
%s
| Throughput (32 MiB of zeros from the guest) | MiB/s |
|---|---:|
| one tcp tunnel, busybox httpd in the guest, HTTP/1.0 GET, end to end | %.1f |
| one exec tunnel, `+"`cat`"+` of the same file (no guest network), end to end | %.1f |
| the guest alone: busybox wget of the file over the guest's loopback, no tunnel | %.1f |

| Memory with %d idle console tunnels open | RSS growth per tunnel | Go heap in use per tunnel | goroutines per tunnel |
|---|---:|---:|---:|
%s
`, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), r.loadStart, r.loadEnd,
		r.latency, r.throughput[0], r.throughput[1], r.throughput[2], idle, r.memory)
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " / ")
}

type dialer func(in *client.TunnelsOpenInput) (time.Duration, time.Duration, *websocket.Conn)

// throughput is the MiB/s of a tcp tunnel, an exec tunnel and the guest
// alone.
func throughput(t *testing.T, dial dialer, id string) (mibs [3]float64) {
	ctx := t.Context()
	target := client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id}
	_, _, sh := dial(&client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec, Target: target,
		Argv: []string{"sh", "-c", "mkdir -p /www && dd if=/dev/zero of=/www/big bs=1M count=32 2>/dev/null && busybox httpd -p 127.0.0.1:8080 -h /www && echo up"}})
	for {
		_, b, err := sh.Read(ctx)
		require.NoError(t, err)
		if b[0] == tunnel.FrameExit {
			break
		}
	}
	sh.CloseNow()
	port := int64(8080)
	_, _, tcp := dial(&client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindTCP, Target: target, Port: client.NewOptInt64(port)})
	start := time.Now()
	require.NoError(t, tcp.Write(ctx, websocket.MessageBinary, append([]byte{tunnel.FrameStdin}, "GET /big HTTP/1.0\r\n\r\n"...)))
	var n int64
	for {
		_, b, err := tcp.Read(ctx)
		if err != nil || b[0] == tunnel.FrameExit {
			break
		}
		n += int64(len(b) - 1)
	}
	took := time.Since(start)
	require.Greater(t, n, int64(32<<20))
	mibs[0] = float64(n) / (1 << 20) / took.Seconds()
	t.Logf("throughput of one tcp tunnel: %d bytes in %s: %.1f MiB/s", n, took, mibs[0])
	tcp.CloseNow()

	// The same bytes without the guest's network (cat's output through an
	// exec tunnel), and the guest alone (its own wget of the file, no
	// tunnel): where the time goes.
	_, _, cat := dial(&client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec, Target: target,
		Argv: []string{"cat", "/www/big"}})
	start, n = time.Now(), 0
	for {
		_, b, err := cat.Read(ctx)
		if err != nil || b[0] == tunnel.FrameExit {
			break
		}
		n += int64(len(b) - 1)
	}
	took = time.Since(start)
	mibs[1] = float64(n) / (1 << 20) / took.Seconds()
	t.Logf("throughput of one exec tunnel (cat of the file): %d bytes in %s: %.1f MiB/s", n, took, mibs[1])
	cat.CloseNow()
	_, _, local := dial(&client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec, Target: target,
		Argv: []string{"sh", "-c", "a=$(cut -d' ' -f1 /proc/uptime); busybox wget -q -O /dev/null http://127.0.0.1:8080/big; b=$(cut -d' ' -f1 /proc/uptime); echo $a $b"}})
	var outb strings.Builder
	for {
		_, b, err := local.Read(ctx)
		if err != nil || b[0] == tunnel.FrameExit {
			break
		}
		outb.Write(b[1:])
	}
	local.CloseNow()
	if f := strings.Fields(outb.String()); len(f) == 2 {
		a, _ := strconv.ParseFloat(f[0], 64)
		b, _ := strconv.ParseFloat(f[1], 64)
		mibs[2] = 32 / (b - a)
		t.Logf("the guest alone (busybox wget of the file over the guest's loopback): %.1f s: %.1f MiB/s", b-a, mibs[2])
	} else {
		t.Logf("the guest alone: %q", outb.String())
	}
	return mibs
}

// memory returns the table's rows: per process, its growth per tunnel.
func memory(t *testing.T, f *fleettest.Fleet, dial dialer, target client.TunnelTarget, idle int, pprofs map[string]string) (rows string) {
	// Memory per open idle tunnel: the gateway process alone and the api's
	// (computed with the other roles) before and after 1,000 idle console
	// tunnels.
	type proc struct {
		name  string
		p     *proctest.Process
		pprof string
		rss   int64
		heap  int64
		gor   int64
	}
	procs := []*proc{{name: "gateway", p: f.Gateway, pprof: pprofs["gateway"]}, {name: "api", p: f.Computed, pprof: pprofs["api"]}}
	time.Sleep(2 * time.Second)
	for _, p := range procs {
		p.rss, p.heap, p.gor = rssKiB(t, p.p.Cmd.Process.Pid), heapInuse(t, p.pprof), goroutines(t, p.pprof)
	}
	conns := make([]*websocket.Conn, 0, idle)
	for i := 0; i < idle; i++ {
		_, _, ws := dial(&client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindConsole, Target: target})
		conns = append(conns, ws)
		go func() { // the client reads what comes (the console's tail)
			for {
				if _, _, err := ws.Read(context.Background()); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(5 * time.Second)
	for _, p := range procs {
		rss, heap, gor := rssKiB(t, p.p.Cmd.Process.Pid), heapInuse(t, p.pprof), goroutines(t, p.pprof)
		row := fmt.Sprintf("| the %s process | %.1f KiB | %.1f KiB | %.2f |\n", p.name,
			float64(rss-p.rss)/float64(idle), float64(heap-p.heap)/1024/float64(idle), float64(gor-p.gor)/float64(idle))
		t.Logf("memory: RSS %d KiB before, %d KiB with %d idle tunnels; per tunnel (RSS, heap in use, goroutines): %s", p.rss, rss, idle, row)
		rows += row
	}
	t.Logf("machine: load average %s", loadAverage())
	// TUNNEL_BENCH_HEAP=file keeps the gateway's heap profile (go tool
	// pprof -top -sample_index=inuse_space file) and goroutine dump
	// (file.goroutines), and the api's (file.api, file.api.goroutines).
	if out := os.Getenv("TUNNEL_BENCH_HEAP"); out != "" {
		for _, p := range procs {
			name := out
			if p.name != "gateway" {
				name += "." + p.name
			}
			require.NoError(t, os.WriteFile(name, pprofGet(t, p.pprof, "heap"), 0o644))
			require.NoError(t, os.WriteFile(name+".goroutines", pprofGet(t, p.pprof, "goroutine?debug=1"), 0o644))
		}
	}
	for _, ws := range conns {
		ws.CloseNow()
	}
	return rows
}

func pprofGet(t *testing.T, addr, what string) []byte {
	resp, err := http.Get("http://" + addr + "/debug/pprof/" + what)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// heapInuse is a process's HeapInuse after a collection (the heap
// profile's statistics, gc=1).
func heapInuse(t *testing.T, addr string) int64 {
	b := pprofGet(t, addr, "heap?debug=1&gc=1")
	_, v, ok := strings.Cut(string(b), "# HeapInuse = ")
	require.True(t, ok, "the heap profile shows HeapInuse")
	v, _, _ = strings.Cut(v, "\n")
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	require.NoError(t, err)
	return n
}

// goroutines is a process's number of goroutines.
func goroutines(t *testing.T, addr string) int64 {
	b := pprofGet(t, addr, "goroutine?debug=1")
	_, v, _ := strings.Cut(string(b), "goroutine profile: total ")
	v, _, _ = strings.Cut(v, "\n")
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	require.NoError(t, err)
	return n
}
