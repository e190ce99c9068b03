// Package redfish is the bare-metal driver for hosts with a Redfish BMC,
// through github.com/stmcginnis/gofish: power and its state on the
// system's Reset action, the boot source override (Cd, Hdd, Pxe; once or
// continuous), virtual media of the first manager that has a slot of the
// wanted type (CD or DVD for slot cd, USB stick or removable disk for
// slot usb), and inventory from the system, its Ethernet interfaces and
// its simple storage. The serial console and the agent channel are not
// reached through Redfish (the console is a serial-over-LAN or an SSH
// session of the BMC; the in-memory agent dials home): ErrUnsupported.
package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"computeplane/internal/drivers"
)

// Name is the driver's name in a metal host's record.
const Name = "redfish"

// Config is one BMC. Password is a reference, never a value: env://NAME
// (resolved when the driver opens).
type Config struct {
	Endpoint string `json:"endpoint"`
	Username string `json:"username"`
	Password string `json:"password"`
	// SystemID picks a system of the BMC; empty takes the first one.
	SystemID string `json:"systemId,omitempty"`
	Insecure bool   `json:"insecure,omitempty"`
	// TimeoutMs bounds each HTTP request (default 30 s).
	TimeoutMs int `json:"timeoutMs,omitempty"`
}

// Driver is one Redfish system.
type Driver struct {
	c      *gofish.APIClient
	system *schemas.ComputerSystem
}

var _ drivers.Driver = (*Driver)(nil)

// Open is the driver's drivers.Opener.
func Open(ctx context.Context, raw json.RawMessage) (drivers.Driver, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("redfish: config: %w", err)
	}
	return New(ctx, c, nil)
}

func resolve(ref string) (string, error) {
	switch {
	case ref == "":
		return "", nil
	case strings.HasPrefix(ref, "env://"):
		v, ok := os.LookupEnv(strings.TrimPrefix(ref, "env://"))
		if !ok {
			return "", fmt.Errorf("redfish: password: %s is not set", ref)
		}
		return v, nil
	}
	return "", errors.New("redfish: password is a reference (env://NAME), not a value")
}

// New connects to the BMC; hc may be nil.
func New(ctx context.Context, c Config, hc *http.Client) (*Driver, error) {
	if !strings.HasPrefix(c.Endpoint, "https://") && !strings.HasPrefix(c.Endpoint, "http://") {
		return nil, errors.New("redfish: endpoint is an http(s) URL")
	}
	pw, err := resolve(c.Password)
	if err != nil {
		return nil, err
	}
	timeout := 30 * time.Second
	if c.TimeoutMs > 0 {
		timeout = time.Duration(c.TimeoutMs) * time.Millisecond
	}
	cfg := gofish.ClientConfig{Endpoint: c.Endpoint, Username: c.Username, Password: pw, Insecure: c.Insecure, BasicAuth: true,
		TLSHandshakeTimeout: int(timeout / time.Second)}
	if hc != nil {
		cfg.HTTPClient = hc
	} else {
		cfg.HTTPClient = &http.Client{Timeout: timeout}
	}
	api, err := gofish.ConnectContext(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("redfish: connect: %w", err)
	}
	systems, err := api.Service.Systems()
	if err != nil {
		api.Logout()
		return nil, fmt.Errorf("redfish: systems: %w", err)
	}
	d := &Driver{c: api}
	for _, s := range systems {
		if c.SystemID == "" || s.ID == c.SystemID {
			d.system = s
			break
		}
	}
	if d.system == nil {
		api.Logout()
		return nil, fmt.Errorf("redfish: no system %q", c.SystemID)
	}
	return d, nil
}

// refresh re-reads the system (power state and boot settings change).
func (d *Driver) refresh() error {
	s, err := schemas.GetObject[schemas.ComputerSystem](d.c, d.system.ODataID)
	if err != nil {
		return fmt.Errorf("redfish: system: %w", err)
	}
	d.system = s
	return nil
}

// PowerState maps Redfish's On and PoweringOff to on, the rest to off.
func (d *Driver) PowerState(context.Context) (string, error) {
	if err := d.refresh(); err != nil {
		return "", err
	}
	switch d.system.PowerState {
	case schemas.OnPowerState, schemas.PoweringOffPowerState:
		return drivers.PowerOn, nil
	}
	return drivers.PowerOff, nil
}

// Power sends the system's Reset action: ForceOn, ForceOff or
// ForceRestart. On when on and off when off send nothing.
func (d *Driver) Power(ctx context.Context, action string) error {
	state, err := d.PowerState(ctx)
	if err != nil {
		return err
	}
	var rt schemas.ResetType
	switch action {
	case drivers.ActionOn:
		if state == drivers.PowerOn {
			return nil
		}
		rt = schemas.OnResetType
	case drivers.ActionOff:
		if state == drivers.PowerOff {
			return nil
		}
		rt = schemas.ForceOffResetType
	case drivers.ActionReset:
		rt = schemas.ForceRestartResetType
		if state == drivers.PowerOff {
			rt = schemas.OnResetType
		}
	default:
		return fmt.Errorf("redfish: power action %q", action)
	}
	if _, err := d.system.Reset(rt); err != nil {
		return fmt.Errorf("redfish: reset %s: %w", rt, err)
	}
	return nil
}

// SetBootDevice patches the boot source override.
func (d *Driver) SetBootDevice(_ context.Context, device string, once bool) error {
	var target schemas.BootSource
	switch device {
	case drivers.BootCD:
		target = schemas.CdBootSource
	case drivers.BootDisk:
		target = schemas.HddBootSource
	case drivers.BootPXE:
		target = schemas.PxeBootSource
	default:
		return fmt.Errorf("redfish: boot device %q", device)
	}
	enabled := schemas.ContinuousBootSourceOverrideEnabled
	if once {
		enabled = schemas.OnceBootSourceOverrideEnabled
	}
	if err := d.system.SetBoot(&schemas.Boot{BootSourceOverrideTarget: target, BootSourceOverrideEnabled: enabled}); err != nil {
		return fmt.Errorf("redfish: boot override: %w", err)
	}
	return nil
}

// slot finds the virtual media for a slot on the managers.
func (d *Driver) slot(slot string) (*schemas.VirtualMedia, error) {
	want := map[string][]schemas.VirtualMediaType{
		drivers.SlotCD:  {schemas.CDVirtualMediaType, schemas.DVDVirtualMediaType},
		drivers.SlotUSB: {schemas.USBStickVirtualMediaType, schemas.FloppyVirtualMediaType},
	}[slot]
	if want == nil {
		return nil, fmt.Errorf("redfish: slot %q (cd or usb)", slot)
	}
	managers, err := d.c.Service.Managers()
	if err != nil {
		return nil, fmt.Errorf("redfish: managers: %w", err)
	}
	for _, m := range managers {
		vms, err := m.VirtualMedia()
		if err != nil {
			continue
		}
		for _, vm := range vms {
			for _, t := range vm.MediaTypes {
				for _, w := range want {
					if t == w {
						return vm, nil
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("redfish: no virtual media for slot %s: %w", slot, drivers.ErrUnsupported)
}

// InsertMedia inserts the image at m.URL (the BMC fetches it); the same
// image already inserted is left alone, another one is ejected first.
func (d *Driver) InsertMedia(_ context.Context, m drivers.Media) error {
	if !strings.HasPrefix(m.URL, "http://") && !strings.HasPrefix(m.URL, "https://") {
		return fmt.Errorf("redfish: media location %q is not a URL the BMC can fetch", m.URL)
	}
	vm, err := d.slot(m.Slot)
	if err != nil {
		return err
	}
	inserted := vm.Inserted != nil && *vm.Inserted
	if inserted && vm.Image == m.URL {
		return nil
	}
	if inserted {
		if _, err := vm.EjectMedia(); err != nil {
			return fmt.Errorf("redfish: eject: %w", err)
		}
	}
	yes := true
	if _, err := vm.InsertMedia(&schemas.VirtualMediaInsertMediaParameters{Image: m.URL, Inserted: &yes, WriteProtected: &yes}); err != nil {
		return fmt.Errorf("redfish: insert: %w", err)
	}
	return nil
}

// EjectMedia empties slot; an empty slot is left alone.
func (d *Driver) EjectMedia(_ context.Context, slot string) error {
	vm, err := d.slot(slot)
	if err != nil {
		return err
	}
	if vm.Inserted != nil && !*vm.Inserted {
		return nil
	}
	if _, err := vm.EjectMedia(); err != nil {
		return fmt.Errorf("redfish: eject: %w", err)
	}
	return nil
}

// Console is not reached through Redfish.
func (d *Driver) Console(context.Context, int) ([]byte, error) { return nil, drivers.ErrUnsupported }

// Agent is not reached through Redfish.
func (d *Driver) Agent(context.Context) (drivers.Agent, error) { return nil, drivers.ErrUnsupported }

// Inventory reads the system, its NICs and its simple storage.
func (d *Driver) Inventory(ctx context.Context) (*drivers.Inventory, error) {
	power, err := d.PowerState(ctx)
	if err != nil {
		return nil, err
	}
	s := d.system
	inv := &drivers.Inventory{Manufacturer: s.Manufacturer, Model: s.Model, SerialNumber: s.SerialNumber, PowerState: power,
		Disks: []drivers.Disk{}, NICs: []drivers.NIC{}}
	if n := s.ProcessorSummary.LogicalProcessorCount; n != nil {
		inv.VCPU = int(*n)
	}
	if g := s.MemorySummary.TotalSystemMemoryGiB; g != nil {
		inv.MemoryMiB = int64(*g * 1024)
	}
	if nics, err := s.EthernetInterfaces(); err == nil {
		for _, n := range nics {
			inv.NICs = append(inv.NICs, drivers.NIC{Name: n.ID, MAC: strings.ToLower(n.MACAddress)})
		}
	}
	if stores, err := s.SimpleStorage(); err == nil {
		for _, st := range stores {
			for _, dev := range st.Devices {
				disk := drivers.Disk{Name: dev.Name}
				if dev.CapacityBytes != nil {
					disk.SizeBytes = int64(*dev.CapacityBytes)
				}
				inv.Disks = append(inv.Disks, disk)
			}
		}
	}
	return inv, nil
}

// Close ends the BMC session.
func (d *Driver) Close() error {
	d.c.Logout()
	return nil
}
