package tunnel

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

func TestFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	big := bytes.Repeat([]byte("x"), MaxFrame)
	require.NoError(t, WriteFrame(&buf, FrameStdin, []byte("hi")))
	require.NoError(t, WriteFrame(&buf, FrameEOF, nil))
	require.NoError(t, WriteFrame(&buf, FrameStdout, big))
	require.Error(t, WriteFrame(&buf, FrameStdout, append(big, 'x')), "a frame beyond MaxFrame is refused")

	// CopyFrame passes frames whole and unread.
	var copied bytes.Buffer
	for range 3 {
		_, err := CopyFrame(&copied, &buf)
		require.NoError(t, err)
	}
	_, err := CopyFrame(&copied, &buf)
	require.ErrorIs(t, err, io.EOF)

	f, err := NextFrame(&copied)
	require.NoError(t, err)
	require.Equal(t, append([]byte{FrameStdin}, "hi"...), f.B)
	f.Release()
	k, p, err := ReadFrame(&copied)
	require.NoError(t, err)
	require.Equal(t, FrameEOF, k)
	require.Empty(t, p)
	f, err = NextFrame(&copied)
	require.NoError(t, err)
	require.Equal(t, FrameStdout, f.B[0])
	require.Equal(t, big, f.B[1:])
	f.Release()

	// A header naming more than MaxFrame is refused before its payload.
	var h [headerLen]byte
	h[0] = FrameStdout
	binary.BigEndian.PutUint32(h[1:], MaxFrame+1)
	_, err = CopyFrame(io.Discard, bytes.NewReader(h[:]))
	require.ErrorContains(t, err, "at most")
	_, err = NextFrame(bytes.NewReader(h[:]))
	require.ErrorContains(t, err, "at most")
}

// A relay holds a frame's buffer only while the frame passes: copying a
// frame allocates nothing of its size (the pool's buffer is reused).
func TestCopyFrameAllocations(t *testing.T) {
	var src bytes.Buffer
	payload := bytes.Repeat([]byte("y"), 32<<10)
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset()
		require.NoError(t, WriteFrame(&src, FrameStdout, payload))
		_, err := CopyFrame(io.Discard, &src)
		require.NoError(t, err)
	})
	require.LessOrEqual(t, allocs, 2.0, "WriteFrame and CopyFrame allocate a header at most, not a frame")
}

func BenchmarkCopyFrame(b *testing.B) {
	payload := bytes.Repeat([]byte("y"), 32<<10)
	var src bytes.Buffer
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		src.Reset()
		_ = WriteFrame(&src, FrameStdout, payload)
		_, _ = CopyFrame(io.Discard, &src)
	}
}

// sessionPair is a daemon session's WebSocket with a Mux at each end, as
// the gateway (client: it opens streams) and the daemon run them: each
// end's read loop feeds its binary messages to its Mux. gatewayMsgs
// records the binary messages the gateway received.
type sessionPair struct {
	gateway, daemon *Mux
	mu              sync.Mutex
	gatewayMsgs     [][]byte
}

func newSessionPair(t testing.TB, accept func(net.Conn), record bool) *sessionPair {
	sp := &sessionPair{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ws.SetReadLimit(-1)
		sp.daemon = NewMux(ws, false, accept)
		for {
			if _, _, err := ReadMessage(ctx, ws, sp.daemon); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	ws.SetReadLimit(-1)
	sp.gateway = NewMux(ws, true, nil)
	go func() {
		for {
			if !record {
				if _, _, err := ReadMessage(ctx, ws, sp.gateway); err != nil {
					return
				}
				continue
			}
			_, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			sp.mu.Lock()
			sp.gatewayMsgs = append(sp.gatewayMsgs, b)
			sp.mu.Unlock()
			if sp.gateway.Feed(b) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { sp.gateway.Close() })
	return sp
}

// Each yamux data frame crosses the session as one WebSocket message, its
// header with its body (Conn.Write), not as two.
func TestMuxSendsDataFramesWhole(t *testing.T) {
	payload := bytes.Repeat([]byte("z"), 20<<10)
	sp := newSessionPair(t, func(st net.Conn) {
		defer st.Close()
		if _, _, err := ReadFrame(st); err != nil {
			return
		}
		for range 10 {
			if WriteFrame(st, FrameStdout, payload) != nil {
				return
			}
		}
	}, true)
	st, err := sp.gateway.Open()
	require.NoError(t, err)
	require.NoError(t, WriteFrame(st, FrameOpen, []byte("{}")))
	for range 10 {
		k, p, err := ReadFrame(st)
		require.NoError(t, err)
		require.Equal(t, FrameStdout, k)
		require.Equal(t, payload, p)
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	data := 0
	for _, h := range sp.gatewayMsgs {
		if len(h) == yamuxHeader && h[1] == 0 && binary.BigEndian.Uint32(h[8:]) > 0 {
			t.Fatalf("a data frame's header came alone (%x)", h)
		}
		if len(h) > yamuxHeader && h[1] == 0 {
			require.Equal(t, len(h)-yamuxHeader, int(binary.BigEndian.Uint32(h[8:])), "a message is one data frame, header and body")
			data++
		}
	}
	require.Positive(t, data)
}

// BenchmarkMuxThroughput is one tunnel's stream from the daemon to the
// gateway through the session's WebSocket (loopback), frames of 32 KiB
// (a guest's output chunk) copied on by the gateway as it relays them.
func BenchmarkMuxThroughput(b *testing.B) {
	payload := bytes.Repeat([]byte("z"), 32<<10)
	sp := newSessionPair(b, func(st net.Conn) {
		defer st.Close()
		for {
			if _, _, err := ReadFrame(st); err != nil {
				return
			}
			if WriteFrame(st, FrameStdout, payload) != nil {
				return
			}
		}
	}, false)
	st, err := sp.gateway.Open()
	require.NoError(b, err)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	// 8 frames asked for at a time, so the window, not the asking, paces it.
	const ahead = 8
	for range ahead {
		require.NoError(b, WriteFrame(st, FrameStdin, nil))
	}
	start := time.Now()
	n := 0
	for b.Loop() {
		_, err := CopyFrame(io.Discard, st)
		require.NoError(b, err)
		require.NoError(b, WriteFrame(st, FrameStdin, nil))
		n++
	}
	b.ReportMetric(float64(n*len(payload))/(1<<20)/time.Since(start).Seconds(), "MiB/s")
}
