// Package qemudriver treats a qemu virtual machine as a metal host, so
// that a whole metal provisioning run can be exercised on machines
// without a BMC. The host is a directory: its "hardware" (vCPUs, memory,
// one local disk disk0.raw), its persistent firmware settings (boot
// device, virtual media) in host.json, and the VM qemu runs (vm/).
//
// Power and media map onto qemu as follows:
//
//   - power on starts qemu detached (it outlives the driver's process,
//     like a server outlives its BMC session); power off kills it (forced
//     off); reset kills and starts it again, so boot settings changed
//     since the last start take effect, as at a real POST;
//   - virtual media in slot cd holding a kernel+initrd image is the boot
//     CD: booting from cd direct-boots its kernel and initrd (the
//     in-memory agent); media holding a disk image (raw, iso) appear to
//     the host as read-only virtio disks with serial vmedia-<slot>;
//     changes take effect at the next power on or reset;
//   - booting from disk is the driver's firmware: it reads /boot/vmlinux,
//     /boot/initrd and /boot/cmdline from the ext4 filesystem that fills
//     disk0 (debugfs, no mount) and direct-boots them, the way microvm
//     firmware-less boots work; a disk without them does not boot;
//   - power, boot and media go through QMP (internal/qemu) where the VM
//     runs; the agent is compute-guest on the guest channel.
package qemudriver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"computeplane/internal/drivers"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// Name is the driver's name in a metal host's record.
const Name = "qemu"

// DiskSerial is the serial of the host's local disk.
const DiskSerial = "disk0"

// Config is a qemu metal host.
type Config struct {
	// Dir holds everything of the host; short (unix socket paths).
	Dir       string `json:"dir"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int    `json:"memoryMiB"`
	DiskBytes int64  `json:"diskBytes"`
	// Accel is tcg or kvm; empty is tcg (decide kvm by a probe boot
	// elsewhere, never by /dev/kvm).
	Accel string `json:"accel,omitempty"`
}

// state is the host's firmware settings, kept across power cycles and
// across processes (a workflow resumed by another worker sees them).
type state struct {
	Serial     string                   `json:"serial"`
	BootDevice string                   `json:"bootDevice"`
	BootOnce   string                   `json:"bootOnce,omitempty"`
	Media      map[string]drivers.Media `json:"media"`
}

// Driver is one qemu metal host.
type Driver struct {
	cfg Config
	mu  sync.Mutex
}

var _ drivers.Driver = (*Driver)(nil)

// Open is the driver's drivers.Opener.
func Open(_ context.Context, raw json.RawMessage) (drivers.Driver, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("qemudriver: config: %w", err)
	}
	return New(c)
}

// New checks c and creates the host's directory and disk when missing.
func New(c Config) (*Driver, error) {
	if c.VCPU == 0 {
		c.VCPU = 1
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 256
	}
	if c.DiskBytes == 0 {
		c.DiskBytes = 256 << 20
	}
	if c.Accel == "" {
		c.Accel = qemu.AccelTCG
	}
	switch {
	case !filepath.IsAbs(c.Dir):
		return nil, errors.New("qemudriver: dir is an absolute path")
	case len(c.Dir) > 60:
		return nil, errors.New("qemudriver: dir is at most 60 characters (unix socket paths under it)")
	case c.DiskBytes < 16<<20:
		return nil, errors.New("qemudriver: diskBytes is at least 16 MiB")
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, err
	}
	disk := filepath.Join(c.Dir, "disk0.raw")
	if _, err := os.Stat(disk); errors.Is(err, os.ErrNotExist) {
		f, err := os.OpenFile(disk, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if err == nil {
			err = f.Truncate(c.DiskBytes)
			_ = f.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	d := &Driver{cfg: c}
	if _, err := os.Stat(d.statePath()); errors.Is(err, os.ErrNotExist) {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		if err := d.save(&state{Serial: "QEMU-" + strings.ToUpper(hex.EncodeToString(b)), BootDevice: drivers.BootDisk,
			Media: map[string]drivers.Media{}}); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (d *Driver) statePath() string { return filepath.Join(d.cfg.Dir, "host.json") }
func (d *Driver) vmDir() string     { return filepath.Join(d.cfg.Dir, "vm") }

// DiskPath is the host's local disk.
func (d *Driver) DiskPath() string { return filepath.Join(d.cfg.Dir, "disk0.raw") }

func (d *Driver) load() (*state, error) {
	b, err := os.ReadFile(d.statePath())
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("qemudriver: %s: %w", d.statePath(), err)
	}
	if s.Media == nil {
		s.Media = map[string]drivers.Media{}
	}
	return &s, nil
}

func (d *Driver) save(s *state) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.statePath())
}

// vm is the running VM, or nil when the host is off.
func (d *Driver) vm() (*qemu.VM, error) {
	if _, err := os.Stat(filepath.Join(d.vmDir(), "config.json")); err != nil {
		return nil, nil
	}
	v, err := qemu.Attach(d.vmDir())
	if errors.Is(err, qemu.ErrGone) {
		return nil, nil
	}
	return v, err
}

// PowerState is on while the host's qemu runs.
func (d *Driver) PowerState(context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running() {
		return drivers.PowerOn, nil
	}
	return drivers.PowerOff, nil
}

// running checks the pid without a QMP connection.
func (d *Driver) running() bool {
	c, err := qemu.LoadConfig(d.vmDir())
	if err != nil {
		return false
	}
	b, err := os.ReadFile(c.PidFile())
	if err != nil {
		return false
	}
	pid := strings.TrimSpace(string(b))
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	if rp := bytes.LastIndexByte(stat, ')'); rp > 0 && len(stat) > rp+2 && stat[rp+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	return err == nil && bytes.Contains(cmdline, []byte(c.QMPSocket()))
}

// Power turns the host on, off or resets it.
func (d *Driver) Power(ctx context.Context, action string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch action {
	case drivers.ActionOn:
		if d.running() {
			return nil
		}
		return d.start(ctx)
	case drivers.ActionOff:
		return d.off()
	case drivers.ActionReset:
		if !d.running() {
			return d.start(ctx)
		}
		// A reset that boots what runs now is a QMP system_reset; one
		// after the boot device or media changed restarts qemu (its
		// command line is the firmware's view of them).
		want, err := d.config()
		if err == nil {
			if cur, lerr := qemu.LoadConfig(d.vmDir()); lerr == nil && sameBoot(cur, want) {
				if v, verr := d.vm(); verr == nil && v != nil {
					defer v.Detach() // qemu serves one QMP client at a time
					return v.Reset()
				}
			}
		}
		if err := d.off(); err != nil {
			return err
		}
		return d.start(ctx)
	}
	return fmt.Errorf("qemudriver: power action %q", action)
}

func (d *Driver) off() error {
	if !d.running() {
		return nil
	}
	v, err := d.vm()
	if err != nil || v == nil {
		qemu.KillDir(d.vmDir())
		return nil
	}
	// QMP quit, then a kill when qemu lingers: a forced off.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return v.Stop(ctx)
}

func sameBoot(a, b *qemu.Config) bool {
	if a.Kernel != b.Kernel || a.Initrd != b.Initrd || a.Cmdline != b.Cmdline || len(a.Disks) != len(b.Disks) {
		return false
	}
	for i := range a.Disks {
		if a.Disks[i] != b.Disks[i] {
			return false
		}
	}
	return true
}

// start boots the host from its boot device.
func (d *Driver) start(ctx context.Context) error {
	c, err := d.config()
	if err != nil {
		return err
	}
	v, err := qemu.Start(ctx, c)
	if err != nil {
		return err
	}
	v.Detach() // it runs on; the next operation attaches (qemu serves one QMP client at a time)
	s, err := d.load()
	if err == nil && s.BootOnce != "" {
		s.BootOnce = ""
		return d.save(s)
	}
	return err
}

// config is the VM the host's firmware settings boot now.
func (d *Driver) config() (*qemu.Config, error) {
	s, err := d.load()
	if err != nil {
		return nil, err
	}
	dev := s.BootDevice
	if s.BootOnce != "" {
		dev = s.BootOnce
	}
	c := &qemu.Config{ID: "metal-" + filepath.Base(d.cfg.Dir), Dir: d.vmDir(), VCPU: d.cfg.VCPU, MemoryMiB: d.cfg.MemoryMiB,
		Accel: d.cfg.Accel, Machine: qemu.MachineMicroVM,
		Disks: []qemu.Disk{{Path: d.DiskPath(), Serial: DiskSerial, Format: "raw"}}}
	for _, slot := range []string{drivers.SlotCD, drivers.SlotUSB} {
		m, ok := s.Media[slot]
		if ok && (m.Format == "raw" || m.Format == "iso") {
			c.Disks = append(c.Disks, qemu.Disk{Path: m.URL, Serial: "vmedia-" + slot, Format: "raw", ReadOnly: true})
		}
	}
	switch dev {
	case drivers.BootCD:
		m, ok := s.Media[drivers.SlotCD]
		if !ok || m.Format != "kernel+initrd" {
			return nil, errors.New("qemudriver: boot from cd: no bootable kernel+initrd media in slot cd")
		}
		c.Kernel, c.Initrd, c.Cmdline = m.URL, m.Initrd, strings.TrimSpace(m.Cmdline+" compute.boot=cd")
	case drivers.BootDisk:
		if err := d.firmware(c); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("qemudriver: cannot boot from %s", dev)
	}
	return c, nil
}

// firmware finds the kernel, initrd and command line on the disk's ext4
// filesystem and copies them out for a direct boot.
func (d *Driver) firmware(c *qemu.Config) error {
	fw := filepath.Join(d.cfg.Dir, "fw")
	if err := os.MkdirAll(fw, 0o700); err != nil {
		return err
	}
	files := map[string]string{}
	for _, name := range []string{"vmlinux", "initrd", "cmdline"} { // in order: the first missing one is named
		out := filepath.Join(fw, name)
		_ = os.Remove(out)
		cmd := exec.Command("debugfs", "-R", "dump /boot/"+name+" "+out, d.DiskPath())
		msg, err := cmd.CombinedOutput()
		if st, serr := os.Stat(out); err != nil || serr != nil || st.Size() == 0 {
			return fmt.Errorf("qemudriver: boot from disk: no /boot/%s on %s (%s)", name, DiskSerial, strings.TrimSpace(lastLine(string(msg))))
		}
		files[name] = out
	}
	cmdline, err := os.ReadFile(files["cmdline"])
	if err != nil {
		return err
	}
	c.Kernel, c.Initrd, c.Cmdline = files["vmlinux"], files["initrd"], strings.TrimSpace(string(cmdline)+" compute.boot=disk")
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// SetBootDevice records the boot device for the next start.
func (d *Driver) SetBootDevice(_ context.Context, device string, once bool) error {
	if device != drivers.BootDisk && device != drivers.BootCD {
		return fmt.Errorf("qemudriver: boot device %q: %w", device, drivers.ErrUnsupported)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.load()
	if err != nil {
		return err
	}
	if once {
		s.BootOnce = device
	} else {
		s.BootDevice, s.BootOnce = device, ""
	}
	return d.save(s)
}

// InsertMedia puts m in its slot (effective at the next start).
func (d *Driver) InsertMedia(_ context.Context, m drivers.Media) error {
	if m.Slot != drivers.SlotCD && m.Slot != drivers.SlotUSB {
		return fmt.Errorf("qemudriver: slot %q (cd or usb)", m.Slot)
	}
	switch m.Format {
	case "kernel+initrd":
		if m.Slot != drivers.SlotCD || m.Initrd == "" {
			return errors.New("qemudriver: kernel+initrd media go in slot cd, with an initrd")
		}
	case "raw", "iso":
	default:
		return fmt.Errorf("qemudriver: media format %q", m.Format)
	}
	if !filepath.IsAbs(m.URL) || strings.Contains(m.URL, ",") {
		return fmt.Errorf("qemudriver: media location %q is not a local absolute path", m.URL)
	}
	if _, err := os.Stat(m.URL); err != nil {
		return fmt.Errorf("qemudriver: media: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.load()
	if err != nil {
		return err
	}
	s.Media[m.Slot] = m
	return d.save(s)
}

// EjectMedia empties slot.
func (d *Driver) EjectMedia(_ context.Context, slot string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.load()
	if err != nil {
		return err
	}
	delete(s.Media, slot)
	return d.save(s)
}

// Console returns the tail of the serial console of the current boot.
func (d *Driver) Console(_ context.Context, max int) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(d.vmDir(), "console.log"))
	if errors.Is(err, os.ErrNotExist) {
		return []byte{}, nil
	}
	if err != nil {
		return nil, err
	}
	if max > 0 && len(b) > max {
		b = b[len(b)-max:]
	}
	return b, nil
}

// Inventory describes the host's configured hardware.
func (d *Driver) Inventory(ctx context.Context) (*drivers.Inventory, error) {
	s, err := d.load()
	if err != nil {
		return nil, err
	}
	power, _ := d.PowerState(ctx)
	st, err := os.Stat(d.DiskPath())
	if err != nil {
		return nil, err
	}
	return &drivers.Inventory{Manufacturer: "QEMU", Model: "microvm", SerialNumber: s.Serial, VCPU: d.cfg.VCPU,
		MemoryMiB: int64(d.cfg.MemoryMiB), Disks: []drivers.Disk{{Name: DiskSerial, Serial: DiskSerial, SizeBytes: st.Size()}},
		NICs: []drivers.NIC{}, PowerState: power}, nil
}

// Agent connects to compute-guest on the host's guest channel.
func (d *Driver) Agent(context.Context) (drivers.Agent, error) {
	if !d.running() {
		return nil, errors.New("qemudriver: the host is off")
	}
	c, err := qemu.LoadConfig(d.vmDir())
	if err != nil {
		return nil, err
	}
	g, err := qemu.DialGuest(c.GuestSocket())
	if err != nil {
		return nil, err
	}
	return &agent{g: g}, nil
}

// Close releases nothing: the host runs on without the driver.
func (d *Driver) Close() error { return nil }

type agent struct{ g *qemu.Guest }

func (a *agent) call(ctx context.Context, r guestproto.Request) (guestproto.Response, error) {
	return a.g.Call(ctx, r)
}

func (a *agent) Status(ctx context.Context) (*drivers.AgentStatus, error) {
	resp, err := a.call(ctx, guestproto.Request{Op: guestproto.OpPing})
	if err != nil {
		return nil, err
	}
	st := &drivers.AgentStatus{}
	if resp.Status != nil {
		st.BootID, st.Hostname, st.UptimeMs = resp.Status.BootID, resp.Status.Hostname, resp.Status.UptimeMs
	}
	if b, err := a.ReadFile(ctx, "/proc/cmdline"); err == nil {
		st.Cmdline = strings.TrimSpace(string(b))
	}
	if b, err := a.ReadFile(ctx, "/proc/sys/kernel/osrelease"); err == nil {
		st.Kernel = strings.TrimSpace(string(b))
	}
	return st, nil
}

func (a *agent) Exec(ctx context.Context, argv []string, timeout time.Duration) (*drivers.ExecResult, error) {
	resp, err := a.call(ctx, guestproto.Request{Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: argv, TimeoutMs: timeout.Milliseconds()}})
	if err != nil {
		return nil, err
	}
	return &drivers.ExecResult{ExitCode: resp.Exec.ExitCode, Stdout: string(resp.Exec.Stdout), Stderr: string(resp.Exec.Stderr),
		TimedOut: resp.Exec.TimedOut}, nil
}

func (a *agent) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	_, err := a.call(ctx, guestproto.Request{Op: guestproto.OpWriteFile, File: &guestproto.File{Path: path, Data: data, Mode: mode}})
	return err
}

func (a *agent) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := a.call(ctx, guestproto.Request{Op: guestproto.OpReadFile, File: &guestproto.File{Path: path}})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

func (a *agent) Close() { a.g.Close() }
