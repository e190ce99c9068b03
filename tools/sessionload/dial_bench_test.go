package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent"
	"computeplane/internal/agentproto"
)

// BenchmarkClientSide measures this process's CPU per session set up
// (dial, handshake, upgrade, hello, an answer, a status), the daemons'
// side only: the server is another process (this test binary again), so
// its CPU is not counted. The two ways alternate every dial, so that a
// loaded machine weighs on both alike: "transport" is the daemon's dial
// (net/http's Transport, a context per step, a status encoded per write,
// as this tool did before), "tool" is dial() with its deadlines and the
// encoded status. Each with a full handshake and resuming.
//
//	go test -run '^$' -bench ClientSide -benchtime 2000x ./tools/sessionload
func BenchmarkClientSide(b *testing.B) {
	srv := exec.Command(os.Args[0], "-test.run=^TestHelperServer$")
	srv.Env = append(os.Environ(), "SESSIONLOAD_HELPER_SERVER=1")
	out, err := srv.StdoutPipe()
	require.NoError(b, err)
	srv.Stderr = os.Stderr
	require.NoError(b, srv.Start())
	b.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	var hello struct{ Addr, CA string }
	require.NoError(b, json.NewDecoder(bufio.NewReader(out)).Decode(&hello))
	roots := x509.NewCertPool()
	require.True(b, roots.AppendCertsFromPEM([]byte(hello.CA)))
	cert := selfSigned(b)
	config := func() *tls.Config {
		return agent.MTLSConfig(roots, "127.0.0.1", func() *tls.Certificate { return &cert }, tls.NewLRUClientSessionCache(agent.TicketCacheSize))
	}
	helloFrame := mustJSON(agentproto.Message{Type: agentproto.TypeHello, Hello: &agentproto.Hello{NodeID: "node_bench"}})
	status := agentproto.Message{Type: agentproto.TypeStatus, Status: &agentproto.Status{Instances: []agentproto.InstanceStatus{}}}

	daemon := func(tc *tls.Config) error {
		ctx, cancel := context.WithTimeout(context.Background(), agent.DialTimeout)
		defer cancel()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: false}}
		conn, _, err := websocket.Dial(ctx, "wss://"+hello.Addr+agentproto.SessionPath, &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			return err
		}
		defer conn.CloseNow()
		send := func(m any) error {
			b, _ := json.Marshal(m)
			wctx, wcancel := context.WithTimeout(ctx, agent.WriteTimeout)
			defer wcancel()
			return conn.Write(wctx, websocket.MessageText, b)
		}
		if err := send(json.RawMessage(helloFrame)); err != nil {
			return err
		}
		rctx, rcancel := context.WithTimeout(ctx, agent.HelloTimeout)
		_, _, err = conn.Read(rctx)
		rcancel()
		if err != nil {
			return err
		}
		return send(status)
	}
	tool := func(tc *tls.Config) error {
		conn, raw, err := dial(hello.Addr, tc)
		if err != nil {
			return err
		}
		defer conn.CloseNow()
		bg := context.Background()
		if err := conn.Write(bg, websocket.MessageText, helloFrame); err != nil {
			return err
		}
		if _, _, err := conn.Read(bg); err != nil {
			return err
		}
		_ = raw.SetDeadline(time.Time{})
		_ = raw.SetWriteDeadline(time.Now().Add(agent.WriteTimeout))
		return conn.Write(bg, websocket.MessageText, statusFrame)
	}

	for _, resume := range []bool{false, true} {
		name := "full"
		if resume {
			name = "resumed"
		}
		b.Run(name, func(b *testing.B) {
			ways := []struct {
				name string
				dial func(*tls.Config) error
				tc   *tls.Config
				cpu  time.Duration
			}{{name: "transport", dial: daemon, tc: config()}, {name: "tool", dial: tool, tc: config()}}
			for i := range ways {
				require.NoError(b, ways[i].dial(ways[i].tc)) // a ticket in the cache
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w := &ways[i%2]
				if !resume {
					w.tc = config()
				}
				before := selfCPU()
				require.NoError(b, w.dial(w.tc))
				w.cpu += selfCPU() - before
			}
			for _, w := range ways {
				b.ReportMetric(float64(w.cpu.Microseconds())/float64(max(b.N/2, 1)), "µs-cpu/"+w.name)
			}
		})
	}
}

// TestHelperServer is BenchmarkClientSide's server, run in a process of
// its own: mutual TLS 1.3 with tickets, the upgrade, an answer to the
// hello, and the status read. Skipped unless the benchmark starts it.
func TestHelperServer(t *testing.T) {
	if os.Getenv("SESSIONLOAD_HELPER_SERVER") == "" {
		t.Skip("BenchmarkClientSide's server")
	}
	cert := selfSigned(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert})
	require.NoError(t, err)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	require.NoError(t, json.NewEncoder(os.Stdout).Encode(map[string]string{"Addr": ln.Addr().String(), "CA": string(ca)}))
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
		if c.Write(ctx, websocket.MessageText, []byte(`{"type":"welcome"}`)) != nil {
			return
		}
		_, _, _ = c.Read(ctx)
	}))
}

func selfSigned(t testing.TB) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, BasicConstraintsValid: true, IsCA: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}
