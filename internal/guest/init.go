package guest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"computeplane/internal/guestproto"
)

// ModulesFile lists, one path per line in load order, the kernel modules
// a minimal image loads at boot (written by images/build.sh).
const ModulesFile = "/etc/compute-guest/modules"

// Main is compute-guest's main: PID 1 set-up when it is init, then the
// port loop, forever (an init must not exit).
func Main() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(os.Args) > 1 && os.Args[1] == sshServeCommand {
		return sshServeMain(log) // one SSH connection on stdin and stdout (sshd.go)
	}
	pid1 := os.Getpid() == 1
	var boot bootTimes
	if pid1 {
		// The kernel starts init with no PATH.
		_ = os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
		if err := initSystem(log, &boot); err != nil {
			log.Error("compute-guest: init", "error", err.Error())
		}
		go reapOrphans()
	}
	a := NewAgent(log)
	a.applyCmdline(log)
	if pid1 {
		go a.consoleShell(log)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	// A virtio-serial port opens once in a guest: keep the one descriptor
	// for good. Reads end (EOF) while no host is connected; serve again,
	// with a ready event, for the next host (a daemon that restarted).
	var port *os.File
	for port == nil && ctx.Err() == nil {
		var err error
		if port, err = openPort(ctx); err != nil {
			log.Error("compute-guest: no guest port", "error", err.Error())
			time.Sleep(time.Second)
		}
	}
	if pid1 {
		// Where a boot went, read from the serial console (docs/benchmarks-notes.md).
		boot.ready = uptime()
		fmt.Fprintf(os.Stderr, "compute-guest: READY (%s)\n", boot)
	} else {
		fmt.Fprintln(os.Stderr, "compute-guest: READY")
	}
	for ctx.Err() == nil {
		if err := a.Serve(ctx, port); err != nil {
			log.Warn("compute-guest: port", "error", err.Error())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0
}

// bootTimes are the guest's uptime (the kernel's clock since it started)
// at the steps of a boot.
type bootTimes struct{ init, modules, disks, ready time.Duration }

func (b bootTimes) String() string {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	return fmt.Sprintf("uptime ms: init %d, modules loaded %d, disks %d, ready %d", ms(b.init), ms(b.modules), ms(b.disks), ms(b.ready))
}

// uptime is the kernel's CLOCK_BOOTTIME.
func uptime() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// initSystem does what an init does before anything else: kernel
// filesystems, modules, loopback, disks named by serial.
func initSystem(log *slog.Logger, boot *bootTimes) error {
	boot.init = uptime()
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
			log.Warn("mount", "what", m.dst, "error", err.Error())
		}
	}
	// Pseudo-terminals (exec tunnels with a tty): devpts, and /dev/ptmx
	// when devtmpfs has none.
	_ = os.MkdirAll("/dev/pts", 0o755)
	if err := syscall.Mount("devpts", "/dev/pts", "devpts", 0, "gid=5,mode=620,ptmxmode=666"); err != nil && !errors.Is(err, syscall.EBUSY) {
		log.Warn("mount", "what", "/dev/pts", "error", err.Error())
	}
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	// Loopback up, with or without a network card: servers on
	// 127.0.0.1 answer the tcp tunnels.
	if lo, err := netlink.LinkByName("lo"); err == nil {
		if err := netlink.LinkSetUp(lo); err != nil {
			log.Warn("loopback", "error", err.Error())
		}
	}
	loadModules(log)
	boot.modules = uptime()
	// Loopback up, as every init does: programs that talk to themselves
	// (127.0.0.1, or the card's own address, routed through lo) need it,
	// with a network or without.
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		log.Warn("loopback", "error", err.Error())
	}
	_ = os.MkdirAll("/dev/disk/by-id", 0o755)
	// Block devices appear as their driver probes. The host says how many
	// to expect (compute.disks=N); without it, wait for at least one.
	want, told := expectedDisks()
	for i := 0; i < 50; i++ {
		if n := linkDisks(); (told && n >= want) || (!told && n > 0) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	boot.disks = uptime()
	return nil
}

// expectedDisks reads compute.disks=N from the kernel command line.
func expectedDisks() (int, bool) {
	raw, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(raw)) {
		if v, ok := strings.CutPrefix(f, "compute.disks="); ok {
			n, err := strconv.Atoi(v)
			return n, err == nil
		}
	}
	return 0, false
}

func loadModules(log *slog.Logger) {
	f, err := os.Open(ModulesFile)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, when, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if path == "" || strings.HasPrefix(path, "#") || !moduleWanted("/sys", strings.TrimSpace(when)) {
			continue
		}
		m, err := os.Open(path)
		if err != nil {
			log.Warn("module", "path", path, "error", err.Error())
			continue
		}
		if err := unix.FinitModule(int(m.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
			log.Warn("module", "path", path, "error", err.Error())
		}
		_ = m.Close()
	}
}

// moduleWanted decides a module line's condition (ModulesFile) from sysfs
// at sys: "pci" loads it only on a machine with a PCI bus, "virtio:N" only
// when a virtio device of id N is there (1 is a network card), none
// always. Loading a module costs tens of milliseconds under emulation.
func moduleWanted(sys, when string) bool {
	switch {
	case when == "":
		return true
	case when == "pci":
		devs, _ := filepath.Glob(filepath.Join(sys, "bus/pci/devices/*"))
		return len(devs) > 0
	case strings.HasPrefix(when, "virtio:"):
		want, err := strconv.ParseUint(strings.TrimPrefix(when, "virtio:"), 0, 32)
		if err != nil {
			return true
		}
		ids, _ := filepath.Glob(filepath.Join(sys, "bus/virtio/devices/*/device"))
		for _, p := range ids {
			b, _ := os.ReadFile(p)
			if id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32); err == nil && id == want {
				return true
			}
		}
		return false
	}
	return true // a condition this version does not know
}

// linkDisks makes /dev/disk/by-id/virtio-<serial> for every virtio disk
// with a serial (there is no udev here) and returns how many disks it saw.
func linkDisks() int {
	blocks, _ := filepath.Glob("/sys/block/vd*")
	for _, b := range blocks {
		serial, err := os.ReadFile(filepath.Join(b, "serial"))
		if err != nil || len(strings.TrimSpace(string(serial))) == 0 {
			continue
		}
		link := "/dev/disk/by-id/virtio-" + strings.TrimSpace(string(serial))
		_ = os.Remove(link)
		_ = os.Symlink("/dev/"+filepath.Base(b), link)
	}
	return len(blocks)
}

// reapOrphans collects the exit status of processes re-parented to PID 1
// that no one waits for. It only reaps processes whose parent is gone
// (their PPid is 1 and no os/exec waits for them) by polling.
func reapOrphans() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD)
	for range sigs {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...: a zombie child of ours started
			// by something we did not start ourselves.
			s := string(stat)
			rp := strings.LastIndexByte(s, ')')
			if rp < 0 || len(s) < rp+4 || s[rp+2] != 'Z' {
				continue
			}
			var pid int
			if _, err := fmt.Sscan(e.Name(), &pid); err != nil || tracked(pid) {
				continue
			}
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
	}
}

// tracked reports whether an exec request waits for pid (os/exec reaps
// its own children).
func tracked(pid int) bool {
	running.Lock()
	defer running.Unlock()
	return running.pids[pid]
}

// openPort waits for the virtio-serial port named PortName and opens it.
func openPort(ctx context.Context) (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if dev := findPort(); dev != "" {
			return os.OpenFile(dev, os.O_RDWR, 0)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no virtio-serial port named %s", guestproto.PortName)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func findPort() string {
	names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err == nil && strings.TrimSpace(string(b)) == guestproto.PortName {
			return "/dev/" + filepath.Base(filepath.Dir(n))
		}
	}
	return ""
}

// applyCmdline takes the identity the host put on the kernel command line
// (compute.hostname=, compute.env=<base64 of KEY=VALUE lines>, compute.net=
// <base64url JSON of guestproto.Network>) and runs
// compute.userdata=<base64 script> once, at boot.
func (a *Agent) applyCmdline(log *slog.Logger) {
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return
	}
	id := guestproto.Identity{Hostname: a.hostname(), Env: map[string]string{}}
	var userData []byte
	for _, f := range strings.Fields(string(raw)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "compute.hostname":
			id.Hostname = v
		case "compute.env":
			b, _ := base64.RawURLEncoding.DecodeString(v)
			for _, line := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					id.Env[k] = v
				}
			}
		case "compute.net":
			n, err := netFromCmdline(v)
			if err != nil {
				log.Warn("network", "error", err.Error())
				continue
			}
			id.Network = n
		case "compute.userdata":
			userData, _ = base64.RawURLEncoding.DecodeString(v)
		}
	}
	if err := a.setIdentity(&id); err != nil {
		log.Warn("identity", "error", err.Error())
	}
	if len(userData) > 0 {
		_ = os.WriteFile("/run/user-data", userData, 0o600)
		if strings.HasPrefix(string(userData), "#!") {
			r := a.exec(context.Background(), &guestproto.Exec{Argv: []string{"/bin/sh", "/run/user-data"}, TimeoutMs: 60_000})
			if r.Exec != nil {
				_ = os.WriteFile("/run/user-data.log", append(r.Exec.Stdout, r.Exec.Stderr...), 0o600)
			}
		}
	}
}

// mount mounts a volume by its serial, formatting it ext4 first when it
// holds no filesystem and the request allows it.
func (a *Agent) mount(m *guestproto.Mount) error {
	linkDisks()
	dev, err := filepath.EvalSymlinks(a.path("/dev/disk/by-id/virtio-" + m.Serial))
	if err != nil {
		return fmt.Errorf("no disk with serial %s", m.Serial)
	}
	has, err := hasExtFS(dev)
	if err != nil {
		return err
	}
	if !has {
		if !m.Format || m.ReadOnly {
			return fmt.Errorf("disk %s holds no filesystem", m.Serial)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
			return fmt.Errorf("mkfs.ext4 %s: %v: %s", m.Serial, err, out)
		}
	}
	target := a.path(m.Path)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if m.ReadOnly {
		// noload: a read-only disk cannot replay a journal; the writer's
		// host froze the filesystem (quiesceVolumes) before it let go, so
		// everything is in place.
		return syscall.Mount(dev, target, "ext4", syscall.MS_RDONLY, "noload")
	}
	if err := syscall.Mount(dev, target, "ext4", 0, ""); err != nil {
		return err
	}
	a.mu.Lock()
	a.writable = append(a.writable, target)
	a.mu.Unlock()
	return nil
}

// Filesystem freeze and thaw (linux/fs.h): a freeze writes everything of
// the filesystem in place, journal included.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// quiesceVolumes freezes and thaws each volume mounted read-write, so that
// a host that ends the VM next leaves a filesystem that reads whole
// without its journal (read-only attachments mount it with noload).
func (a *Agent) quiesceVolumes() {
	a.mu.Lock()
	targets := append([]string(nil), a.writable...)
	a.mu.Unlock()
	for _, t := range targets {
		f, err := os.Open(t)
		if err != nil {
			continue
		}
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), ioctlFIFREEZE, 0); e == 0 {
			_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), ioctlFITHAW, 0)
		}
		_ = f.Close()
	}
}

// hasExtFS reads the ext2/3/4 superblock magic (0xEF53 at byte 1080).
func hasExtFS(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := f.ReadAt(magic[:], 1080); err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return binary.LittleEndian.Uint16(magic[:]) == 0xEF53, nil
}

// consoleShell offers a shell on the serial console, as busybox init's
// askfirst does: after Enter, a login shell whose controlling terminal is
// the console, and again when it exits. The console reaches a tenant only
// through a console tunnel, which is as trusted as an exec.
func (a *Agent) consoleShell(log *slog.Logger) {
	const dev = "/dev/ttyS0"
	for {
		tty, err := os.OpenFile(dev, os.O_RDWR|syscall.O_NOCTTY, 0)
		if err != nil {
			log.Info("compute-guest: no console shell", "error", err.Error())
			return
		}
		_, _ = io.WriteString(tty, "\r\nPlease press Enter to activate this console.\r\n")
		if _, err := bufio.NewReader(tty).ReadString('\n'); err != nil {
			_ = tty.Close()
			time.Sleep(time.Second)
			continue
		}
		cmd := exec.Command("/bin/sh", "-l")
		cmd.Env = append(a.environ(nil), "TERM=vt100")
		cmd.Dir = "/root"
		if _, err := os.Stat(cmd.Dir); err != nil {
			cmd.Dir = "/"
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := startTracked(cmd); err == nil {
			_ = cmd.Wait()
			untrack(cmd.Process.Pid)
		} else {
			log.Warn("compute-guest: console shell", "error", err.Error())
			time.Sleep(time.Second)
		}
		_ = tty.Close()
	}
}
