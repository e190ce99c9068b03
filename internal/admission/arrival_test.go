package admission

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The arrival is when the kernel received the request's first bytes, not
// when the server got round to reading them: bytes left 100 ms in the
// socket before the read count those 100 ms. A kernel that gives TCP no
// receive timestamps (gVisor, where this machine's tests run) leaves the
// time of the read, which the test then checks instead.
func TestArrivalIsTheKernelsReceiveTime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	aln := ArrivalListener(ln)
	defer aln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	sc, err := aln.Accept()
	require.NoError(t, err)
	defer sc.Close()
	ac, ok := sc.(*ArrivalConn)
	require.True(t, ok)
	require.NotNil(t, ac.raw, "SO_TIMESTAMPNS is set")
	ctx := ArrivalContext(context.Background(), sc)

	for round := range 3 { // the later requests come after an answer
		sent := time.Now()
		_, err = client.Write([]byte("first request"))
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond) // queued in the socket
		buf := make([]byte, 64)
		read := time.Now()
		n, err := sc.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, "first request", string(buf[:n]))
		now := time.Now()
		at := Arrived(ctx, now)
		// Linux turns receive timestamps on lazily (a static key flipped
		// by a worker), so the first segments may come without one.
		kernel := at.Before(read)
		t.Logf("round %d: kernel receive timestamp: %v (arrival %v after sending)", round, kernel, at.Sub(sent))
		if kernel {
			assert.WithinDuration(t, sent, at, 50*time.Millisecond, "round %d", round)
			assert.GreaterOrEqual(t, now.Sub(at), 90*time.Millisecond)
		} else {
			assert.False(t, at.After(now), "round %d", round)
		}
		// Taken once: the next call on the connection without new bytes
		// read is timed from now.
		assert.Equal(t, now, Arrived(ctx, now))
		// Bytes read before the answer (the rest of a body) are no arrival.
		_, err = client.Write([]byte("more"))
		require.NoError(t, err)
		_, err = sc.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, now, Arrived(ctx, now))
		_, err = sc.Write([]byte("answer"))
		require.NoError(t, err)
		_, err = client.Read(buf)
		require.NoError(t, err)
	}
	// The peer's close reads as EOF; a context without an arrival
	// connection gives now.
	require.NoError(t, client.Close())
	_, err = sc.Read(make([]byte, 8))
	assert.ErrorIs(t, err, io.EOF)
	now := time.Now()
	assert.Equal(t, now, Arrived(context.Background(), now))
}

// Through net/http: a read deadline, EOF and keep-alive behave as on a
// plain connection, and each request on a kept-alive connection has its
// own arrival.
func TestArrivalThroughNetHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var waits []time.Duration
	srv := &http.Server{
		ReadHeaderTimeout: time.Second, IdleTimeout: time.Second, ConnContext: ArrivalContext,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			now := time.Now()
			mu.Lock()
			waits = append(waits, now.Sub(Arrived(r.Context(), now)))
			mu.Unlock()
			_, _ = w.Write([]byte("ok"))
		}),
	}
	go func() { _ = srv.Serve(ArrivalListener(ln)) }()
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	for range 5 {
		resp, err := client.Get("http://" + ln.Addr().String() + "/")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, waits, 5)
	for _, w := range waits {
		assert.Positive(t, w, "each request timed from its own arrival")
		assert.Less(t, w, time.Second)
	}
}

// Calls that queued before admission do not move the adaptive limit:
// that queue is the wait check's (queue.go); the limit follows the wait
// for a database connection alone, which those calls did not have.
func TestQueueBeforeAdmissionLeavesTheLimit(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{MaxInFlight: 64, Adaptive: true, MinInFlight: 4})
	c.now = func() time.Time { return now }
	for range 40 { // 40 intervals of 40 calls that queued 20 ms, handlers of 1 ms
		var tks []Ticket
		for range 40 {
			tk, err := c.EnterAt(now.Add(-20 * time.Millisecond))
			require.NoError(t, err)
			tks = append(tks, tk)
			c.Acquired(0)
		}
		now = now.Add(time.Millisecond)
		for _, tk := range tks {
			c.Leave(tk)
		}
		now = now.Add(100 * time.Millisecond)
	}
	assert.Equal(t, 64, c.Limit())
}

// The early path's wait check (CheckWaitOf) judges a call's wait once:
// it takes the arrival, refuses a late call while a share is refused,
// and marks a call it lets through as checked, so that the envelope
// admits it with EnterChecked (ArrivedChecked) instead of judging it
// again with EnterAt.
func TestCheckWaitOfJudgesTheWaitOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{QueueTarget: 5 * time.Millisecond})
	c.now = func() time.Time { return now }
	c.queue = newQueueCheck(5*time.Millisecond, DefaultQueueInterval, now)
	c.queue.share = 1
	held, err := c.EnterAt(now) // something in flight: late calls may be refused
	require.NoError(t, err)

	ac := &ArrivalConn{}
	ctx := ArrivalContext(t.Context(), ac)
	ac.arrived.Store(now.Add(-50 * time.Millisecond).UnixNano())
	se, refused := CheckWaitOf(ctx, c, now)
	require.True(t, refused, "waited 50 ms, a share of 1")
	requireLimited(t, se, InFlightRetryAfter.Milliseconds())
	_, checked := ArrivedChecked(ctx, now)
	assert.False(t, checked, "a refused call is not marked")

	arrived := now.Add(-2 * time.Millisecond)
	ac.arrived.Store(arrived.UnixNano())
	_, refused = CheckWaitOf(ctx, c, now)
	require.False(t, refused, "within the target")
	got, checked := ArrivedChecked(ctx, now)
	assert.True(t, checked)
	assert.Equal(t, arrived, got)
	got, checked = ArrivedChecked(ctx, now)
	assert.False(t, checked, "once")
	assert.Equal(t, now, got)

	// A request whose arrival was not recorded goes on unjudged.
	_, refused = CheckWaitOf(ctx, c, now)
	assert.False(t, refused)
	// Nor does anything happen with the check off.
	ac.arrived.Store(now.Add(-time.Second).UnixNano())
	_, refused = CheckWaitOf(ctx, New(Limits{MaxInFlight: 4}), now)
	assert.False(t, refused)
	c.Leave(held)
}

// timestampNS finds the kernel's timestamp among control messages in
// place, without allocating, and gives 0 for none or a truncated buffer.
func TestTimestampNSParsesInPlace(t *testing.T) {
	ts := syscall.Timespec{Sec: 1000, Nsec: 42}
	msg := make([]byte, syscall.CmsgSpace(int(unsafe.Sizeof(ts))))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&msg[0]))
	h.Level, h.Type = syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS
	h.SetLen(syscall.CmsgLen(int(unsafe.Sizeof(ts))))
	*(*syscall.Timespec)(unsafe.Pointer(&msg[syscall.CmsgLen(0)])) = ts
	oob := append(syscall.UnixRights(3), msg...) // another message first

	assert.Equal(t, ts.Nano(), timestampNS(oob))
	assert.Zero(t, timestampNS(syscall.UnixRights(3)), "none")
	assert.Zero(t, timestampNS(oob[:len(oob)-4]), "truncated")
	assert.Zero(t, timestampNS(nil))
	assert.Zero(t, testing.AllocsPerRun(100, func() { timestampNS(oob) }))
}

// FuzzTimestampNS: the in-place walk of control messages never panics nor
// reads past its input, and where the standard library parses the input it
// finds the same timestamp (the first SCM_TIMESTAMPNS, or none).
func FuzzTimestampNS(f *testing.F) {
	ts := syscall.Timespec{Sec: 1000, Nsec: 42}
	msg := make([]byte, syscall.CmsgSpace(int(unsafe.Sizeof(ts))))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&msg[0]))
	h.Level, h.Type = syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS
	h.SetLen(syscall.CmsgLen(int(unsafe.Sizeof(ts))))
	*(*syscall.Timespec)(unsafe.Pointer(&msg[syscall.CmsgLen(0)])) = ts
	f.Add(msg)
	f.Add(append(syscall.UnixRights(3), msg...))
	f.Add(syscall.UnixRights(3, 4))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, oob []byte) {
		got := timestampNS(oob)
		msgs, err := syscall.ParseSocketControlMessage(oob)
		if err != nil {
			return // malformed: the walk stops at the bad header, no reference to compare
		}
		var want int64
		for _, m := range msgs {
			if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
				want = (*syscall.Timespec)(unsafe.Pointer(&m.Data[0])).Nano()
				break
			}
		}
		if got != want {
			t.Fatalf("timestampNS = %d, the standard parser's first timestamp %d", got, want)
		}
	})
}
