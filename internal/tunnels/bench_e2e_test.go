//go:build tunnelbench

package tunnels_test

// The tunnels benchmark of docs/benchmarks.md ("Tunnels"), through real
// processes (computed with every role, a compute-agent with the qemu
// runtime) and a sandbox that is a real VM (TCG):
//
//	go test -tags tunnelbench -count=1 -run TestTunnelBenchmark -timeout 30m -v ./internal/tunnels
//
// It prints the figures; they are copied into docs/benchmarks.md.

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
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
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
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\nmetrics: {token: %q}\n", filepath.Dir(filepath.Dir(im.Location)), benchMetricsToken),
		fleettest.TunnelLimits(fmt.Sprintf("{tunnelsPerMinute: 100000, openPerNode: %d, openPerGateway: %d}", 2*idle, 2*idle)),
		fleettest.Env(map[string]string{"SERVICE_PPROF_ADDR": pprofAddr}))
	// TUNNEL_BENCH_ONLY=memory measures the memory alone.
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
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("machine: %d cores, load average %s", runtime.NumCPU(), strings.TrimSpace(string(load)))

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
		if only != "" {
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
		t.Logf("open latency %s: tunnels.open p50 %s ms p99 %s ms; upgrade to first frame p50 %s ms p99 %s ms",
			kind, ms(pct(control, .5)), ms(pct(control, .99)), ms(pct(path, .5)), ms(pct(path, .99)))
	}

	// Throughput of one tcp tunnel: busybox httpd in the guest serves a
	// 32 MiB file of zeros, fetched through the tunnel.
	if only == "" {
		throughput(t, dial, id)
	}
	memory(t, f, dial, target, idle, pprofAddr)
}

type dialer func(in *client.TunnelsOpenInput) (time.Duration, time.Duration, *websocket.Conn)

func throughput(t *testing.T, dial dialer, id string) {
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
	t.Logf("throughput of one tcp tunnel: %d bytes in %s: %.1f MiB/s", n, took, float64(n)/(1<<20)/took.Seconds())
	tcp.CloseNow()
}

func memory(t *testing.T, f *fleettest.Fleet, dial dialer, target client.TunnelTarget, idle int, pprofAddr string) {
	// Memory per open idle tunnel: computed (the api relay and the
	// gateway in one process) before and after 1,000 idle console
	// tunnels.
	runtime.GC()
	time.Sleep(2 * time.Second)
	pid := f.Computed.Cmd.Process.Pid
	before := rssKiB(t, pid)
	heapBefore := heapInuse(t, f)
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
	after := rssKiB(t, pid)
	heapAfter := heapInuse(t, f)
	t.Logf("memory: computed RSS %d KiB before, %d KiB with %d idle tunnels: %.1f KiB per tunnel (api relay and gateway together); heap in use %.1f KiB per tunnel",
		before, after, idle, float64(after-before)/float64(idle), float64(heapAfter-heapBefore)/1024/float64(idle))
	// TUNNEL_BENCH_HEAP=file keeps computed's heap profile (go tool
	// pprof -top -sample_index=inuse_space file): its shares by function.
	if out := os.Getenv("TUNNEL_BENCH_HEAP"); out != "" {
		resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/heap")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(out, b, 0o644))
		resp, err = http.Get("http://" + pprofAddr + "/debug/pprof/goroutine?debug=1")
		require.NoError(t, err)
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, os.WriteFile(out+".goroutines", b, 0o644))
	}
	for _, ws := range conns {
		ws.CloseNow()
	}
}

// heapInuse reads computed's go_memstats_heap_inuse_bytes from /metrics,
// -1 when metrics are not served.
func heapInuse(t *testing.T, f *fleettest.Fleet) int64 {
	req, _ := http.NewRequest(http.MethodGet, f.PublicURL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+benchMetricsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "go_memstats_heap_inuse_bytes "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int64(f)
		}
	}
	return -1
}

const benchMetricsToken = "tunnel-bench-metrics-token"
