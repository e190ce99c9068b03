// Package drivers is the one interface to bare-metal control that
// workflows use: power (on, off, reset) and its state, the boot device,
// virtual media, the serial console, inventory, and, where a driver can
// reach it, the agent running on the host (the in-memory agent booted
// from virtual media, then the installed system's). Adapters live in
// sub-packages: redfish (BMCs, through github.com/stmcginnis/gofish) and
// qemudriver (a qemu VM treated as a metal host, over QMP).
package drivers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Power states.
const (
	PowerOn  = "on"
	PowerOff = "off"
)

// Power actions.
const (
	ActionOn    = "on"
	ActionOff   = "off"   // forced off: a metal host being provisioned has nothing to flush
	ActionReset = "reset" // forced restart
)

// Boot devices.
const (
	BootDisk = "disk"
	BootCD   = "cd"  // the virtual media in slot cd
	BootPXE  = "pxe" // network boot; the qemu driver does not boot it
)

// Virtual media slots.
const (
	SlotCD  = "cd"
	SlotUSB = "usb"
)

// ErrUnsupported is returned by a driver for what its hardware cannot do
// (an agent channel over Redfish, PXE on the qemu driver).
var ErrUnsupported = errors.New("drivers: not supported by this driver")

// Media is an image inserted as virtual media: a bootable kernel and
// initrd (the in-memory agent), or a disk image (raw or iso) the host
// sees as a read-only disk.
type Media struct {
	Slot      string `json:"slot"`
	ImageID   string `json:"imageId,omitempty"`
	Format    string `json:"format"`            // kernel+initrd, raw or iso
	URL       string `json:"url"`               // where the driver reads it: a path (qemu) or an http(s) URL (Redfish)
	Initrd    string `json:"initrd,omitempty"`  // kernel+initrd
	Cmdline   string `json:"cmdline,omitempty"` // kernel+initrd
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
}

// Disk is one disk of the inventory.
type Disk struct {
	Name      string `json:"name"`
	Serial    string `json:"serial,omitempty"`
	SizeBytes int64  `json:"sizeBytes"`
}

// NIC is one network interface of the inventory.
type NIC struct {
	Name string `json:"name"`
	MAC  string `json:"mac,omitempty"`
}

// Inventory is what a driver knows of the host's hardware.
type Inventory struct {
	Manufacturer string `json:"manufacturer"`
	Model        string `json:"model"`
	SerialNumber string `json:"serialNumber"`
	VCPU         int    `json:"vcpu"`
	MemoryMiB    int64  `json:"memoryMiB"`
	Disks        []Disk `json:"disks"`
	NICs         []NIC  `json:"nics"`
	PowerState   string `json:"powerState"`
}

// Driver controls one metal host. Every method is idempotent: powering on
// a host that is on, inserting the media already inserted or ejecting an
// empty slot succeeds without a change, so a workflow step interrupted
// mid-way can run again.
type Driver interface {
	PowerState(ctx context.Context) (string, error)
	Power(ctx context.Context, action string) error
	// SetBootDevice chooses what the host boots next; once: only the next
	// boot, then back to the persistent choice.
	SetBootDevice(ctx context.Context, device string, once bool) error
	InsertMedia(ctx context.Context, m Media) error
	EjectMedia(ctx context.Context, slot string) error
	// Console returns the last bytes of the serial console, at most max.
	Console(ctx context.Context, max int) ([]byte, error)
	Inventory(ctx context.Context) (*Inventory, error)
	// Agent reaches the agent running on the host, or ErrUnsupported.
	Agent(ctx context.Context) (Agent, error)
	Close() error
}

// AgentStatus is what an agent says of the system it runs in.
type AgentStatus struct {
	BootID   string `json:"bootId"`
	Kernel   string `json:"kernel"`
	Hostname string `json:"hostname"`
	UptimeMs int64  `json:"uptimeMs"`
	Cmdline  string `json:"cmdline"`
}

// ExecResult is a finished command on the host.
type ExecResult struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timedOut,omitempty"`
}

// Agent is a connection to the agent on a host.
type Agent interface {
	Status(ctx context.Context) (*AgentStatus, error)
	Exec(ctx context.Context, argv []string, timeout time.Duration) (*ExecResult, error)
	WriteFile(ctx context.Context, path string, data []byte, mode uint32) error
	ReadFile(ctx context.Context, path string) ([]byte, error)
	Close()
}

// Opener opens a driver from its configuration (a metal host's driver
// config as stored; secrets only as references).
type Opener func(ctx context.Context, config json.RawMessage) (Driver, error)

// Registry holds the drivers a deployment knows, by name.
type Registry map[string]Opener

// Open opens the driver named name.
func (r Registry) Open(ctx context.Context, name string, config json.RawMessage) (Driver, error) {
	open, ok := r[name]
	if !ok {
		return nil, fmt.Errorf("drivers: no driver %q", name)
	}
	return open(ctx, config)
}
