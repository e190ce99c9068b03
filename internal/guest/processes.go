package guest

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"computeplane/internal/guestproto"
)

// The process table (guestproto.OpProcess): background programs that
// outlive the request that started them. Each runs in a process group of
// its own on pipes; its stdout and stderr go to one bounded buffer
// (guestproto.MaxProcessOutput, oldest bytes dropped) read by offset, its
// stdin stays open until the host closes it. Exited processes stay listed
// (with their exit code and output) until MaxProcesses pushes the oldest
// out.
type bgProc struct {
	info  guestproto.ProcessInfo // guarded by table.mu
	stdin io.WriteCloser
	done  chan struct{} // closed at the exit, once the output is read

	// output: chunks from offset base on, at most MaxProcessOutput bytes.
	chunks  []guestproto.Output
	base    int64         // offset of chunks[0]
	total   int64         // bytes written since the start
	changed chan struct{} // closed (and replaced) when output comes or the process exits
}

type procTable struct {
	mu    sync.Mutex
	procs map[int]*bgProc
}

func (a *Agent) table() *procTable {
	a.pmu.Lock()
	defer a.pmu.Unlock()
	if a.bg == nil {
		a.bg = &procTable{procs: map[int]*bgProc{}}
	}
	return a.bg
}

func (a *Agent) process(r *guestproto.Process) guestproto.Response {
	t := a.table()
	if r.Action == guestproto.ProcessStart {
		return a.startBackground(t, r.Exec)
	}
	if r.Action == guestproto.ProcessList {
		t.mu.Lock()
		defer t.mu.Unlock()
		out := make([]guestproto.ProcessInfo, 0, len(t.procs))
		for _, pid := range slices.Sorted(maps.Keys(t.procs)) {
			out = append(out, t.procs[pid].info)
		}
		return guestproto.Response{OK: true, Processes: out}
	}
	t.mu.Lock()
	p := t.procs[r.PID]
	t.mu.Unlock()
	if p == nil {
		return fail(fmt.Errorf("process %d: no such process", r.PID))
	}
	wait := time.Duration(r.WaitMs) * time.Millisecond
	switch r.Action {
	case guestproto.ProcessWait:
		select {
		case <-p.done:
		case <-time.After(wait):
		}
	case guestproto.ProcessSignal:
		if err := t.signal(p, syscall.Signal(guestproto.Signals[r.Signal])); err != nil {
			return fail(err)
		}
	case guestproto.ProcessStdin:
		if err := t.write(p, r.Data, r.EOF); err != nil {
			return fail(err)
		}
	case guestproto.ProcessRead:
		return guestproto.Response{OK: true, ProcessOutput: t.read(p, r.Offset, r.Limit, wait)}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return guestproto.Response{OK: true, Processes: []guestproto.ProcessInfo{p.info}}
}

// startBackground starts a program and answers once it runs (or could not).
func (a *Agent) startBackground(t *procTable, e *guestproto.Exec) guestproto.Response {
	t.mu.Lock()
	if !t.makeRoom() {
		t.mu.Unlock()
		return fail(fmt.Errorf("%d processes run already (at most %d)", guestproto.MaxProcesses, guestproto.MaxProcesses))
	}
	t.mu.Unlock()
	cmd := exec.Command(e.Argv[0], e.Argv[1:]...)
	cmd.Dir = e.Dir
	cmd.Env = a.environ(e.Env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(err)
	}
	// Our own pipes (not os/exec's): Wait returns at the exit even when a
	// child holds them; chunks are told apart by the pipe they came from.
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return fail(err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = startTracked(cmd)
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		return fail(err)
	}
	p := &bgProc{stdin: stdin, done: make(chan struct{}), changed: make(chan struct{})}
	p.info = guestproto.ProcessInfo{PID: cmd.Process.Pid, Argv: e.Argv, Env: e.Env, Dir: e.Dir, StartedAtMs: time.Now().UnixMilli(),
		Running: true, StdinOpen: true}
	t.mu.Lock()
	t.procs[p.info.PID] = p
	info := p.info
	t.mu.Unlock()
	var wg sync.WaitGroup
	for fd, rd := range map[int]io.ReadCloser{1: outR, 2: errR} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rd.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := rd.Read(buf)
				if n > 0 {
					t.append(p, fd, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() {
		werr := cmd.Wait()
		res, _ := exitOf(cmd, werr)
		code := -1
		if res != nil {
			code = res.ExitCode
		}
		// A child left holding the pipes gets outputGrace, then the
		// process counts as exited with what it wrote so far.
		read := make(chan struct{})
		go func() { wg.Wait(); close(read) }()
		select {
		case <-read:
		case <-time.After(outputGrace):
		}
		t.mu.Lock()
		p.info.Running, p.info.ExitCode, p.info.EndedAtMs, p.info.StdinOpen = false, &code, time.Now().UnixMilli(), false
		t.wake(p)
		t.mu.Unlock()
		_ = stdin.Close()
		close(p.done)
	}()
	return guestproto.Response{OK: true, Processes: []guestproto.ProcessInfo{info}}
}

// makeRoom forgets the oldest exited processes beyond MaxProcesses-1;
// false when every tracked process runs. Under t.mu.
func (t *procTable) makeRoom() bool {
	for len(t.procs) >= guestproto.MaxProcesses {
		oldest := 0
		for pid, p := range t.procs {
			if !p.info.Running && (oldest == 0 || p.info.EndedAtMs < t.procs[oldest].info.EndedAtMs) {
				oldest = pid
			}
		}
		if oldest == 0 {
			return false
		}
		delete(t.procs, oldest)
	}
	return true
}

func (t *procTable) wake(p *bgProc) {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (t *procTable) append(p *bgProc, fd int, b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.chunks = append(p.chunks, guestproto.Output{Fd: fd, Data: slices.Clone(b)})
	p.total += int64(len(b))
	p.info.OutputBytes = p.total
	for p.total-p.base > guestproto.MaxProcessOutput {
		drop := p.chunks[0]
		over := p.total - p.base - guestproto.MaxProcessOutput
		if int64(len(drop.Data)) > over {
			p.chunks[0].Data = drop.Data[over:]
			p.base += over
			break
		}
		p.chunks = p.chunks[1:]
		p.base += int64(len(drop.Data))
	}
	t.wake(p)
}

// read answers the output from offset, waiting up to wait for some when
// there is none yet and the process runs.
func (t *procTable) read(p *bgProc, offset int64, limit int, wait time.Duration) *guestproto.ProcessOutput {
	if limit == 0 {
		limit = guestproto.MaxProcessRead
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	for offset >= p.total && p.info.Running && wait > 0 {
		ch := p.changed
		t.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			wait = 0
		}
		t.mu.Lock()
	}
	out := &guestproto.ProcessOutput{Chunks: []guestproto.Output{}, Offset: max(offset, p.base), Info: p.info}
	if offset < p.base {
		out.Dropped = p.base - offset
	}
	at, left := p.base, limit
	for _, c := range p.chunks {
		end := at + int64(len(c.Data))
		if end > out.Offset && left > 0 {
			d := c.Data[max(out.Offset-at, 0):]
			if len(d) > left {
				d = d[:left]
			}
			out.Chunks = append(out.Chunks, guestproto.Output{Fd: c.Fd, Data: d})
			left -= len(d)
		}
		at = end
	}
	out.NextOffset = out.Offset + int64(limit-left)
	out.Exited = !p.info.Running && out.NextOffset >= p.total
	return out
}

func (t *procTable) signal(p *bgProc, s syscall.Signal) error {
	t.mu.Lock()
	running, pid := p.info.Running, p.info.PID
	t.mu.Unlock()
	if !running {
		return fmt.Errorf("process %d exited", pid)
	}
	if err := syscall.Kill(-pid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func (t *procTable) write(p *bgProc, data []byte, eof bool) error {
	t.mu.Lock()
	open, pid := p.info.StdinOpen, p.info.PID
	if eof {
		p.info.StdinOpen = false
	}
	t.mu.Unlock()
	if !open {
		return fmt.Errorf("process %d: its stdin is closed", pid)
	}
	if len(data) > 0 {
		// A program that does not read its stdin would hold the request:
		// the write is bounded.
		done := make(chan error, 1)
		go func() { _, err := p.stdin.Write(data); done <- err }()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("process %d: stdin: %w", pid, err)
			}
		case <-time.After(10 * time.Second):
			return fmt.Errorf("process %d does not read its stdin", pid)
		}
	}
	if eof {
		return p.stdin.Close()
	}
	return nil
}
