package gateway

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"computeplane/internal/pki"
)

// threadCPU is the calling thread's CPU time: what a handshake costs its
// side, whatever else the machine runs.
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// The pieces of a daemon's handshake on the gateway's side, for choosing
// what to cut (docs/benchmarks-notes.md): x509's verification of a node
// certificate, and whole mutual-TLS handshakes (both sides, in process)
// with each key exchange.
func BenchmarkNodeCertVerify(b *testing.B) {
	bundle, err := pki.Generate("test.local")
	if err != nil {
		b.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	cert := benchNodeCert(b, bundle, key, now)
	roots := x509.NewCertPool()
	roots.AddCert(bundle.NodeCA.Cert)
	b.Run("x509", func(b *testing.B) {
		for b.Loop() {
			if _, err := pki.VerifyNodeCert(cert, roots, x509.NewCertPool(), "test.local", now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		c := newChainCache(chainCacheSize)
		c.add(chainKeyOf([]*x509.Certificate{cert}), roots, []*x509.Certificate{cert}, now)
		for b.Loop() {
			if !c.verified(chainKeyOf([]*x509.Certificate{cert}), roots, now) {
				b.Fatal("not cached")
			}
			if _, err := pki.NodeOf(cert, "test.local"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := x509.ParseCertificate(cert.Raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchNodeCert(b *testing.B, bundle *pki.Bundle, key *ecdsa.PrivateKey, now time.Time) *x509.Certificate {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		b.Fatal(err)
	}
	csr, _ := x509.ParseCertificateRequest(der)
	cert, err := bundle.IssueNode(csr, "node_1")
	if err != nil {
		b.Fatal(err)
	}
	return cert
}

// handshakeConfigs gives the two handshake benchmarks their server and
// client configurations, one pair per key exchange compared: the gateway's
// serving certificate, a node certificate of the node CA, TLS 1.3, client
// certificates asked; session tickets off unless tickets. "ed25519" is
// the default key exchange with an Ed25519 serving certificate (from the
// same P-256 serving CA), as gateway.tls can give one.
func handshakeConfigs(b *testing.B, tickets bool) map[string][2]*tls.Config {
	bundle, err := pki.Generate("test.local")
	if err != nil {
		b.Fatal(err)
	}
	serving, err := bundle.IssueServing([]string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	cert := benchNodeCert(b, bundle, key, time.Now())
	sroots := x509.NewCertPool()
	sroots.AddCert(bundle.ServingCA.Cert)
	edServing := ed25519Serving(b, bundle)
	configs := map[string][2]*tls.Config{}
	for name, curves := range map[string][]tls.CurveID{"X25519MLKEM768": {tls.X25519MLKEM768}, "X25519": {tls.X25519}, "ed25519": {tls.X25519MLKEM768}} {
		served := serving
		if name == "ed25519" {
			served = edServing
		}
		sc := &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAnyClientCert, Certificates: []tls.Certificate{served},
			SessionTicketsDisabled: !tickets, CurvePreferences: curves}
		cc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: sroots, ServerName: "127.0.0.1", CurvePreferences: curves,
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}}}
		if tickets {
			cc.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		}
		configs[name] = [2]*tls.Config{sc, cc}
	}
	return configs
}

// ed25519Serving is a serving certificate for 127.0.0.1 with an Ed25519
// key, issued by the bundle's (P-256) serving CA.
func ed25519Serving(b *testing.B, bundle *pki.Bundle) tls.Certificate {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, bundle.ServingCA.Cert, pub, bundle.ServingCA.Key)
	if err != nil {
		b.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func BenchmarkMutualHandshake(b *testing.B) {
	configs := handshakeConfigs(b, false)
	for _, name := range []string{"X25519MLKEM768", "ed25519", "X25519"} {
		sc, cc := configs[name][0], configs[name][1]
		b.Run(name, func(b *testing.B) {
			var server, client time.Duration // each side's CPU, on a thread of its own
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for b.Loop() {
				c1, c2 := net.Pipe()
				done := make(chan error, 1)
				go func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					t0 := threadCPU()
					err := tls.Server(c2, sc).Handshake()
					server += threadCPU() - t0
					done <- err
				}()
				t0 := threadCPU()
				if err := tls.Client(c1, cc).Handshake(); err != nil {
					b.Fatal(err)
				}
				client += threadCPU() - t0
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				c1.Close()
				c2.Close()
			}
			b.ReportMetric(float64(server.Nanoseconds())/float64(b.N), "server-ns/op")
			b.ReportMetric(float64(client.Nanoseconds())/float64(b.N), "client-ns/op")
		})
	}
}

// BenchmarkResumedHandshake: the server side's CPU per resumed mutual-TLS
// handshake (psk_dhe_ke: the key exchange runs, no certificate signature
// or chain), with each key exchange, for what a resuming session's
// ~0.6 ms is made of (docs/benchmarks-notes.md).
func BenchmarkResumedHandshake(b *testing.B) {
	configs := handshakeConfigs(b, true)
	for _, name := range []string{"X25519MLKEM768", "X25519"} {
		sc, cc := configs[name][0], configs[name][1]
		b.Run(name, func(b *testing.B) {
			// Over loopback TCP: a resumed server writes its ticket in
			// its flight, which a net.Pipe would hold until the client
			// read it.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			// One handshake: the server's CPU, whether it resumed. The
			// client reads a byte the server writes, taking the ticket
			// before it.
			handshake := func() (time.Duration, bool) {
				c1, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer c1.Close()
				c2, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				defer c2.Close()
				done := make(chan error, 1)
				var server time.Duration
				go func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					t0 := threadCPU()
					tc := tls.Server(c2, sc)
					err := tc.Handshake()
					server = threadCPU() - t0
					if err == nil {
						_, err = tc.Write([]byte{1})
					}
					done <- err
				}()
				tc := tls.Client(c1, cc)
				if err := tc.Handshake(); err != nil {
					b.Fatal(err)
				}
				if _, err := tc.Read(make([]byte, 1)); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				return server, tc.ConnectionState().DidResume
			}
			handshake() // the first ticket
			var server time.Duration
			for b.Loop() {
				d, resumed := handshake()
				if !resumed {
					b.Fatal("not resumed")
				}
				server += d
			}
			b.ReportMetric(float64(server.Nanoseconds())/float64(b.N), "server-ns/op")
		})
	}
}

// BenchmarkServingSignature: what an Ed25519 serving key saves a full
// handshake against the P-256 key the gateway issues itself, one of each
// in turn so that both meet the same load: the gateway's CertificateVerify
// signature (sign-ns) and the daemon's verification of it (verify-ns).
func BenchmarkServingSignature(b *testing.B) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	content := make([]byte, 64+33+1+32) // TLS 1.3's signed content: padding, context, separator, transcript hash
	digest := sha256.Sum256(content)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var sign, verify [2]time.Duration
	for b.Loop() {
		t0 := threadCPU()
		sig, err := p256.Sign(rand.Reader, digest[:], crypto.SHA256)
		t1 := threadCPU()
		if err != nil || !ecdsa.VerifyASN1(&p256.PublicKey, digest[:], sig) {
			b.Fatal("P-256", err)
		}
		t2 := threadCPU()
		esig, err := ed.Sign(rand.Reader, content, crypto.Hash(0))
		t3 := threadCPU()
		if err != nil || !ed25519.Verify(ed.Public().(ed25519.PublicKey), content, esig) {
			b.Fatal("Ed25519", err)
		}
		t4 := threadCPU()
		sign[0], verify[0], sign[1], verify[1] = sign[0]+t1-t0, verify[0]+t2-t1, sign[1]+t3-t2, verify[1]+t4-t3
	}
	for i, name := range []string{"p256", "ed25519"} {
		b.ReportMetric(float64(sign[i].Nanoseconds())/float64(b.N), name+"-sign-ns/op")
		b.ReportMetric(float64(verify[i].Nanoseconds())/float64(b.N), name+"-verify-ns/op")
	}
}
