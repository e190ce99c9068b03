package guest

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"sync"
	"syscall"

	"computeplane/internal/guestproto"
)

// A started program (guestproto.OpStart): the interactive exec of a
// tunnel. Its output streams back in chunks within StreamWindow bytes not
// yet acknowledged by the host; stdin, its end, acks and a kill arrive as
// OpInput.
type proc struct {
	// ready closes once cmd and stdin are set, or failed is: an input
	// may arrive before the program started.
	ready  chan struct{}
	failed bool
	cmd    *exec.Cmd
	stdin  io.WriteCloser

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
func (a *Agent) register(id uint64) *proc {
	p := &proc{ready: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	a.pmu.Lock()
	a.procs()[id] = p
	a.pmu.Unlock()
	return p
}

// start runs r.Exec and streams it on port until it exits; the last
// response carries its exit code.
func (a *Agent) start(ctx context.Context, port io.Writer, r guestproto.Request, p *proc) {
	defer func() {
		a.pmu.Lock()
		delete(a.procs(), r.ID)
		a.pmu.Unlock()
	}()
	started := false
	defer func() {
		if !started {
			p.failed = true
			close(p.ready)
		}
	}()
	e := r.Exec
	argv := ownProgram(e.Argv) // the SSH server is compute-guest itself
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = e.Dir
	cmd.Env = a.environ(e.Env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		a.write(port, guestproto.Response{ID: r.ID, Error: err.Error()})
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		a.write(port, guestproto.Response{ID: r.ID, Error: err.Error()})
		return
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		a.write(port, guestproto.Response{ID: r.ID, Error: err.Error()})
		return
	}
	if err := startTracked(cmd); err != nil {
		a.write(port, guestproto.Response{ID: r.ID, Error: err.Error()})
		return
	}
	p.cmd, p.stdin, started = cmd, stdin, true
	close(p.ready)
	var wg sync.WaitGroup
	for fd, rd := range map[int]io.Reader{1: stdout, 2: stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := rd.Read(buf)
				if n > 0 {
					if !p.take(int64(n)) {
						return
					}
					a.write(port, guestproto.Response{ID: r.ID, OK: true, Output: &guestproto.Output{Fd: fd, Data: buf[:n]}})
				}
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait() // os/exec: read the pipes to their end before Wait
	err = cmd.Wait()
	untrack(cmd.Process.Pid)
	res := &guestproto.ExecResult{}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.ExitCode = exit.ExitCode()
	case err != nil:
		a.write(port, guestproto.Response{ID: r.ID, Error: err.Error()})
		return
	}
	a.write(port, guestproto.Response{ID: r.ID, OK: true, Exec: res})
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
		if len(in.Data) == 0 && !in.EOF {
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
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return guestproto.Response{OK: true}
	}
	if len(in.Data) > 0 {
		if _, err := p.stdin.Write(in.Data); err != nil {
			return fail(err)
		}
	}
	if in.EOF {
		_ = p.stdin.Close()
	}
	return guestproto.Response{OK: true}
}
