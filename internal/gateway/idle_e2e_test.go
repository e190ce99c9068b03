package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

// rawSession is a daemon session spoken frame by frame over crypto/tls, so
// that a test decides how frames fall into TLS records and TCP writes.
type rawSession struct {
	tc *tls.Conn
	br *bufio.Reader
}

// textFrame is a masked client text frame carrying m.
func textFrame(t testing.TB, m agentproto.Message) []byte {
	t.Helper()
	p, err := json.Marshal(m)
	require.NoError(t, err)
	var f bytes.Buffer
	f.WriteByte(0x81) // FIN, text
	switch {
	case len(p) < 126:
		f.WriteByte(0x80 | byte(len(p)))
	case len(p) <= 0xffff:
		f.WriteByte(0x80 | 126)
		_ = binary.Write(&f, binary.BigEndian, uint16(len(p)))
	default:
		f.WriteByte(0x80 | 127)
		_ = binary.Write(&f, binary.BigEndian, uint64(len(p)))
	}
	mask := [4]byte{byte(rand.Uint32()), 7, byte(len(p)), 42}
	f.Write(mask[:])
	for i, c := range p {
		f.WriteByte(c ^ mask[i%4])
	}
	return f.Bytes()
}

// readFrame reads one unmasked server frame's message.
func (r *rawSession) readFrame() (agentproto.Message, error) {
	var h [2]byte
	if _, err := io.ReadFull(r.br, h[:]); err != nil {
		return agentproto.Message{}, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l uint16
		if err := binary.Read(r.br, binary.BigEndian, &l); err != nil {
			return agentproto.Message{}, err
		}
		n = uint64(l)
	case 127:
		if err := binary.Read(r.br, binary.BigEndian, &n); err != nil {
			return agentproto.Message{}, err
		}
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r.br, p); err != nil {
		return agentproto.Message{}, err
	}
	if h[0]&0x0f != 1 {
		return agentproto.Message{}, fmt.Errorf("frame opcode %d", h[0]&0x0f)
	}
	return agentproto.Decode(p)
}

// dialRaw opens a session for n; with pipelined, the hello goes in the
// same write as the upgrade request.
func (w *world) dialRaw(t testing.TB, n joined, pipelined bool) *rawSession {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(w.bundle.ServingCA.Cert)
	tc, err := tls.Dial("tcp", strings.TrimPrefix(w.gwURL, "https://"), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{n.cert.Raw}, PrivateKey: n.key, Leaf: n.cert}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })
	require.NoError(t, tc.SetDeadline(time.Now().Add(30*time.Second)))
	upgrade := "GET " + agentproto.SessionPath + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	hi := textFrame(t, hello(n.nodeID, 0))
	if pipelined {
		_, err = tc.Write(append([]byte(upgrade), hi...))
	} else {
		_, err = tc.Write([]byte(upgrade))
	}
	require.NoError(t, err)
	r := &rawSession{tc: tc, br: bufio.NewReader(tc)}
	resp, err := http.ReadResponse(r.br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	if !pipelined {
		_, err = tc.Write(hi)
		require.NoError(t, err)
	}
	m, err := r.readFrame()
	require.NoError(t, err)
	require.Equal(t, agentproto.TypeWelcome, m.Type, "%+v", m.Error)
	require.NoError(t, tc.SetDeadline(time.Time{}))
	return r
}

// An idle session's reader waits on its socket at a shallow depth (2 KiB
// of stack, not the 8 KiB of a wait inside the frame read), and no
// message is left waiting above the socket meanwhile: however frames fall
// into TLS records and TCP writes (several messages in one record, one
// message over several records and writes, the hello in the upgrade's
// write), every message is answered. Not parallel: it counts the
// process's goroutines.
func TestIdleSessionsWaitOnTheSocketAndLoseNoMessage(t *testing.T) {
	w := setup(t)
	const sessions = 40
	nodes := make([]joined, sessions)
	for i := range nodes {
		nodes[i] = w.newNode(t)
	}
	g0 := runtime.NumGoroutine() - w.gw.KeptGoroutines()
	raws := make([]*rawSession, sessions)
	for i, n := range nodes {
		raws[i] = w.dialRaw(t, n, i%2 == 0)
	}
	// Where each session's reader is parked: on the socket (the idle
	// wait's few frames, which the runtime's initial 2 KiB stack holds) or
	// inside the frame read (5 KiB deep: an 8 KiB stack).
	parkedOnSockets := func() {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			buf := make([]byte, 8<<20)
			dump := string(buf[:runtime.Stack(buf, true)])
			var readers, onSocket int
			for _, g := range strings.Split(dump, "\n\n") {
				if strings.Contains(g, "gateway.(*session).readLoop") {
					readers++
					if strings.Contains(g, "gateway.(*idleWait).wait") && !strings.Contains(g, "websocket") {
						onSocket++
					}
				}
			}
			assert.Equal(c, sessions, readers, "a reader per session")
			assert.Equal(c, sessions, onSocket, "every idle reader waits on its socket")
		}, 10*time.Second, 100*time.Millisecond)
	}
	parkedOnSockets()
	// The gateway's kept goroutines (handshakes, bursts: bounded, and
	// more of them when handshakes overlap on a loaded machine) are not
	// the sessions'.
	assert.InDelta(t, sessions, runtime.NumGoroutine()-g0-w.gw.KeptGoroutines(), sessions/4, "one goroutine per session")

	var wg sync.WaitGroup
	for i, r := range raws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for round := range 15 {
				want := map[string]bool{}
				var out []byte
				var ends []int // where each message ends in out
				for k := range 1 + rng.IntN(4) {
					id := fmt.Sprintf("r%d-%d-%d", i, round, k)
					want[id] = true
					refs := make([]string, rng.IntN(60)) // up to about 4 KiB of message
					for j := range refs {
						refs[j] = fmt.Sprintf("secret://acme/s%d-%064d", j, j)
					}
					out = append(out, textFrame(t, agentproto.Message{Type: agentproto.TypeResolve,
						Resolve: &agentproto.Resolve{ID: id, InstanceID: "i-missing", References: refs}})...)
					ends = append(ends, len(out))
				}
				// One write (one record when under 16 KiB); or a write
				// (a record) per message, back to back, so that crypto/tls
				// may read the next record with the one that ends a message;
				// or cut at random points into writes a little apart.
				var writes [][]byte
				switch rng.IntN(3) {
				case 0:
					writes = [][]byte{out}
				case 1:
					from := 0
					for _, e := range ends {
						writes = append(writes, out[from:e])
						from = e
					}
				default:
					for range rng.IntN(4) {
						if len(out) < 2 {
							break
						}
						at := 1 + rng.IntN(len(out)-1)
						writes = append(writes, out[:at])
						out = out[at:]
					}
					writes = append(writes, out)
				}
				for j, b := range writes {
					if _, err := r.tc.Write(b); !assert.NoError(t, err) {
						return
					}
					if j < len(writes)-1 && len(writes) != len(ends) {
						time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					}
				}
				_ = r.tc.SetReadDeadline(time.Now().Add(20 * time.Second))
				for len(want) > 0 {
					m, err := r.readFrame()
					if !assert.NoError(t, err, "session %d round %d: %d answers missing", i, round, len(want)) {
						return
					}
					if m.Type == agentproto.TypeResolved {
						assert.True(t, want[m.Resolved.ID], "an answer to %s", m.Resolved.ID)
						delete(want, m.Resolved.ID)
					}
				}
				// Idle a moment now and then, so the next round finds the
				// reader waiting on the socket.
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	parkedOnSockets() // after bursts of every shape, back on the socket
}
