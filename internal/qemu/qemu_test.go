package qemu_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
	"computeplane/internal/qemu/qemutest"
)

func guestReady(t *testing.T, v *qemu.VM) *qemu.Guest {
	t.Helper()
	var g *qemu.Guest
	require.Eventually(t, func() bool {
		var err error
		g, err = v.Guest()
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	_, err := g.Ready(ctx)
	require.NoError(t, err, "console: %s", console(v))
	return g
}

func console(v *qemu.VM) string {
	b, _ := os.ReadFile(v.Config.Console())
	return string(b)
}

// readUntil reads a console until its output holds want.
func readUntil(t *testing.T, c *qemu.Console, want string) {
	t.Helper()
	var got strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for !strings.Contains(got.String(), want) {
			n, err := c.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.Close()
		<-done
	}
	require.Contains(t, got.String(), want)
}

func call(t *testing.T, g *qemu.Guest, r guestproto.Request) guestproto.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := g.Call(ctx, r)
	require.NoError(t, err)
	return resp
}

// One VM, booted for real (TCG here), through its whole life: ready,
// exec, a volume by serial formatted and written, pause and resume, the
// daemon "restarting" (re-attach by directory), a kill from outside.
func TestVMLifecycle(t *testing.T) {
	im := qemutest.Image(t)
	dir, err := os.MkdirTemp("", "vm") // short: unix socket paths
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	vol := filepath.Join(dir, "vol1.raw")
	require.NoError(t, os.WriteFile(vol, nil, 0o600))
	require.NoError(t, os.Truncate(vol, 64<<20))
	c := &qemu.Config{ID: "vm-test", Dir: filepath.Join(dir, "vm"), VCPU: 1, MemoryMiB: 256, Accel: qemu.AccelTCG,
		Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline + " compute.hostname=vm-test",
		Disks: []qemu.Disk{{Path: vol, Serial: "vol1", Format: "raw"}}}
	start := time.Now()
	v, err := qemu.Start(t.Context(), c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = v.Kill() })
	g := guestReady(t, v)
	t.Logf("booted to a ready guest in %s", time.Since(start).Round(time.Millisecond))

	r := call(t, g, guestproto.Request{Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", "hostname; ls /dev/disk/by-id"}}})
	assert.Equal(t, "vm-test\nvirtio-vol1\n", string(r.Exec.Stdout))

	// The serial console: the boot from the log, then live; two at
	// once share qemu's one connection, and both see a shell typed into.
	c1, err := qemu.OpenConsole(c)
	require.NoError(t, err)
	c2, err := qemu.OpenConsole(c)
	require.NoError(t, err)
	readUntil(t, c1, "compute-guest: READY")
	readUntil(t, c2, "Please press Enter")
	_, err = c1.Write([]byte("\r"))
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	_, err = c2.Write([]byte("echo con$((40+2))sole\r"))
	require.NoError(t, err)
	readUntil(t, c1, "con42sole")
	readUntil(t, c2, "con42sole")
	require.NoError(t, c1.Close())
	require.NoError(t, c2.Close())
	call(t, g, guestproto.Request{Op: guestproto.OpMount, Mount: &guestproto.Mount{Serial: "vol1", Path: "/data", Format: true}})
	call(t, g, guestproto.Request{Op: guestproto.OpWriteFile, File: &guestproto.File{Path: "/data/hello.txt", Data: []byte("kept")}})

	require.NoError(t, v.Pause())
	st, err := v.Status()
	require.NoError(t, err)
	assert.Equal(t, "paused", st)
	require.NoError(t, v.Resume())
	r = call(t, g, guestproto.Request{Op: guestproto.OpReadFile, File: &guestproto.File{Path: "/data/hello.txt"}})
	assert.Equal(t, "kept", string(r.Data))

	// The daemon restarts: a new process attaches by the directory.
	v.Detach()
	v2, err := qemu.Attach(c.Dir)
	require.NoError(t, err)
	st, err = v2.Status()
	require.NoError(t, err)
	assert.Equal(t, "running", st)
	g2, err := v2.Guest()
	require.NoError(t, err)
	r = call(t, g2, guestproto.Request{Op: guestproto.OpPing})
	assert.True(t, r.Status.RootOK)

	// Killed from outside: noticed.
	require.NoError(t, syscall.Kill(v2.Pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return !v2.Alive() }, 5*time.Second, 10*time.Millisecond)
	_, err = qemu.Attach(c.Dir)
	assert.ErrorIs(t, err, qemu.ErrGone)
	assert.True(t, strings.Contains(console(v), "compute-guest: READY"), "the console was written")
}

// A snapshot (device state by migration, guest memory in its shared
// file) restored twice from the same files: each restore maps the
// memory file copy-on-write, runs on from where the snapshot was taken,
// and neither sees the other's writes nor changes the snapshot.
func TestSnapshotRestoredTwice(t *testing.T) {
	im := qemutest.Image(t)
	dir, err := os.MkdirTemp("", "vm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	config := func(id string) *qemu.Config {
		return &qemu.Config{ID: id, Dir: filepath.Join(dir, id), VCPU: 1, MemoryMiB: 256, Accel: qemu.AccelTCG,
			Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline + " compute.hostname=" + id}
	}
	src := config("src")
	src.MemoryFile = filepath.Join(src.Dir, "memory")
	v, err := qemu.Start(t.Context(), src)
	require.NoError(t, err)
	t.Cleanup(func() { _ = v.Kill() })
	g := guestReady(t, v)
	call(t, g, guestproto.Request{Op: guestproto.OpWriteFile, File: &guestproto.File{Path: "/root/before", Data: []byte("snapshotted")}})

	snap := filepath.Join(dir, "snap")
	require.NoError(t, os.MkdirAll(snap, 0o700))
	require.NoError(t, v.Pause())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, v.SaveState(ctx, filepath.Join(snap, "state")))
	t.Logf("device state saved in %s", time.Since(start).Round(time.Millisecond))
	require.NoError(t, v.Kill())
	require.NoError(t, os.Rename(src.MemoryFile, filepath.Join(snap, "memory")))
	before, err := os.ReadFile(filepath.Join(snap, "memory"))
	require.NoError(t, err)

	restore := func(id string) *qemu.Guest {
		c := config(id)
		c.MemoryFile, c.MemoryPrivate, c.Incoming = filepath.Join(snap, "memory"), true, filepath.Join(snap, "state")
		start := time.Now()
		v, err := qemu.Start(ctx, c)
		require.NoError(t, err, "qemu.log: %s", func() string { b, _ := os.ReadFile(filepath.Join(c.Dir, "qemu.log")); return string(b) }())
		t.Cleanup(func() { _ = v.Kill() })
		started := time.Since(start)
		g, err := v.Guest()
		require.NoError(t, err)
		r := call(t, g, guestproto.Request{Op: guestproto.OpPing})
		require.True(t, r.Status.RootOK)
		t.Logf("%s: qemu and its state in %s, then the guest answered in %s", id, started.Round(time.Millisecond), (time.Since(start) - started).Round(time.Millisecond))
		return g
	}
	a, b := restore("a"), restore("b")
	// A third restore into a qemu started ahead (a restore pool's): its
	// state loaded, its guest run on to a ping and paused again, it waits
	// with its QMP connection held, moves to the VM's directory and only
	// then runs on.
	c := config("pooled")
	c.MemoryFile, c.MemoryPrivate, c.Incoming = filepath.Join(snap, "memory"), true, filepath.Join(snap, "state")
	pv, err := qemu.Prestart(ctx, c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pv.Kill() })
	require.NoError(t, pv.Move(filepath.Join(dir, "moved"), "moved"))
	require.True(t, pv.Alive(), "Alive finds qemu by the directory it was started in")
	// Its held connection broke while it waited: the restore goes on a new one.
	held := qemu.MonitorConn(pv)
	qemu.BreakMonitor(pv)
	start = time.Now()
	require.NoError(t, pv.Restore(ctx))
	restored := time.Since(start)
	st, err := pv.Status()
	require.NoError(t, err, "the restore's QMP connection stays the VM's")
	assert.Equal(t, "running", st)
	assert.NotSame(t, held, qemu.MonitorConn(pv), "a new connection replaced the broken one")
	pg, err := pv.Guest()
	require.NoError(t, err)
	require.True(t, call(t, pg, guestproto.Request{Op: guestproto.OpPing}).Status.RootOK)
	t.Logf("prestarted: running in %s, then the guest answered in %s", restored.Round(time.Millisecond), (time.Since(start) - restored).Round(time.Millisecond))
	// The daemon restarts (it lets go of the VM's QMP connection, which
	// qemu serves to one client at a time): the moved VM is re-attached by
	// its new directory.
	pv.Detach()
	moved, err := qemu.Attach(filepath.Join(dir, "moved"))
	require.NoError(t, err, "a moved VM is re-attached by its new directory")
	assert.Equal(t, pv.Pid, moved.Pid)
	pv = moved
	pg, err = pv.Guest()
	require.NoError(t, err)
	// It is snapshotted as any restored VM is (its memory then in the
	// state, since it maps its snapshot's privately).
	require.NoError(t, pv.Pause())
	require.NoError(t, pv.SaveState(ctx, filepath.Join(dir, "moved-state")))
	require.NoError(t, pv.Resume())
	for _, g := range []*qemu.Guest{a, b, pg} {
		r := call(t, g, guestproto.Request{Op: guestproto.OpReadFile, File: &guestproto.File{Path: "/root/before"}})
		assert.Equal(t, "snapshotted", string(r.Data))
	}
	call(t, a, guestproto.Request{Op: guestproto.OpWriteFile, File: &guestproto.File{Path: "/root/after", Data: []byte("a")}})
	r := call(t, b, guestproto.Request{Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{"/bin/sh", "-c", "ls /root"}}})
	assert.Equal(t, "before\n", string(r.Exec.Stdout), "b does not see a's write")
	after, err := os.ReadFile(filepath.Join(snap, "memory"))
	require.NoError(t, err)
	assert.True(t, string(before) == string(after), "the snapshot's memory file is unchanged")
}

// A VM started nice runs every thread nice, until SetNice raises them.
func TestNice(t *testing.T) {
	im := qemutest.Image(t)
	dir, err := os.MkdirTemp("", "vm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &qemu.Config{ID: "nice", Dir: filepath.Join(dir, "nice"), VCPU: 1, MemoryMiB: 128, Accel: qemu.AccelTCG,
		Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline, Nice: 10}
	v, err := qemu.Start(t.Context(), c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = v.Kill() })
	nices := func() map[int]bool {
		out := map[int]bool{}
		tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(v.Pid), "task", "*", "stat"))
		require.NoError(t, err)
		for _, p := range tasks {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			// pid (comm) state ... the 19th field is the nice value.
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
			n, err := strconv.Atoi(f[16])
			require.NoError(t, err)
			out[n] = true
		}
		return out
	}
	assert.Equal(t, map[int]bool{10: true}, nices())
	require.NoError(t, v.SetNice(0))
	assert.Equal(t, map[int]bool{0: true}, nices())
}

// A VM's QMP commands share one held connection: a watcher's status
// checks and pauses and resumes sent at the same time are serialized on
// it (each answered, none on a connection of its own), and when the
// connection breaks the next command dials a new one and is answered.
func TestHeldMonitor(t *testing.T) {
	im := qemutest.Image(t)
	dir, err := os.MkdirTemp("", "vm") // short: unix socket paths
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &qemu.Config{ID: "vm-mon", Dir: filepath.Join(dir, "vm"), VCPU: 1, MemoryMiB: 256, Accel: qemu.AccelTCG,
		Machine: qemu.MachineMicroVM, Kernel: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline + " compute.hostname=vm-mon"}
	v, err := qemu.Start(t.Context(), c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = v.Kill() })
	g := guestReady(t, v)
	held := qemu.MonitorConn(v)
	require.NotNil(t, held, "the start's QMP connection is held")

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 3 { // watchers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				st, err := v.Status()
				if err == nil && st != "running" && st != "paused" {
					err = fmt.Errorf("status %q", st)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // claims
		defer wg.Done()
		for range 10 {
			if err := v.Pause(); err != nil {
				errs <- err
			}
			if err := v.Resume(); err != nil {
				errs <- err
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	st, err := v.Status()
	require.NoError(t, err)
	assert.Equal(t, "running", st)
	assert.Same(t, held, qemu.MonitorConn(v), "every command went on the held connection")

	// The connection breaks under the VM: the next command reconnects.
	qemu.BreakMonitor(v)
	st, err = v.Status()
	require.NoError(t, err)
	assert.Equal(t, "running", st)
	again := qemu.MonitorConn(v)
	require.NotNil(t, again)
	assert.NotSame(t, held, again, "a new connection replaced the broken one")
	require.NoError(t, v.Pause())
	require.NoError(t, v.Resume())
	assert.Same(t, again, qemu.MonitorConn(v))
	assert.True(t, call(t, g, guestproto.Request{Op: guestproto.OpPing}).Status.RootOK, "the guest runs on")

	// What the held connection saves a resume, in the same run: a cont on
	// it against a cont on a connection of its own (greeting and
	// capabilities first), interleaved, medians logged.
	var onHeld, fresh []time.Duration
	for range 15 {
		require.NoError(t, v.Pause())
		start := time.Now()
		require.NoError(t, v.Resume())
		onHeld = append(onHeld, time.Since(start))
		require.NoError(t, v.Pause())
		qemu.BreakMonitor(v)
		start = time.Now()
		require.NoError(t, v.Resume())
		fresh = append(fresh, time.Since(start))
	}
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("resume: %s on the held connection, %s on a new one (medians of 15)", median(onHeld), median(fresh))
}
