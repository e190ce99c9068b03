package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/guestproto"
)

// port is the host's end of an in-memory port.
type port struct {
	w    io.WriteCloser
	rd   *guestproto.Reader // JSON lines and output frames, as the host reads
	zero *atomic.Bool       // a zero byte came: an output frame's marker
}

// zeroSpy notes a zero byte in what passes.
type zeroSpy struct {
	r    io.Reader
	zero *atomic.Bool
}

func (z zeroSpy) Read(b []byte) (int, error) {
	n, err := z.r.Read(b)
	if bytes.IndexByte(b[:n], 0) >= 0 {
		z.zero.Store(true)
	}
	return n, err
}

func (p *port) call(t *testing.T, r guestproto.Request) guestproto.Response {
	t.Helper()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	_, err = p.w.Write(append(b, '\n'))
	require.NoError(t, err)
	return p.next(t)
}

func (p *port) next(t *testing.T) guestproto.Response {
	t.Helper()
	resp, err := p.rd.Next()
	require.NoError(t, err, "a response")
	return resp
}

type pipePort struct {
	io.Reader
	io.Writer
}

func serve(t *testing.T) (*port, *Agent) {
	t.Helper()
	a := NewAgent(slog.New(slog.DiscardHandler))
	a.Root = t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(a.Root, "tmp"), 0o755))
	hostR, guestW := io.Pipe()
	guestR, hostW := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Serve(context.Background(), pipePort{guestR, guestW})
	}()
	t.Cleanup(func() { _ = hostW.Close(); <-done })
	zero := new(atomic.Bool)
	return &port{w: hostW, rd: guestproto.NewReader(zeroSpy{hostR, zero}), zero: zero}, a
}

func TestReadyThenRequests(t *testing.T) {
	p, _ := serve(t)
	ready := p.next(t)
	require.NotNil(t, ready.Ready)
	assert.NotEmpty(t, ready.Ready.BootID)

	r := p.call(t, guestproto.Request{ID: 1, Op: guestproto.OpExec, Exec: &guestproto.Exec{
		Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; echo $FOO; exit 3"}, Env: map[string]string{"FOO": "bar"}}})
	require.True(t, r.OK, r.Error)
	assert.Equal(t, uint64(1), r.ID)
	assert.Equal(t, 3, r.Exec.ExitCode)
	assert.Equal(t, "out\nbar\n", string(r.Exec.Stdout))
	assert.Equal(t, "err\n", string(r.Exec.Stderr))

	r = p.call(t, guestproto.Request{ID: 2, Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sleep", "10"}, TimeoutMs: 100}})
	require.True(t, r.OK, r.Error)
	assert.True(t, r.Exec.TimedOut)
	assert.Less(t, r.Exec.DurationMs, int64(5000))

	r = p.call(t, guestproto.Request{ID: 3, Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", "head -c 2000000 /dev/zero"}}})
	require.True(t, r.OK, r.Error)
	assert.True(t, r.Exec.Truncated)
	assert.Len(t, r.Exec.Stdout, guestproto.MaxOutputBytes)

	r = p.call(t, guestproto.Request{ID: 4, Op: guestproto.OpWriteFile, File: &guestproto.File{Path: "/work/a.txt", Data: []byte("hello")}})
	require.True(t, r.OK, r.Error)
	r = p.call(t, guestproto.Request{ID: 5, Op: guestproto.OpReadFile, File: &guestproto.File{Path: "/work/a.txt"}})
	require.True(t, r.OK, r.Error)
	assert.Equal(t, "hello", string(r.Data))
	r = p.call(t, guestproto.Request{ID: 6, Op: guestproto.OpReadFile, File: &guestproto.File{Path: "/work/missing"}})
	assert.False(t, r.OK)

	r = p.call(t, guestproto.Request{ID: 7, Op: guestproto.OpIdentity, Identity: &guestproto.Identity{Hostname: "sbx-1", Env: map[string]string{"TOKEN": "t1"}}})
	require.True(t, r.OK, r.Error)
	assert.Equal(t, "sbx-1", r.Status.Hostname)
	assert.NotEmpty(t, r.Status.MachineID, "a fresh machine id when none is given")
	assert.True(t, r.Status.RootOK)
	r = p.call(t, guestproto.Request{ID: 8, Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", "echo $TOKEN $HOSTNAME"}}})
	assert.Equal(t, "t1 sbx-1\n", string(r.Exec.Stdout), "the identity's env reaches commands")

	r = p.call(t, guestproto.Request{ID: 9, Op: "format-disk"})
	assert.False(t, r.OK)
	assert.Contains(t, r.Error, "unknown op")
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"id":1,"op":"exec","exec":{"argv":["/bin/true"]}}`))
	f.Add([]byte(`{"id":2,"op":"readFile","file":{"path":"/etc/hostname"}}`))
	f.Add([]byte(`{"id":3,"op":"mount","mount":{"serial":"v1","path":"/data"}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := guestproto.DecodeRequest(line)
		if err != nil {
			return
		}
		// What decodes is complete for its operation.
		switch r.Op {
		case guestproto.OpExec:
			require.NotEmpty(t, r.Exec.Argv)
		case guestproto.OpReadFile, guestproto.OpWriteFile:
			require.Equal(t, byte('/'), r.File.Path[0])
		case guestproto.OpMount:
			require.NotEmpty(t, r.Mount.Serial)
		}
		require.NotZero(t, r.ID)
	})
}

// Module lines load under their conditions, read from sysfs.
func TestModuleWanted(t *testing.T) {
	sys := t.TempDir()
	assert.True(t, moduleWanted(sys, ""), "no condition")
	assert.True(t, moduleWanted(sys, "later"), "a condition this version does not know")
	assert.False(t, moduleWanted(sys, "pci"), "no PCI bus (microvm)")
	assert.False(t, moduleWanted(sys, "virtio:1"), "no virtio device yet")

	require.NoError(t, os.MkdirAll(filepath.Join(sys, "bus/pci/devices/0000:00:00.0"), 0o755))
	assert.True(t, moduleWanted(sys, "pci"))
	console := filepath.Join(sys, "bus/virtio/devices/virtio0")
	require.NoError(t, os.MkdirAll(console, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(console, "device"), []byte("0x0003\n"), 0o644))
	assert.False(t, moduleWanted(sys, "virtio:1"), "a console is not a network card")
	net := filepath.Join(sys, "bus/virtio/devices/virtio1")
	require.NoError(t, os.MkdirAll(net, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(net, "device"), []byte("0x0001\n"), 0o644))
	assert.True(t, moduleWanted(sys, "virtio:1"))
}

// A command that leaves a process running in the background answers with
// its output and exit code as soon as it exits, and the process goes on
// (and may keep writing to the output it inherited).
func TestExecLeavesABackgroundProcessRunning(t *testing.T) {
	p, _ := serve(t)
	p.next(t) // ready
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `(sleep 0.1; while :; do echo tick; sleep 0.05; done) & echo $! > ` + pidFile + `; echo started; echo warn >&2; exit 4`
	start := time.Now()
	r := p.call(t, guestproto.Request{ID: 1, Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", script}}})
	require.True(t, r.OK, r.Error)
	assert.Less(t, time.Since(start), 900*time.Millisecond, "not after a WaitDelay")
	assert.Equal(t, 4, r.Exec.ExitCode)
	assert.True(t, strings.HasPrefix(string(r.Exec.Stdout), "started\n"), "%q", r.Exec.Stdout)
	assert.Equal(t, "warn\n", string(r.Exec.Stderr))
	assert.False(t, r.Exec.TimedOut)

	raw, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	time.Sleep(300 * time.Millisecond) // it writes to its inherited stdout meanwhile
	require.NoError(t, syscall.Kill(pid, 0), "the background process still runs")

	// The same with exit 0 and stdin given.
	r = p.call(t, guestproto.Request{ID: 2, Op: guestproto.OpExec, Exec: &guestproto.Exec{
		Argv: []string{"/bin/sh", "-c", "sleep 5 & cat"}, Stdin: []byte("in")}})
	require.True(t, r.OK, r.Error)
	assert.Equal(t, 0, r.Exec.ExitCode)
	assert.Equal(t, "in", string(r.Exec.Stdout))
}

// streamed collects a started program's responses.
type streamed struct {
	t   *testing.T
	p   *port
	out strings.Builder
	end *guestproto.Response
	n   uint64
}

func (p *port) send(t *testing.T, r guestproto.Request) {
	t.Helper()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	_, err = p.w.Write(append(b, '\n'))
	require.NoError(t, err)
}

// until reads responses (acking output, collecting it) until the output
// holds want or the program ends ("": until it ends); the answers to
// inputs are checked.
func (s *streamed) until(want string) {
	s.t.Helper()
	deadline := time.AfterFunc(15*time.Second, func() { panic(fmt.Sprintf("no %q in %q", want, s.out.String())) })
	defer deadline.Stop()
	for (want == "" || !strings.Contains(s.out.String(), want)) && s.end == nil {
		s.read()
	}
	if want != "" {
		require.Contains(s.t, s.out.String(), want)
	}
}

// read takes one response and returns it.
func (s *streamed) read() guestproto.Response {
	r := s.p.next(s.t)
	switch {
	case r.ID == 1 && r.Output != nil:
		s.out.Write(r.Output.Data)
		s.n++
		s.p.send(s.t, guestproto.Request{ID: 1000 + s.n, Op: guestproto.OpInput, Input: &guestproto.Input{Proc: 1, Ack: int64(len(r.Output.Data))}})
	case r.ID == 1:
		s.end = &r
	}
	return r
}

// serveStreams is serve, its ready event read, and the answers left
// unread at the end discarded (so the agent can finish).
func serveStreams(t *testing.T) *port {
	p, _ := serve(t)
	require.NotNil(t, p.next(t).Ready)
	t.Cleanup(func() {
		go func() {
			for {
				if _, err := p.rd.Next(); err != nil {
					return
				}
			}
		}()
	})
	return p
}

// input sends an input and returns its answer (as the host does, one at
// a time: the guest handles requests concurrently).
func (s *streamed) input(in guestproto.Input) guestproto.Response {
	s.n++
	in.Proc = 1
	id := 1000 + s.n
	s.p.send(s.t, guestproto.Request{ID: id, Op: guestproto.OpInput, Input: &in})
	for {
		if r := s.read(); r.ID == id {
			return r
		}
	}
}

func TestStartOnATerminal(t *testing.T) {
	p := serveStreams(t)
	p.send(t, guestproto.Request{ID: 1, Op: guestproto.OpStart, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-i"}, TTY: true,
		Size: &guestproto.Size{Cols: 100, Rows: 30}}})
	s := &streamed{t: t, p: p}
	s.input(guestproto.Input{Data: []byte("tty; echo term=$TERM; stty size\n")})
	s.until("30 100")
	assert.Contains(t, s.out.String(), "/dev/pts/")
	assert.Contains(t, s.out.String(), "term=xterm-256color")

	s.input(guestproto.Input{Resize: &guestproto.Size{Cols: 132, Rows: 43}})
	s.input(guestproto.Input{Data: []byte("stty size\n")})
	s.until("43 132")

	// Ctrl-C typed as a byte interrupts the foreground job; a signal
	// frame does too.
	s.input(guestproto.Input{Data: []byte("sleep 100\n")})
	time.Sleep(300 * time.Millisecond)
	s.input(guestproto.Input{Data: []byte{3}})
	s.input(guestproto.Input{Data: []byte("echo after-$?\n")})
	s.until("after-130")
	s.input(guestproto.Input{Data: []byte("sleep 100\n")})
	time.Sleep(300 * time.Millisecond)
	s.input(guestproto.Input{Signal: "INT"})
	s.input(guestproto.Input{Data: []byte("echo again-$?\n")})
	s.until("again-130")

	s.input(guestproto.Input{Data: []byte("exit 3\n")})
	s.until("")
	require.NotNil(t, s.end)
	require.True(t, s.end.OK, s.end.Error)
	assert.Equal(t, 3, s.end.Exec.ExitCode)
}

func TestStartSignalledWithoutATerminal(t *testing.T) {
	p := serveStreams(t)
	p.send(t, guestproto.Request{ID: 1, Op: guestproto.OpStart, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", "echo up; exec sleep 100"}}})
	s := &streamed{t: t, p: p}
	s.until("up\n")
	r := s.input(guestproto.Input{Resize: &guestproto.Size{Cols: 1, Rows: 1}})
	assert.Contains(t, r.Error, "no terminal")
	s.input(guestproto.Input{Signal: "TERM"})
	s.until("")
	require.True(t, s.end.OK, s.end.Error)
	assert.Equal(t, 128+15, s.end.Exec.ExitCode)
}

func TestDialAGuestPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c) // until the half close
			_, _ = c.Write(append([]byte("echo:"), b...))
			c.Close()
		}
	}()
	// Output as JSON lines, and as binary frames when the host asks: a
	// raw zero byte is only ever a frame's marker (JSON escapes it).
	var p *port
	for _, binary := range []bool{false, true} {
		p = serveStreams(t)
		p.send(t, guestproto.Request{ID: 1, Op: guestproto.OpDial, Dial: &guestproto.Dial{Port: l.Addr().(*net.TCPAddr).Port}, BinaryOutput: binary})
		s := &streamed{t: t, p: p}
		s.input(guestproto.Input{Data: []byte("ping")})
		s.input(guestproto.Input{EOF: true})
		s.until("")
		assert.Equal(t, "echo:ping", s.out.String())
		require.True(t, s.end.OK, s.end.Error)
		assert.Equal(t, binary, p.zero.Load(), "frames when asked for")
	}

	// A closed port is an error at once.
	p.send(t, guestproto.Request{ID: 1, Op: guestproto.OpDial, Dial: &guestproto.Dial{Port: 1}})
	r := p.next(t)
	for r.ID != 1 {
		r = p.next(t)
	}
	assert.False(t, r.OK)
	assert.Contains(t, r.Error, "port 1 of the guest")
}
