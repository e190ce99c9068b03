// Package guest is compute-guest, the agent inside every virtual machine:
// as PID 1 of a minimal image it mounts the kernel filesystems, loads the
// virtio modules and names the disks by serial; as PID 1 or beside another
// init it answers the host's requests (guestproto) on the virtio-serial
// port: it reports ready, runs bounded commands, reads and writes files,
// mounts volumes by serial and takes a fresh identity after a resume.
package guest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"computeplane/internal/guestproto"
)

// Agent answers requests on one port.
type Agent struct {
	Log *slog.Logger
	// Root is prefixed to every path a request names (tests); "" in a
	// guest.
	Root  string
	Start time.Time
	// Network lets a test agent (Root set) configure the network of the
	// namespace it runs in; a guest's agent always does.
	Network bool

	bootID string
	mu     sync.Mutex // identity
	ident  guestproto.Identity
	env    map[string]string
	// writable are the volumes mounted read-write (quiesced on sync).
	writable []string

	wmu   sync.Mutex // writes to the port
	frame []byte     // writeFrame's buffer, under wmu

	pmu     sync.Mutex
	running map[uint64]*proc // started programs (stream.go), by request id
	bg      *procTable       // background processes (processes.go)
}

// NewAgent returns an agent with a fresh boot id.
func NewAgent(log *slog.Logger) *Agent {
	host, _ := os.Hostname()
	return &Agent{Log: log, Start: time.Now(), bootID: randomHex(16), ident: guestproto.Identity{Hostname: host, MachineID: readMachineID()}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func readMachineID() string {
	b, err := os.ReadFile("/etc/machine-id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Serve writes the ready event and answers requests read from port until
// it ends.
func (a *Agent) Serve(ctx context.Context, port io.ReadWriter) error {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	a.write(port, guestproto.Response{OK: true, Ready: &guestproto.Ready{
		BootID: a.bootID, Kernel: strings.TrimSpace(string(kernel)), Hostname: a.hostname(), UptimeMs: time.Since(a.Start).Milliseconds(),
	}})
	sc := bufio.NewScanner(port)
	sc.Buffer(make([]byte, 64<<10), guestproto.MaxLineBytes)
	var wg sync.WaitGroup
	defer wg.Wait()
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		req, err := guestproto.DecodeRequest(line)
		if err != nil {
			a.write(port, guestproto.Response{ID: req.ID, Error: err.Error()})
			continue
		}
		if req.Op == guestproto.OpStart || req.Op == guestproto.OpDial {
			wg.Add(1)
			p := a.register(req.ID, req.BinaryOutput)
			go func() {
				defer wg.Done()
				if req.Op == guestproto.OpDial {
					a.dial(port, req, p)
				} else {
					a.start(port, req, p)
				}
			}()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := a.handle(ctx, req)
			resp.ID = req.ID
			a.write(port, resp)
		}()
	}
	return sc.Err()
}

func (a *Agent) write(w io.Writer, r guestproto.Response) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	a.wmu.Lock()
	defer a.wmu.Unlock()
	_, _ = w.Write(append(b, '\n'))
}

// writeFrame sends one output chunk as a binary frame, in one write.
func (a *Agent) writeFrame(w io.Writer, id uint64, fd int, data []byte) {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	a.frame = guestproto.AppendOutputFrame(a.frame[:0], id, fd, data)
	_, _ = w.Write(a.frame)
}

func (a *Agent) hostname() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ident.Hostname
}

func (a *Agent) path(p string) string { return filepath.Join(a.Root, filepath.Clean("/"+p)) }

func fail(err error) guestproto.Response { return guestproto.Response{Error: err.Error()} }

func (a *Agent) handle(ctx context.Context, r guestproto.Request) guestproto.Response {
	switch r.Op {
	case guestproto.OpPing:
		return guestproto.Response{OK: true, Status: a.status()}
	case guestproto.OpExec:
		return a.exec(ctx, r.Exec)
	case guestproto.OpReadFile:
		return a.readFile(r.File)
	case guestproto.OpInput:
		// The host sends a program's stdin one chunk at a time, each
		// after the answer to the last: order kept, and a program that
		// does not read holds only its own tunnel.
		return a.input(r.Input)
	case guestproto.OpWriteFile:
		return a.writeFile(r.File)
	case guestproto.OpProcess:
		return a.process(r.Process)
	case guestproto.OpMount:
		if err := a.mount(r.Mount); err != nil {
			return fail(err)
		}
		return guestproto.Response{OK: true}
	case guestproto.OpIdentity:
		if err := a.setIdentity(r.Identity); err != nil {
			return fail(err)
		}
		return guestproto.Response{OK: true, Status: a.status()}
	case guestproto.OpSync:
		syscall.Sync()
		a.quiesceVolumes()
		return guestproto.Response{OK: true}
	case guestproto.OpPoweroff:
		syscall.Sync()
		go func() {
			time.Sleep(50 * time.Millisecond)
			if os.Getpid() == 1 {
				_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
			}
		}()
		return guestproto.Response{OK: true}
	}
	return fail(fmt.Errorf("unknown op %q", r.Op))
}

// status checks the root filesystem with a probe file: a resumed or
// restored guest is called ready only when it answers and this passes.
func (a *Agent) status() *guestproto.Status {
	a.mu.Lock()
	id := a.ident
	a.mu.Unlock()
	probe := a.path("/tmp/.compute-guest-probe")
	want := []byte(randomHex(8))
	ok := os.WriteFile(probe, want, 0o600) == nil
	if ok {
		got, err := os.ReadFile(probe)
		ok = err == nil && bytes.Equal(got, want)
	}
	return &guestproto.Status{BootID: a.bootID, Hostname: id.Hostname, MachineID: id.MachineID,
		UptimeMs: time.Since(a.Start).Milliseconds(), RootOK: ok}
}

// outputGrace is how long an exec answer waits for the end of its output
// once the command exited, when a process it left running holds the pipes.
const outputGrace = 200 * time.Millisecond

// drain reads one output pipe of a command into a capped buffer until
// every holder of its write end is gone.
type drain struct {
	w    *os.File // the command's end, closed here once it started
	mu   sync.Mutex
	c    capped
	done chan struct{} // closed at EOF
}

func newDrain() (*drain, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	d := &drain{w: w, c: capped{max: guestproto.MaxOutputBytes}, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		defer r.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			d.mu.Lock()
			_, _ = d.c.Write(buf[:n])
			d.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return d, nil
}

// closeOurs closes our copy of the write end once the command started (or
// failed to): EOF comes when the command and its children closed theirs.
func (d *drain) closeOurs() { _ = d.w.Close() }

// take is the output so far, at EOF or when grace fires, whichever is
// first; the drain goes on discarding past the cap.
func (d *drain) take(grace <-chan struct{}) ([]byte, bool) {
	select {
	case <-d.done:
	case <-grace:
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes.Clone(d.c.buf.Bytes()), d.c.truncated
}

// capped keeps the first max bytes written to it.
type capped struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.truncated = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (a *Agent) exec(ctx context.Context, e *guestproto.Exec) guestproto.Response {
	timeout := time.Duration(e.TimeoutMs) * time.Millisecond
	if timeout == 0 {
		timeout = guestproto.DefaultExecTimeMs * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Argv[0], e.Argv[1:]...)
	cmd.Dir = e.Dir
	cmd.Env = a.environ(e.Env)
	if len(e.Stdin) > 0 {
		cmd.Stdin = bytes.NewReader(e.Stdin)
		// A child left running may hold stdin unread: the copy gives up
		// then, and Wait answers ErrWaitDelay (handled below).
		cmd.WaitDelay = time.Second
	}
	// stdout and stderr are pipes of our own, not os/exec's: Wait returns
	// when the command exits, even if a process it left in the background
	// (sh -c "server & echo started") still holds them, and a drain keeps
	// reading them so that process never blocks or dies of SIGPIPE.
	out, err := newDrain()
	if err != nil {
		return fail(err)
	}
	errOut, err := newDrain()
	if err != nil {
		out.closeOurs()
		return fail(err)
	}
	cmd.Stdout, cmd.Stderr = out.w, errOut.w
	// The whole process group dies with the timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := time.Now()
	err = startTracked(cmd)
	out.closeOurs()
	errOut.closeOurs()
	if err != nil {
		return fail(err)
	}
	err = cmd.Wait()
	untrack(cmd.Process.Pid)
	// Everything the command wrote is in the pipes now; a background
	// process still holding them gets outputGrace to finish a line.
	grace, stop := context.WithTimeout(context.Background(), outputGrace)
	defer stop()
	stdout, outCut := out.take(grace.Done())
	stderr, errCut := errOut.take(grace.Done())
	res := &guestproto.ExecResult{Stdout: stdout, Stderr: stderr, Truncated: outCut || errCut,
		DurationMs: time.Since(start).Milliseconds()}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		res.TimedOut, res.ExitCode = true, -1
	case errors.As(err, &exit):
		res.ExitCode = exit.ExitCode()
	case errors.Is(err, exec.ErrWaitDelay):
		res.ExitCode = cmd.ProcessState.ExitCode() // exited 0; only the stdin copy was cut
	case err != nil:
		return fail(err)
	}
	return guestproto.Response{OK: true, Exec: res}
}

// environ is a program's environment: the guest's identity, then extra.
func (a *Agent) environ(extra map[string]string) []string {
	a.mu.Lock()
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "HOSTNAME=" + a.ident.Hostname}
	for k, v := range a.env {
		env = append(env, k+"="+v)
	}
	a.mu.Unlock()
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

func (a *Agent) readFile(f *guestproto.File) guestproto.Response {
	fh, err := os.Open(a.path(f.Path))
	if err != nil {
		return fail(err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, guestproto.MaxFileBytes+1))
	if err != nil {
		return fail(err)
	}
	if len(data) > guestproto.MaxFileBytes {
		return fail(fmt.Errorf("%s is larger than %d bytes", f.Path, guestproto.MaxFileBytes))
	}
	return guestproto.Response{OK: true, Data: data}
}

// writeFile writes through a temporary file and a rename, then syncs, so
// a file is whole or absent after a crash, a pause or a snapshot.
func (a *Agent) writeFile(f *guestproto.File) guestproto.Response {
	p := a.path(f.Path)
	mode := os.FileMode(f.Mode)
	if mode == 0 {
		mode = 0o644
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fail(err)
	}
	tmp := p + ".compute-guest.tmp"
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fail(err)
	}
	_, err = fh.Write(f.Data)
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fail(err)
	}
	return guestproto.Response{OK: true}
}

func (a *Agent) setIdentity(id *guestproto.Identity) error {
	if id.MachineID == "" {
		id.MachineID = randomHex(16)
	}

	if a.Root == "" && os.Getpid() == 1 {
		if err := syscall.Sethostname([]byte(id.Hostname)); err != nil {
			return err
		}
		_ = os.WriteFile("/etc/hostname", []byte(id.Hostname+"\n"), 0o644)
		_ = os.WriteFile("/etc/machine-id", []byte(id.MachineID+"\n"), 0o444)
	}
	a.mu.Lock()
	a.ident = *id
	a.env = id.Env
	a.mu.Unlock()
	if id.Network != nil && (a.Root == "" || a.Network) {
		return a.configureNetwork(id.Network)
	}
	return nil
}

// running is the pids exec requests wait for: the orphan reaper leaves
// them to os/exec.
var running = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// startTracked starts cmd and tracks its pid under one lock, so the
// reaper never takes a child that exits at once from os/exec.
func startTracked(cmd *exec.Cmd) error {
	running.Lock()
	defer running.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	running.pids[cmd.Process.Pid] = true
	return nil
}

func untrack(pid int) {
	running.Lock()
	defer running.Unlock()
	delete(running.pids, pid)
}
