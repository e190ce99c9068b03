// Package qemu runs virtual machines with qemu-system-x86_64: it builds the
// command line from a Config (microvm, or q35 where a device needs it;
// KVM when a probe boot proved it works, TCG otherwise), starts qemu
// detached so that a VM outlives a restart of the daemon that started it,
// re-attaches to a running VM by its directory (QMP socket, pid file),
// drives it over QMP through github.com/digitalocean/go-qemu, and talks to
// compute-guest inside it over a virtio-serial port (guestproto).
//
// Everything of one VM lives in its directory: config.json, qemu.pid,
// qmp.sock, guest.sock, serial.sock, console.log and qemu.log.
package qemu

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"computeplane/internal/guestproto"
)

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// Machine types.
const (
	MachineMicroVM = "microvm"
	MachineQ35     = "q35"
)

// Binary is the qemu system emulator.
var Binary = "qemu-system-x86_64"

// Through is a command a VM's qemu is started through, which must exec
// qemu in its place (same pid), e.g. nsenter into another network
// namespace (compute-agent's --net-netns); empty: qemu directly.
var Through []string

// Disk is one virtio disk.
type Disk struct {
	Path     string `json:"path"`
	Serial   string `json:"serial"` // at most 20 characters (virtio-blk)
	Format   string `json:"format"` // raw or qcow2
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Config is what a VM is started with; it is kept in the VM's directory.
type Config struct {
	ID        string `json:"id"`
	Dir       string `json:"dir"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int    `json:"memoryMiB"`
	Accel     string `json:"accel"`
	Machine   string `json:"machine"`
	Kernel    string `json:"kernel,omitempty"`
	Initrd    string `json:"initrd,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Disks     []Disk `json:"disks,omitempty"`
	// MemoryFile keeps guest memory in a shared file (snapshots move
	// device state only); empty uses anonymous memory.
	MemoryFile string `json:"memoryFile,omitempty"`
	// MemoryPrivate maps MemoryFile copy-on-write instead (share=off):
	// the guest starts from the file's pages and never writes the file,
	// so a snapshot's memory file serves any number of restores without
	// a copy, its pages shared in the page cache. A snapshot of such a VM
	// carries its memory in the migration stream.
	MemoryPrivate bool `json:"memoryPrivate,omitempty"`
	// Nice starts qemu at this CPU niceness (0: as the caller): work
	// that nobody waits for yet, such as a warm instance, yields the CPU
	// to work somebody does (SetNice raises it later).
	Nice int `json:"nice,omitempty"`
	// Incoming restores a saved state (a migration stream file).
	Incoming string `json:"incoming,omitempty"`
	// Paused keeps the vCPUs stopped once started or restored (-S),
	// until a cont.
	Paused bool `json:"paused,omitempty"`
	// Net is the VM's one network card; nil is none (-nodefaults leaves
	// no other).
	Net *NetDevice `json:"net,omitempty"`
	// ExecDir is the directory qemu was started in when the VM's
	// directory moved since (VM.Move: a prestarted restore): qemu's
	// command line names its files there. Empty: Dir.
	ExecDir string `json:"execDir,omitempty"`
}

// NetDevice is a virtio-net card on a tap the host made beforehand
// (compute-agent's network manager): qemu opens it by name and runs no
// script on it.
type NetDevice struct {
	Tap string `json:"tap"`
	MAC string `json:"mac"`
}

// Paths of a VM's files.
func (c *Config) path(name string) string { return filepath.Join(c.Dir, name) }

// QMPSocket is the QMP socket's path.
func (c *Config) QMPSocket() string { return c.path("qmp.sock") }

// execQMPSocket is the QMP socket's path on qemu's command line.
func (c *Config) execQMPSocket() string {
	if c.ExecDir != "" {
		return filepath.Join(c.ExecDir, "qmp.sock")
	}
	return c.QMPSocket()
}

// GuestSocket is the guest channel's path.
func (c *Config) GuestSocket() string { return c.path("guest.sock") }

// SerialSocket is the serial console's socket (qemu's socket chardev):
// what the console tunnels read and write (console.go).
func (c *Config) SerialSocket() string { return c.path("serial.sock") }

// PidFile is qemu's pid file.
func (c *Config) PidFile() string { return c.path("qemu.pid") }

// Console is the serial console's log.
func (c *Config) Console() string { return c.path("console.log") }

// Check names the first problem of a config.
func (c *Config) Check() error {
	switch {
	case c.ID == "" || strings.ContainsAny(c.ID, "/ \t\n,"):
		return fmt.Errorf("qemu: id %q", c.ID)
	case !filepath.IsAbs(c.Dir):
		return errors.New("qemu: the directory is an absolute path")
	case len(c.GuestSocket()) > 100:
		return fmt.Errorf("qemu: %s is too long for a unix socket", c.GuestSocket())
	case c.VCPU < 1 || c.VCPU > 64:
		return errors.New("qemu: vcpu is 1 to 64")
	case c.MemoryMiB < 64:
		return errors.New("qemu: at least 64 MiB of memory")
	case c.Accel != AccelKVM && c.Accel != AccelTCG:
		return fmt.Errorf("qemu: accel %q", c.Accel)
	case c.Machine != MachineMicroVM && c.Machine != MachineQ35:
		return fmt.Errorf("qemu: machine %q", c.Machine)
	case c.Kernel == "" && len(c.Disks) == 0:
		return errors.New("qemu: a kernel or a boot disk")
	}
	if n := c.Net; n != nil {
		if hw, err := net.ParseMAC(n.MAC); err != nil || len(hw) != 6 {
			return fmt.Errorf("qemu: mac %q", n.MAC)
		}
		if n.Tap == "" || len(n.Tap) > 15 || strings.ContainsAny(n.Tap, ",= /\t\n") {
			return fmt.Errorf("qemu: tap %q", n.Tap)
		}
	}
	for _, d := range c.Disks {
		switch {
		case d.Serial == "" || len(d.Serial) > 20 || strings.ContainsAny(d.Serial, ", \t\n"):
			return fmt.Errorf("qemu: disk serial %q (1 to 20 characters, no commas or spaces)", d.Serial)
		case d.Format != "raw" && d.Format != "qcow2":
			return fmt.Errorf("qemu: disk format %q", d.Format)
		case strings.Contains(d.Path, ","):
			return fmt.Errorf("qemu: disk path %q holds a comma", d.Path)
		}
	}
	return nil
}

// tscKHz is the host's TSC frequency for the kernel command line under
// TCG: without it a guest kernel on microvm hangs calibrating the TSC or
// runs its clock at the wrong speed.
var tscKHz = sync.OnceValue(func() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(mhz * 1000)
			}
		}
	}
	return 0
})

// Args is qemu's command line for c.
func (c *Config) Args() []string {
	machine := "q35"
	bus := "pci"
	if c.Machine == MachineMicroVM {
		// The PIT, PIC and RTC keep a stock kernel from hanging at boot
		// under TCG.
		machine, bus = "microvm,pit=on,pic=on,rtc=on", "device"
	}
	if c.MemoryFile != "" {
		machine += ",memory-backend=mem"
	}
	a := []string{
		"-name", c.ID, "-M", machine, "-accel", c.Accel,
		"-m", strconv.Itoa(c.MemoryMiB) + "M", "-smp", strconv.Itoa(c.VCPU),
		"-nodefaults", "-no-user-config", "-display", "none",
		"-pidfile", c.PidFile(),
		"-qmp", "unix:" + c.QMPSocket() + ",server=on,wait=off",
		// The serial port is a socket chardev a console connects to; its
		// logfile keeps everything the guest wrote, connected or not.
		"-chardev", "socket,id=serial0,path=" + c.SerialSocket() + ",server=on,wait=off,logfile=" + c.Console(),
		"-serial", "chardev:serial0",
		"-device", "virtio-serial-" + bus,
		"-chardev", "socket,id=guest,path=" + c.GuestSocket() + ",server=on,wait=off",
		"-device", "virtserialport,chardev=guest,name=" + guestproto.PortName,
	}
	if c.Accel == AccelKVM {
		a = append(a, "-cpu", "host,-arch-capabilities")
	} else {
		a = append(a, "-cpu", "max")
	}
	if c.MemoryFile != "" {
		share := "on"
		if c.MemoryPrivate {
			share = "off"
		}
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", c.MemoryMiB, c.MemoryFile, share))
	}
	if c.Kernel != "" {
		// compute-guest waits for this many disks to appear, no longer.
		cmdline := strings.TrimSpace(c.Cmdline + " compute.disks=" + strconv.Itoa(len(c.Disks)))
		if c.Accel == AccelTCG && c.Machine == MachineMicroVM && tscKHz() > 0 && !strings.Contains(cmdline, "tsc_early_khz=") {
			cmdline = strings.TrimSpace(cmdline + " tsc_early_khz=" + strconv.Itoa(tscKHz()))
		}
		a = append(a, "-kernel", c.Kernel, "-append", cmdline)
		if c.Initrd != "" {
			a = append(a, "-initrd", c.Initrd)
		}
	}
	for i, d := range c.Disks {
		drive := fmt.Sprintf("if=none,id=d%d,file=%s,format=%s", i, d.Path, d.Format)
		if d.ReadOnly {
			drive += ",readonly=on"
		}
		a = append(a, "-drive", drive, "-device", fmt.Sprintf("virtio-blk-%s,drive=d%d,serial=%s", bus, i, d.Serial))
	}
	if n := c.Net; n != nil {
		a = append(a, "-netdev", "tap,id=n0,ifname="+n.Tap+",script=no,downscript=no",
			"-device", "virtio-net-"+bus+",netdev=n0,mac="+n.MAC)
	}
	if c.Paused {
		a = append(a, "-S")
	}
	if c.Incoming != "" {
		// The state goes in by QMP once the capabilities are set (Start).
		a = append(a, "-incoming", "defer")
	}
	return a
}

func (c *Config) save() error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := c.path("config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.path("config.json"))
}

// LoadConfig reads the config a VM was started with.
func LoadConfig(dir string) (*Config, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("qemu: %s: %w", dir, err)
	}
	return &c, nil
}

// waitFor polls cond every 5 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
