package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"computeplane/internal/guestproto"
)

// Timeouts.
const (
	StartTimeout = 10 * time.Second // qemu up with its QMP socket
	QMPTimeout   = 5 * time.Second  // one QMP command
	KillTimeout  = 10 * time.Second // a SIGKILLed qemu gone, its files closed
)

// ErrGone is the answer about a VM whose qemu process is no longer there.
var ErrGone = errors.New("qemu: the VM's process is gone")

// VM is one running qemu.
type VM struct {
	Config *Config
	Pid    int

	mu     sync.Mutex
	qmpSem chan struct{} // the monitor's lock: one QMP command (or a restore's sequence) at a time
	exited chan struct{} // closed when a child qemu exits (nil after Attach, unless the qemu is a child: reapIfChild)
	guest  *Guest
	// mon is the VM's QMP connection, held from its start or attach
	// (command); nil until the next command dials it again after it
	// failed.
	mon       *qmpConn
	restoring bool // a restore is pending (Start, Prestart): Restore lets it run
	loaded    bool // a restore's state is in (Prestart)

	startedAt time.Time // qemu's exec, for StartPhases
	// StartPhases is when Start saw each step, from qemu's exec (zero
	// after Attach): what a slow start or restore spent its time on.
	StartPhases StartPhases
}

// StartPhases are the steps of Start, each as the time since qemu's exec.
type StartPhases struct {
	Socket  time.Duration // the QMP socket file is there
	QMP     time.Duration // QMP answered (its handshake done)
	Loaded  time.Duration // a restore's state is in (migration completed)
	Running time.Duration // a restored VM runs again (cont answered)
}

func (p StartPhases) String() string {
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
	return fmt.Sprintf("socket %s qmp %s loaded %s running %s", ms(p.Socket), ms(p.QMP), ms(p.Loaded), ms(p.Running))
}

// Start starts qemu for c, detached in a session of its own so that it
// outlives the caller, and connects QMP; a restore (c.Incoming) has its
// state loaded and runs when Start returns.
func Start(ctx context.Context, c *Config) (*VM, error) {
	v, q, err := launch(ctx, c)
	if err != nil {
		return nil, err
	}
	v.mon = q
	if c.Incoming == "" {
		return v, nil
	}
	v.restoring = true
	v.connectGuest()
	if err := v.Restore(ctx); err != nil {
		_ = v.Kill()
		return nil, err
	}
	return v, nil
}

// Prestart starts qemu for a restore of c.Incoming ahead of it: the
// process, its QMP handshake and the migration of the saved state are
// done; the guest then runs on from its snapshot just long enough to
// answer a ping (its agent answers, its root filesystem takes a write),
// and the VM waits paused, holding its QMP connection, until Restore lets
// it run again (or Kill). What a restore then spends is a cont and the
// guest's answer on a path it has just run: under TCG the code of that
// path (the virtio interrupt, the kernel, the agent) is translated
// already, which the first answer of a freshly restored guest spends most
// of its time on.
func Prestart(ctx context.Context, c *Config) (*VM, error) {
	if c.Incoming == "" {
		return nil, errors.New("qemu: a prestarted VM restores a state (Incoming)")
	}
	c.Paused = true
	v, q, err := launch(ctx, c)
	if err != nil {
		return nil, err
	}
	v.mon, v.restoring = q, true
	v.connectGuest()
	if err := v.load(ctx, q); err != nil {
		_ = v.Kill()
		return nil, err
	}
	if err := v.warm(ctx, q); err != nil {
		_ = v.Kill()
		return nil, err
	}
	return v, nil
}

// warm runs a restored VM until its guest answers a ping, and pauses it
// again (on q, the connection held).
func (v *VM) warm(ctx context.Context, q *qmpConn) error {
	if _, err := q.run(ctx, `{"execute":"cont"}`, nil); err != nil {
		return err
	}
	g, err := v.Guest()
	if err != nil {
		return err
	}
	resp, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpPing})
	switch {
	case err != nil:
		return fmt.Errorf("qemu: the restored guest did not answer: %w", err)
	case resp.Status == nil || !resp.Status.RootOK:
		return errors.New("qemu: the restored guest's root filesystem did not check out")
	}
	_, err = q.run(ctx, `{"execute":"stop"}`, nil)
	return err
}

// connectGuest connects the guest channel of a VM whose state is still
// to load. The guest was snapshotted with a host connected to its port:
// connected before the state loads, the port stays so, whereas a host
// that connects only after the VM runs again lets the guest see its port
// close (qemu tells it the host is gone, its read ends) and open again,
// and compute-guest serves the port anew (a pause, a ready event) before
// the first request is read. A failure leaves it to Guest to dial later.
func (v *VM) connectGuest() {
	if g, err := DialGuest(v.Config.GuestSocket()); err == nil {
		v.mu.Lock()
		v.guest = g
		v.mu.Unlock()
	}
}

// launch execs qemu for c and returns it with a QMP connection whose
// handshake is done.
func launch(ctx context.Context, c *Config) (*VM, *qmpConn, error) {
	if err := c.Check(); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, nil, err
	}
	for _, f := range []string{c.QMPSocket(), c.GuestSocket(), c.SerialSocket(), c.PidFile()} {
		_ = os.Remove(f)
	}
	if err := c.save(); err != nil {
		return nil, nil, err
	}
	logf, err := os.OpenFile(c.path("qemu.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	argv := append(append(append([]string(nil), Through...), Binary), c.Args()...)
	if c.Nice != 0 {
		// Through nice(1), which execs qemu in its place (same pid): every
		// thread qemu starts inherits the niceness.
		argv = append([]string{"nice", "-n", strconv.Itoa(c.Nice)}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("qemu: start: %w", err)
	}
	v := &VM{Config: c, Pid: cmd.Process.Pid, exited: make(chan struct{}), qmpSem: make(chan struct{}, 1)}
	execAt := time.Now()
	v.startedAt = execAt
	go func() { _ = cmd.Wait(); close(v.exited) }()
	up := waitFor(StartTimeout, func() bool {
		select {
		case <-v.exited:
			return true
		default:
		}
		_, err := os.Stat(c.QMPSocket())
		return err == nil
	})
	select {
	case <-v.exited:
		return nil, nil, fmt.Errorf("qemu: exited at start: %s", tailFile(c.path("qemu.log"), 5))
	default:
	}
	if !up {
		_ = cmd.Process.Kill()
		return nil, nil, errors.New("qemu: no QMP socket within the start timeout")
	}
	v.StartPhases.Socket = time.Since(execAt)
	// The socket file appears at bind, before qemu listens: try again
	// for the rest of the start timeout.
	for deadline := time.Now().Add(StartTimeout); ; {
		q, err := dialQMP(ctx, c.QMPSocket())
		if err == nil {
			v.StartPhases.QMP = time.Since(execAt)
			return v, q, nil
		}
		if !v.Alive() {
			return nil, nil, fmt.Errorf("%w; qemu exited: %s", err, tailFile(c.path("qemu.log"), 5))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			return nil, nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Move renames the directory of a VM that was started elsewhere (a
// prestarted one, taken for an instance) to dir, under the name id: its
// sockets and files move with it (a unix socket is reached by its inode),
// and config.json names the directory qemu was started in (ExecDir),
// which its command line still holds.
func (v *VM) Move(dir, id string) error {
	c := *v.Config
	if err := os.Rename(c.Dir, dir); err != nil {
		return err
	}
	if c.ExecDir == "" {
		c.ExecDir = c.Dir
	}
	c.Dir, c.ID = dir, id
	v.mu.Lock()
	v.Config = &c
	v.mu.Unlock()
	return c.save()
}

// Attach re-attaches to the VM running in dir (after a daemon restart).
func Attach(dir string) (*VM, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(c.PidFile())
	if err != nil {
		return nil, ErrGone
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, ErrGone
	}
	v := &VM{Config: c, Pid: pid, qmpSem: make(chan struct{}, 1)}
	v.reapIfChild()
	if !v.Alive() {
		return nil, ErrGone
	}
	// qemu serves one QMP client at a time and may not have noticed yet
	// that the previous one (a daemon that was killed) is gone: it drops
	// a new connection until it has. Try again for a while.
	deadline := time.Now().Add(AttachTimeout)
	for {
		err := v.connect()
		if err == nil {
			return v, nil
		}
		if !v.Alive() {
			return nil, ErrGone
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reapIfChild waits for the VM's qemu when it is a child of this process
// though this process did not start it: a daemon that executed a new
// binary in place (same pid) keeps the VMs the old one started as its
// children. Waiting for that one pid (never any child) reaps it when it
// ends, without taking another child's exit from exec.Cmd.Wait, and tells
// Alive the moment it is gone.
func (v *VM) reapIfChild() {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(v.Pid), "stat"))
	if err != nil {
		return
	}
	s := string(b)
	rp := strings.LastIndexByte(s, ')')
	if rp < 0 {
		return
	}
	fields := strings.Fields(s[rp+1:]) // state, ppid, ...
	if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
		return
	}
	v.exited = make(chan struct{})
	go func() {
		var ws syscall.WaitStatus
		for {
			if _, err := syscall.Wait4(v.Pid, &ws, 0, nil); err != syscall.EINTR {
				break
			}
		}
		close(v.exited)
	}()
}

// KillDir ends the qemu of the VM in dir, if it runs (a VM that could not
// be re-attached must not run on untracked).
func KillDir(dir string) {
	c, err := LoadConfig(dir)
	if err != nil {
		return
	}
	b, err := os.ReadFile(c.PidFile())
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	v := &VM{Config: c, Pid: pid, qmpSem: make(chan struct{}, 1)}
	if v.Alive() {
		_ = v.Kill()
	}
}

// AttachTimeout bounds re-attaching to a running VM.
const AttachTimeout = 10 * time.Second

// connect opens the VM's QMP connection (its handshake done, bounded)
// and holds it for the VM's commands.
func (v *VM) connect() error {
	ctx, cancel := context.WithTimeout(context.Background(), QMPTimeout)
	defer cancel()
	q, err := dialQMP(ctx, v.Config.QMPSocket())
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.mon = q
	v.mu.Unlock()
	return nil
}

// Detach lets go of the VM without stopping it (a daemon shutting down):
// its QMP and guest connections close, qemu runs on.
func (v *VM) Detach() { v.close() }

// Alive reports whether the VM's qemu still runs (and holds its files): a
// child until it is reaped; otherwise its pid is there, is a qemu of this
// VM (a reused pid is not), and not a zombie whose threads all ended.
func (v *VM) Alive() bool {
	if v.exited != nil {
		// Our child: it is gone once reaped, which is after its last
		// thread exited and closed its files (the locks on its disks
		// with them). Its main thread alone may be a zombie before that.
		select {
		case <-v.exited:
			return false
		default:
			return true
		}
	}
	proc := filepath.Join("/proc", strconv.Itoa(v.Pid))
	cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline"))
	if err != nil {
		return false
	}
	if len(cmdline) == 0 {
		// A zombie main thread: the process still holds its files while
		// another of its threads is exiting.
		tasks, _ := os.ReadDir(filepath.Join(proc, "task"))
		return len(tasks) > 1
	}
	return strings.Contains(string(cmdline), v.Config.execQMPSocket())
}

// command runs one QMP command (JSON) on the VM's held monitor
// connection and returns its "return" member: the commands of a VM go
// one at a time on one connection, opened at the start (or attach) and
// held, so a command costs a write and a read, not qemu's greeting and
// capability negotiation on a connection of its own. A connection that
// failed (a deadline, qemu closed it) is closed and the next command
// dials a new one; an idempotent command that failed on a connection held
// from before is sent once more on a new one. The wait for the monitor
// and each exchange are bounded by QMPTimeout.
func (v *VM) command(cmd string, idempotent bool) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*QMPTimeout)
	defer cancel()
	if err := v.lockMonitor(ctx); err != nil {
		return nil, err
	}
	defer v.unlockMonitor()
	return v.exchange(ctx, cmd, idempotent)
}

// exchange runs one command on the held monitor (the monitor locked),
// dialling a new connection when none is held, and once more on a new one
// when an idempotent command failed on a connection held from before.
func (v *VM) exchange(ctx context.Context, cmd string, idempotent bool) (json.RawMessage, error) {
	for attempt := 0; ; attempt++ {
		q, fresh, err := v.monitor(ctx)
		if err != nil {
			if !v.Alive() {
				return nil, ErrGone
			}
			return nil, err
		}
		out, err := q.run(ctx, cmd, nil)
		var qe *qmpError
		if err == nil || errors.As(err, &qe) {
			return out, err
		}
		v.dropMonitor(q)
		if !v.Alive() {
			return nil, ErrGone
		}
		if fresh || !idempotent || attempt > 0 {
			return nil, err
		}
	}
}

// lockMonitor takes the VM's monitor for one command or sequence, waiting
// at most until ctx ends (a command stalled on a hung qemu holds it until
// its own deadline).
func (v *VM) lockMonitor(ctx context.Context) error {
	select {
	case v.qmpSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("qemu: QMP busy: %w", ctx.Err())
	}
}

func (v *VM) unlockMonitor() { <-v.qmpSem }

// monitor returns the held QMP connection, dialling one when there is
// none (fresh); the monitor is locked.
func (v *VM) monitor(ctx context.Context) (q *qmpConn, fresh bool, err error) {
	v.mu.Lock()
	q = v.mon
	v.mu.Unlock()
	if q != nil {
		return q, false, nil
	}
	// qemu serves one QMP client at a time and may drop a new connection
	// until it noticed that the previous one closed: dial again while it
	// lives, until ctx ends.
	for {
		q, err = dialQMP(ctx, v.Config.QMPSocket())
		if err == nil {
			break
		}
		if !v.Alive() || ctx.Err() != nil {
			return nil, false, err
		}
		select {
		case <-ctx.Done():
			return nil, false, err
		case <-time.After(20 * time.Millisecond):
		}
	}
	v.mu.Lock()
	v.mon = q
	v.mu.Unlock()
	return q, true, nil
}

// dropMonitor closes a held connection that failed (the monitor locked).
func (v *VM) dropMonitor(q *qmpConn) {
	v.mu.Lock()
	if v.mon == q {
		v.mon = nil
	}
	v.mu.Unlock()
	q.close()
}

// Status is qemu's run state: running, paused, shutdown, inmigrate ...
func (v *VM) Status() (string, error) {
	out, err := v.command(`{"execute":"query-status"}`, true)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("qemu: query-status: %w", err)
	}
	return st.Status, nil
}

// SetNice sets the CPU niceness of every thread of the VM's qemu (Linux
// keeps one per thread). Raising the priority back needs CAP_SYS_NICE.
func (v *VM) SetNice(nice int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", v.Pid))
	if err != nil {
		return ErrGone
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Pause stops the vCPUs.
func (v *VM) Pause() error {
	_, err := v.command(`{"execute":"stop"}`, true)
	return err
}

// Resume runs the vCPUs again.
func (v *VM) Resume() error {
	_, err := v.command(`{"execute":"cont"}`, true)
	return err
}

// Reset is a hard reset (a reboot from outside the guest).
func (v *VM) Reset() error {
	_, err := v.command(`{"execute":"system_reset"}`, false)
	return err
}

// ResizeDisk grows the disk with serial to bytes while the guest runs.
func (v *VM) ResizeDisk(index int, bytes int64) error {
	_, err := v.command(fmt.Sprintf(`{"execute":"block_resize","arguments":{"device":"d%d","size":%d}}`, index, bytes), true)
	return err
}

// Stop ends the VM: the guest is asked to power off, then qemu is told to
// quit, then killed, each bounded.
func (v *VM) Stop(ctx context.Context) error {
	if g := v.currentGuest(); g != nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = g.Call(cctx, guestproto.Request{Op: guestproto.OpSync})
		cancel()
	}
	_, _ = v.command(`{"execute":"quit"}`, false)
	if waitFor(3*time.Second, func() bool { return !v.Alive() }) {
		v.close()
		return nil
	}
	return v.Kill()
}

// Kill ends qemu at once.
func (v *VM) Kill() error {
	if err := syscall.Kill(v.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	if !waitFor(KillTimeout, func() bool { return !v.Alive() }) {
		v.close()
		return fmt.Errorf("qemu: pid %d still runs %s after SIGKILL", v.Pid, KillTimeout)
	}
	v.close()
	return nil
}

func (v *VM) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mon != nil {
		v.mon.close()
		v.mon = nil
	}
	if v.guest != nil {
		v.guest.Close()
		v.guest = nil
	}
}

func (v *VM) currentGuest() *Guest {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.guest
}

// Guest returns the connection to compute-guest, dialling it the first
// time.
func (v *VM) Guest() (*Guest, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.guest != nil && !v.guest.Closed() {
		return v.guest, nil
	}
	g, err := DialGuest(v.Config.GuestSocket())
	if err != nil {
		return nil, err
	}
	v.guest = g
	return g, nil
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func (v *VM) ignoreShared() error {
	if v.Config.MemoryFile == "" {
		return nil
	}
	_, err := v.command(`{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"x-ignore-shared","state":true}]}}`, true)
	return err
}

// awaitMigration polls query-migrate until the migration completed.
func (v *VM) awaitMigration(ctx context.Context) error {
	for {
		out, err := v.command(`{"execute":"query-migrate"}`, true)
		if err != nil {
			return err
		}
		var info struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		_ = json.Unmarshal(out, &info)
		switch info.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("qemu: migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: migration not done: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// SaveState writes the VM's device state (and its RAM, unless it is in a
// shared memory file) to file with a migration; the VM must be paused and
// stays so.
func (v *VM) SaveState(ctx context.Context, file string) error {
	if strings.ContainsAny(file, `"\ `) {
		return fmt.Errorf("qemu: state file %q", file)
	}
	if err := v.ignoreShared(); err != nil {
		return err
	}
	if _, err := v.command(`{"execute":"migrate","arguments":{"uri":"exec:cat > `+file+`"}}`, false); err != nil {
		return err
	}
	return v.awaitMigration(ctx)
}

// Restore loads the state file named by Config.Incoming into a VM
// started with -incoming defer (Start) and lets it run, or lets a
// prestarted one (its state loaded) run. The load goes on the connection
// the VM was started with (getfd names the state's descriptor on it);
// what follows it on the VM's held connection, or on a new one when that
// broke while a prestarted VM waited in its pool.
func (v *VM) Restore(ctx context.Context) error {
	if err := v.lockMonitor(ctx); err != nil {
		return err
	}
	defer v.unlockMonitor()
	v.mu.Lock()
	q, restoring := v.mon, v.restoring
	v.restoring = false
	v.mu.Unlock()
	if !restoring {
		return errors.New("qemu: no restore is pending on this VM")
	}
	if !v.loaded {
		if q == nil {
			return errors.New("qemu: the restore's QMP connection is gone")
		}
		if err := v.load(ctx, q); err != nil {
			var qe *qmpError
			if !errors.As(err, &qe) {
				v.dropMonitor(q)
			}
			return err
		}
	}
	for {
		out, err := v.exchange(ctx, `{"execute":"query-status"}`, true)
		if err != nil {
			return err
		}
		var st struct {
			Status string `json:"status"`
		}
		_ = json.Unmarshal(out, &st)
		switch st.Status {
		case "running":
			v.StartPhases.Running = time.Since(v.startedAt)
			return nil
		case "paused", "postmigrate", "prelaunch":
			// cont is idempotent: a running VM answers it too.
			_, err := v.exchange(ctx, `{"execute":"cont"}`, true)
			v.StartPhases.Running = time.Since(v.startedAt)
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: restored VM is %s: %w", st.Status, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// load migrates the state file named by Config.Incoming into the VM on
// the connection q: the capabilities set, the file's descriptor passed
// (qemu reads the state from it: no shell and cat forked from qemu, whose
// address space holds the guest's memory), the migration awaited.
func (v *VM) load(ctx context.Context, q *qmpConn) error {
	f, err := os.Open(v.Config.Incoming)
	if err != nil {
		return fmt.Errorf("qemu: state: %w", err)
	}
	defer f.Close()
	if v.Config.MemoryFile != "" {
		if _, err := q.run(ctx, `{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"x-ignore-shared","state":true}]}}`, nil); err != nil {
			return err
		}
	}
	if _, err = q.run(ctx, `{"execute":"getfd","arguments":{"fdname":"incoming"}}`, f); err != nil {
		return err
	}
	if _, err := q.run(ctx, `{"execute":"migrate-incoming","arguments":{"uri":"fd:incoming"}}`, nil); err != nil {
		return err
	}
	for {
		out, err := q.run(ctx, `{"execute":"query-migrate"}`, nil)
		if err != nil {
			return err
		}
		var info struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		_ = json.Unmarshal(out, &info)
		if info.Status == "completed" {
			v.StartPhases.Loaded = time.Since(v.startedAt)
			v.loaded = true
			return nil
		}
		if info.Status == "failed" || info.Status == "cancelled" {
			return fmt.Errorf("qemu: migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: migration not done: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
