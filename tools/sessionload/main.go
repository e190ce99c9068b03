// Command sessionload measures one gateway process under N daemon sessions
// over the real protocol and real TLS (issue 11's benchmark): the
// gateway's memory per idle session, the time for all sessions to connect,
// and the time for all to come back after the gateway is SIGKILLed and
// started again. It makes a database of its own on the server of
// -database, nodes and their certificates from a fresh PKI bundle, runs
// computed with the gateway role only as a child process, and writes its
// figures into docs/benchmarks.md and docs/benchmarks-notes.md (the
// section "Gateway sessions").
//
//	go run ./tools/sessionload [-n 5000] [-database $SERVICE_DATABASE_URL]
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"

	"computeplane/internal/agentproto"
	"computeplane/internal/ids"
	"computeplane/internal/pki"
	"computeplane/tools/benchkit"
)

const secret = "sessionload-secret-0123456789abcdefghijklmnop"

func main() {
	n := flag.Int("n", 5000, "daemon sessions")
	database := flag.String("database", os.Getenv("SERVICE_DATABASE_URL"), "a PostgreSQL URL; a database of its own is made on that server")
	out := flag.String("out", "docs/benchmarks.md", "the benchmarks page to write the section into")
	notes := flag.String("notes", "docs/benchmarks-notes.md", "the notes page make bench appends (the section is kept there too)")
	computed := flag.String("computed", "", "a built computed binary (default: go build ./cmd/computed)")
	flag.Parse()
	if *database == "" {
		log.Fatal("sessionload: -database or SERVICE_DATABASE_URL is required")
	}
	raiseNoFile(*n)
	ctx := context.Background()
	work, err := os.MkdirTemp("", "sessionload")
	check(err)
	defer os.RemoveAll(work)
	if *computed == "" {
		*computed = filepath.Join(work, "computed")
		run(exec.Command("go", "build", "-o", *computed, "./cmd/computed"))
	}
	dbURL, drop, err := benchkit.FreshDatabase(ctx, *database, "sessionload")
	check(err)
	defer drop()

	env := append(os.Environ(), "SERVICE_DATABASE_URL="+dbURL, "SERVICE_SECRET="+secret, "SERVICE_PKI="+filepath.Join(work, "pki.json"))
	cmd := exec.Command(*computed, "migrate")
	cmd.Env = env
	run(cmd)
	bundle, _, err := pki.Init(filepath.Join(work, "pki.json"), secret, "bench.local")
	check(err)
	nodes := makeNodes(ctx, dbURL, bundle, *n)

	port, err := benchkit.FreePort()
	check(err)
	cfg := filepath.Join(work, "gateway.yaml")
	check(os.WriteFile(cfg, []byte(fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: bench, listen: \"127.0.0.1:%d\", maxStreams: %d, drainDelayMs: 0}\n",
		port, port, *n+100)), 0o600))
	env = append(env, "SERVICE_CONFIG="+cfg, "SERVICE_ROLES=gateway", "SERVICE_LOG_LEVEL=warn")
	if g := os.Getenv("GATEWAY_GOGC"); g != "" {
		env = append(env, "GOGC="+g)
	}
	if a := os.Getenv("GATEWAY_PPROF"); a != "" {
		env = append(env, "SERVICE_PPROF_ADDR="+a) // profile the first gateway while it holds the sessions
	}
	gw := startGateway(*computed, env, filepath.Join(work, "gateway.log"), port)
	time.Sleep(2 * time.Second)
	before := rssKiB(gw.Process.Pid)

	roots := x509.NewCertPool()
	roots.AddCert(bundle.ServingCA.Cert)
	var welcomed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); nd.hold(port, roots, &welcomed, stop) }()
	}
	cold := waitAll(&welcomed, int64(*n), 120*time.Second)
	log.Printf("%d sessions welcomed in %s", welcomed.Load(), cold)
	time.Sleep(5 * time.Second)
	after := rssKiB(gw.Process.Pid)
	perSession := float64(after-before) / float64(*n)
	if os.Getenv("GATEWAY_PPROF") != "" {
		log.Printf("profile now: go tool pprof http://%s/debug/pprof/heap (waiting 20 s)", os.Getenv("GATEWAY_PPROF"))
		time.Sleep(20 * time.Second)
	}
	log.Printf("gateway RSS %d KiB before, %d KiB with %d idle sessions: %.1f KiB per session", before, after, *n, perSession)

	check(gw.Process.Kill())
	_, _ = gw.Process.Wait()
	restarted := time.Now()
	gw = startGateway(*computed, env, filepath.Join(work, "gateway2.log"), port)
	waitAll(&welcomed, int64(*n), 120*time.Second)
	back := time.Since(restarted)
	final := welcomed.Load()
	log.Printf("%d sessions back %s after the restart", final, back)
	close(stop)
	_ = gw.Process.Signal(syscall.SIGTERM)
	_, _ = gw.Process.Wait()
	wg.Wait()

	section := report(*n, before, after, perSession, cold, back, final)
	fmt.Print(section)
	for _, f := range []string{*out, *notes} {
		check(benchkit.ReplaceSection(f, "## Gateway sessions", section))
	}
}

// node is one daemon of the run: its id and certificate.
type node struct {
	id   string
	cert tls.Certificate
}

// hold keeps one session: dial, hello, welcome, a status every 5 s, and
// on any end a jittered reconnect (50 ms doubling to 1 s).
func (nd *node) hold(port int, roots *x509.CertPool, welcomed *atomic.Int64, stop <-chan struct{}) {
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{nd.cert}}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-stop:
			return
		default:
		}
		if nd.session(port, hc, welcomed, stop) {
			backoff = 50 * time.Millisecond
		}
		time.Sleep(backoff/2 + time.Duration(mathrand.Int64N(int64(backoff))))
		backoff = min(2*backoff, time.Second)
	}
}

func (nd *node) session(port int, hc *http.Client, welcomed *atomic.Int64, stop <-chan struct{}) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	conn, _, err := websocket.Dial(dctx, fmt.Sprintf("wss://127.0.0.1:%d%s", port, agentproto.SessionPath), &websocket.DialOptions{HTTPClient: hc})
	dcancel()
	if err != nil {
		return false
	}
	defer conn.CloseNow()
	send := func(m agentproto.Message) error {
		b, _ := json.Marshal(m)
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		return conn.Write(wctx, websocket.MessageText, b)
	}
	if send(agentproto.Message{Type: agentproto.TypeHello, Hello: &agentproto.Hello{NodeID: nd.id, ProtocolMin: 1, ProtocolMax: 1,
		AgentVersion: "sessionload", Transport: agentproto.TransportMTLS, Inventory: agentproto.Inventory{VCPU: 1, MemoryMiB: 1024, Runtime: "recording"}}}) != nil {
		return false
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, b, err := conn.Read(rctx)
	rcancel()
	if err != nil {
		return false
	}
	if m, err := agentproto.Decode(b); err != nil || m.Type != agentproto.TypeWelcome {
		return false
	}
	welcomed.Add(1)
	defer welcomed.Add(-1)
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				cancel()
				return
			case <-t.C:
				_ = send(agentproto.Message{Type: agentproto.TypeStatus, Status: &agentproto.Status{Instances: []agentproto.InstanceStatus{}}})
			}
		}
	}()
	for {
		if _, _, err := conn.Read(ctx); err != nil {
			return true
		}
	}
}

func waitAll(c *atomic.Int64, n int64, limit time.Duration) time.Duration {
	start := time.Now()
	for c.Load() < n && time.Since(start) < limit {
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// makeNodes writes a site, a pool and n ready nodes, and issues each a
// node certificate.
func makeNodes(ctx context.Context, dbURL string, b *pki.Bundle, n int) []*node {
	conn, err := pgx.Connect(ctx, dbURL)
	check(err)
	defer conn.Close(ctx)
	site, pool := ids.New("site"), ids.New("pool")
	_, err = conn.Exec(ctx, `insert into sites (site_id, tenant_id, kind, region, created_by, idem_request) values ($1, 'bench', 'custom', 'bench', 'sessionload', '{}')`, site)
	check(err)
	_, err = conn.Exec(ctx, `insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		values ($1, 'bench', $2, 'bench', 'vps-host', 'hosted', 'qemu', 'node-daemon', 'sessionload', '{}')`, pool, site)
	check(err)
	nodes := make([]*node, n)
	rows := make([][]any, n)
	for i := range nodes {
		id := ids.New("node")
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		check(err)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		check(err)
		csr, err := x509.ParseCertificateRequest(der)
		check(err)
		cert, err := b.IssueNode(csr, id)
		check(err)
		nodes[i] = &node{id: id, cert: tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}}
		rows[i] = []any{id, pool, site, "host-" + strconv.Itoa(i), "ready", []byte("{}"), 0, 0, 0}
	}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"nodes"},
		[]string{"node_id", "pool_id", "site_id", "hostname", "state", "labels", "cap_vcpu", "cap_memory_mib", "cap_disk_gib"}, pgx.CopyFromRows(rows))
	check(err)
	return nodes
}

func startGateway(bin string, env []string, logPath string, port int) *exec.Cmd {
	logf, err := os.Create(logPath)
	check(err)
	cmd := exec.Command(bin, "serve")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	check(cmd.Start())
	for i := 0; i < 300; i++ {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond); err == nil {
			_ = c.Close()
			return cmd
		}
		time.Sleep(20 * time.Millisecond)
	}
	log.Fatalf("sessionload: the gateway did not listen; see %s", logPath)
	return nil
}

var rssRe = regexp.MustCompile(`VmRSS:\s+(\d+) kB`)

func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	m := rssRe.FindSubmatch(b)
	if m == nil {
		log.Fatal("sessionload: no VmRSS")
	}
	v, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return v
}

// raiseNoFile lifts the open-file limit to its hard limit; the gateway
// child inherits it.
func raiseNoFile(n int) {
	var l syscall.Rlimit
	check(syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l))
	l.Cur = l.Max
	check(syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l))
	if l.Cur < uint64(2*n+100) {
		log.Fatalf("sessionload: the open-file limit %d is too low for %d sessions", l.Cur, n)
	}
}

func report(n int, before, after int64, per float64, cold, back time.Duration, final int64) string {
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	return fmt.Sprintf(`## Gateway sessions

Written by `+"`make bench-sessions`"+` (tools/sessionload) on %s: one gateway process
(computed with the gateway role only) and %d daemon sessions held by the load tool over
mutual TLS 1.3 and WebSocket, each a real node certificate, hello and welcome, and a
status every 5 s; %d cores, %s.

| Figure | Value | Goal |
|---|---:|---|
| gateway RSS before / with %d idle sessions | %d / %d KiB | |
| memory per idle session | %.1f KiB | at most 32 KiB (%s) |
| all %d sessions connected (cold) | %s | |
| all back after SIGKILL and a restart | %s | within 10 s (%s) |

Sessions welcomed at the end: %d of %d. Memory is the process's resident set, so it
counts the Go heap, goroutine stacks (one per session: the handler that reads), the TLS
and WebSocket buffers of each connection and the runtime's own.

`, time.Now().UTC().Format("2006-01-02"), n, runtime.NumCPU(), runtime.Version(), n, before, after, per, verdict(per <= 32),
		n, cold.Round(time.Millisecond), back.Round(time.Millisecond), verdict(back <= 10*time.Second), final, n)
}

func run(cmd *exec.Cmd) {
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil {
		log.Fatalf("sessionload: %s: %v %s", strings.Join(cmd.Args, " "), err, out)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal("sessionload: ", err)
	}
}
