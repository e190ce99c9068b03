package guest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"computeplane/internal/guestproto"
)

// A started program (guestproto.OpStart) or a dialled connection
// (OpDial): what a tunnel reaches. Its output streams back in chunks
// within StreamWindow bytes not yet acknowledged by the host; stdin, its
// end, acks, signals, resizes and a kill arrive as OpInput.
type proc struct {
	// ready closes once the fields below are set, or failed is: an input
	// may arrive before the program started.
	ready  chan struct{}
	failed bool
	stdin  io.Writer
	eof    func()                     // the end of stdin
	signal func(syscall.Signal) error // nil: none to signal
	resize func(guestproto.Size) error
	kill   func()

	binary bool // output as frames (Request.BinaryOutput)

	mu     sync.Mutex
	cond   *sync.Cond
	unack  int64
	killed bool
}

func (a *Agent) procs() map[uint64]*proc {
	if a.running == nil {
		a.running = map[uint64]*proc{}
	}
	return a.running
}

// register makes the program known before it starts (on the reader, so
// that the inputs after its request find it).
func (a *Agent) register(id uint64, binary bool) *proc {
	p := &proc{ready: make(chan struct{}), binary: binary}
	p.cond = sync.NewCond(&p.mu)
	a.pmu.Lock()
	a.procs()[id] = p
	a.pmu.Unlock()
	return p
}

// stream runs a started program or a dialled connection (run sets p's
// fields, closes ready and streams) and forgets it at the end.
func (a *Agent) stream(port io.Writer, r guestproto.Request, p *proc, run func() (*guestproto.ExecResult, error)) {
	defer func() {
		a.pmu.Lock()
		delete(a.procs(), r.ID)
		a.pmu.Unlock()
	}()
	res, err := run()
	select {
	case <-p.ready:
	default:
		p.failed = true
		close(p.ready)
	}
	if err != nil {
		a.write(port, guestproto.Response{ID: r.ID, Error: err.Error()})
		return
	}
	a.write(port, guestproto.Response{ID: r.ID, OK: true, Exec: res})
}

// pump sends what rd yields as output on fd until it ends or the program
// is killed.
func (a *Agent) pump(port io.Writer, id uint64, p *proc, fd int, rd io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := rd.Read(buf)
		if n > 0 {
			if !p.take(int64(n)) {
				return
			}
			if p.binary {
				a.writeFrame(port, id, fd, buf[:n])
			} else {
				a.write(port, guestproto.Response{ID: id, OK: true, Output: &guestproto.Output{Fd: fd, Data: buf[:n]}})
			}
		}
		if err != nil {
			return
		}
	}
}

// start runs r.Exec, on a terminal when it asks for one.
func (a *Agent) start(port io.Writer, r guestproto.Request, p *proc) {
	run := a.startPipes
	if r.Exec.TTY {
		run = a.startTTY
	}
	a.stream(port, r, p, func() (*guestproto.ExecResult, error) { return run(port, r, p) })
}

func (a *Agent) command(e *guestproto.Exec) *exec.Cmd {
	argv := ownProgram(e.Argv) // the SSH server is compute-guest itself
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = e.Dir
	cmd.Env = a.environ(e.Env)
	return cmd
}

// startPipes runs a program on pipes, in a process group of its own.
func (a *Agent) startPipes(port io.Writer, r guestproto.Request, p *proc) (*guestproto.ExecResult, error) {
	cmd := a.command(r.Exec)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := startTracked(cmd); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	p.stdin, p.eof = stdin, func() { _ = stdin.Close() }
	p.signal = func(s syscall.Signal) error { return syscall.Kill(-pid, s) }
	p.resize = func(guestproto.Size) error { return errors.New("the program has no terminal (tty: false)") }
	p.kill = func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }
	close(p.ready)
	var wg sync.WaitGroup
	for fd, rd := range map[int]io.Reader{1: stdout, 2: stderr} {
		wg.Add(1)
		go func() { defer wg.Done(); a.pump(port, r.ID, p, fd, rd) }()
	}
	wg.Wait() // os/exec: read the pipes to their end before Wait
	return exitOf(cmd, cmd.Wait())
}

// startTTY runs a program as the leader of a new session whose
// controlling terminal is a fresh pseudo-terminal: its stdin, stdout and
// stderr are the terminal, so the output comes on fd 1 only, and Ctrl-C
// typed as a byte interrupts its foreground job as on any terminal.
func (a *Agent) startTTY(port io.Writer, r guestproto.Request, p *proc) (*guestproto.ExecResult, error) {
	e := r.Exec
	cmd := a.command(e)
	if _, ok := e.Env["TERM"]; !ok {
		cmd.Env = append(cmd.Env, "TERM=xterm-256color")
	}
	master, tty, err := pty.Open()
	if err != nil {
		return nil, err
	}
	defer master.Close()
	size := &pty.Winsize{Cols: 80, Rows: 24}
	if e.Size != nil && e.Size.Cols > 0 && e.Size.Rows > 0 {
		size = &pty.Winsize{Cols: e.Size.Cols, Rows: e.Size.Rows}
	}
	if err := pty.Setsize(master, size); err != nil {
		_ = tty.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = startTracked(cmd)
	_ = tty.Close() // the program holds its own
	if err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	p.stdin = master
	// The end of stdin on a terminal is its EOF character (Ctrl-D).
	p.eof = func() { _, _ = master.Write([]byte{4}) }
	p.signal = func(s syscall.Signal) error {
		// The terminal's foreground job, as a typed Ctrl-C reaches it.
		if fg, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPGRP); err == nil && fg > 0 {
			return syscall.Kill(-fg, s)
		}
		return syscall.Kill(-pid, s)
	}
	p.resize = func(s guestproto.Size) error {
		return pty.Setsize(master, &pty.Winsize{Cols: s.Cols, Rows: s.Rows})
	}
	p.kill = func() { _ = syscall.Kill(-pid, syscall.SIGKILL); _ = master.Close() }
	close(p.ready)
	done := make(chan struct{})
	go func() { defer close(done); a.pump(port, r.ID, p, 1, master) }()
	werr := cmd.Wait()
	// The terminal's output is read to its end (EIO once every holder of
	// the terminal is gone); a background process that keeps it open
	// gets outputGrace.
	select {
	case <-done:
	case <-time.After(outputGrace):
		_ = master.Close()
		<-done
	}
	return exitOf(cmd, werr)
}

// exitOf is a finished program's result: its exit code, or 128 plus the
// signal that ended it, as a shell reports it.
func exitOf(cmd *exec.Cmd, err error) (*guestproto.ExecResult, error) {
	untrack(cmd.Process.Pid)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &guestproto.ExecResult{ExitCode: 128 + int(ws.Signal())}, nil
		}
		return &guestproto.ExecResult{ExitCode: exit.ExitCode()}, nil
	case err != nil:
		return nil, err
	}
	return &guestproto.ExecResult{}, nil
}

// dialTimeout bounds a dial of a guest port.
const dialTimeout = 5 * time.Second

// dial connects to a port of the guest's loopback and streams the
// connection: its bytes as output on fd 1, stdin to it, the end of stdin
// as a half close; it ends (exit code 0) when the server's side closes.
func (a *Agent) dial(port io.Writer, r guestproto.Request, p *proc) {
	a.stream(port, r, p, func() (*guestproto.ExecResult, error) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Dial.Port)), dialTimeout)
		if err != nil {
			return nil, fmt.Errorf("port %d of the guest: %w", r.Dial.Port, errors.Unwrap(err))
		}
		conn := c.(*net.TCPConn)
		defer conn.Close()
		p.stdin, p.eof = conn, func() { _ = conn.CloseWrite() }
		p.resize = func(guestproto.Size) error { return errors.New("a connection has no terminal") }
		p.kill = func() { _ = conn.Close() }
		close(p.ready)
		a.pump(port, r.ID, p, 1, conn)
		return &guestproto.ExecResult{}, nil
	})
}

// take waits for room in the window for n bytes; false once killed.
func (p *proc) take(n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.unack >= guestproto.StreamWindow && !p.killed {
		p.cond.Wait()
	}
	p.unack += n
	return !p.killed
}

// input applies an OpInput to its program.
func (a *Agent) input(in *guestproto.Input) guestproto.Response {
	a.pmu.Lock()
	p := a.procs()[in.Proc]
	a.pmu.Unlock()
	if p != nil {
		<-p.ready
	}
	if p == nil || p.failed {
		if len(in.Data) == 0 && !in.EOF && in.Signal == "" && in.Resize == nil {
			return guestproto.Response{OK: true} // an ack or kill after the end: nothing to do
		}
		return fail(errors.New("no such program (it exited)"))
	}
	if in.Ack > 0 || in.Kill {
		p.mu.Lock()
		p.unack = max(p.unack-in.Ack, 0)
		p.killed = p.killed || in.Kill
		p.cond.Broadcast()
		p.mu.Unlock()
	}
	if in.Kill {
		p.kill()
		return guestproto.Response{OK: true}
	}
	if in.Resize != nil {
		if err := p.resize(*in.Resize); err != nil {
			return fail(err)
		}
	}
	if in.Signal != "" {
		if p.signal == nil {
			return fail(errors.New("a connection takes no signals"))
		}
		if err := p.signal(syscall.Signal(guestproto.Signals[in.Signal])); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fail(err)
		}
	}
	if len(in.Data) > 0 {
		if _, err := p.stdin.Write(in.Data); err != nil {
			return fail(err)
		}
	}
	if in.EOF {
		p.eof()
	}
	return guestproto.Response{OK: true}
}
