// Package localqemu is a provider whose machines are qemu virtual machines
// on the service's own host: its offers are the machine types of the
// account's config, claim boots one (internal/qemu, the guest image of the
// deployment's image source), identify finds one by id, release kills it,
// and install delivers the node daemon for it. It exists so that a whole
// provider bootstrap runs for real on one machine, without a cloud.
//
// The node daemon of a machine runs on the host side, beside the VM, not
// inside the guest: install runs `compute-agent join` with the join token
// in its environment (never on a command line or on disk) and then
// `compute-agent run` in the machine's directory, with the machine's vCPU
// and memory declared. The daemon lives as long as the machine: release
// ends both. docs/providers.md says why.
package localqemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"computeplane/internal/ids"
	"computeplane/internal/providers"
	"computeplane/internal/providers/localqemu/metadata"
	"computeplane/internal/qemu"
	"computeplane/internal/release"
)

// Name is the provider's registered name.
const Name = "localqemu"

// Region is the region of offers when the config names none.
const Region = "local"

// ConfigSchema is the JSON Schema of an account's config.
const ConfigSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["image", "machineTypes"],
  "properties": {
    "image": {"type": "string", "minLength": 1, "maxLength": 200, "description": "a kernel+initrd image of the deployment's image source"},
    "region": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$"},
    "accel": {"enum": ["tcg", "kvm"]},
    "agentRuntime": {"enum": ["qemu", "recording"], "description": "the runtime the node daemon of a machine runs"},
    "maxMachines": {"type": "integer", "minimum": 1, "maximum": 64},
    "machineTypes": {
      "type": "array", "minItems": 1, "maxItems": 32,
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["name", "vcpu", "memoryMiB"],
        "properties": {
          "name": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,64}$"},
          "vcpu": {"type": "integer", "minimum": 1, "maximum": 64},
          "memoryMiB": {"type": "integer", "minimum": 128, "maximum": 1048576},
          "description": {"type": "string", "maxLength": 256}
        }
      }
    }
  }
}`

// Manifest is the provider's manifest.
var Manifest = providers.Manifest{
	Name:         Name,
	Description:  "qemu virtual machines on the service's own host",
	ConfigSchema: ConfigSchema,
	Capabilities: []providers.Capability{providers.CapOffers, providers.CapIdentify, providers.CapClaim, providers.CapRelease, providers.CapBootstrap, providers.CapInstances},
}

// Factory makes clients of accounts of this provider; the main lists it
// among the providers built in (internal/builtin).
var Factory = &providers.Factory{Manifest: Manifest, New: New}

// MachineType is one offer of the config.
type MachineType struct {
	Name        string `json:"name"`
	VCPU        int64  `json:"vcpu"`
	MemoryMiB   int64  `json:"memoryMiB"`
	Description string `json:"description,omitempty"`
}

// Config is an account's config.
type Config struct {
	Image        string        `json:"image"`
	Region       string        `json:"region"`
	Accel        string        `json:"accel"`
	AgentRuntime string        `json:"agentRuntime"`
	MaxMachines  int           `json:"maxMachines"`
	MachineTypes []MachineType `json:"machineTypes"`
}

// meta is what a machine's directory records of it.
type meta struct {
	ID        string `json:"id"`
	AccountID string `json:"accountId"`
	Key       string `json:"key"`
	OfferID   string `json:"offerId"`
	VCPU      int64  `json:"vcpu"`
	MemoryMiB int64  `json:"memoryMiB"`
	Hostname  string `json:"hostname,omitempty"`
	Region    string `json:"region,omitempty"` // in the machine's identity document
}

// Provider is a client of one account.
type Provider struct {
	env providers.Env
	cfg Config
	mu  sync.Mutex // one claim at a time: maxMachines holds
}

// New builds a client from an account's config.
func New(env providers.Env, raw json.RawMessage) (providers.Provider, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("localqemu: config: %w", err)
	}
	if c.Region == "" {
		c.Region = Region
	}
	if c.Accel == "" {
		c.Accel = qemu.AccelTCG
	}
	if c.AgentRuntime == "" {
		c.AgentRuntime = "qemu"
	}
	if c.MaxMachines == 0 {
		c.MaxMachines = 4
	}
	if env.Dir == "" {
		return nil, errors.New("localqemu: no provider directory")
	}
	return &Provider{env: env, cfg: c}, nil
}

// Close has nothing to end: machines outlive clients.
func (p *Provider) Close() {}

// Offers lists the config's machine types.
func (p *Provider) Offers(_ context.Context, _ providers.Query) ([]providers.Offer, error) {
	out := make([]providers.Offer, 0, len(p.cfg.MachineTypes))
	for _, t := range p.cfg.MachineTypes {
		out = append(out, offer(p.cfg.Region, t))
	}
	return out, nil
}

func offer(region string, t MachineType) providers.Offer {
	return providers.Offer{ID: t.Name, Kind: "vps", Region: region, VCPU: t.VCPU, MemoryMiB: t.MemoryMiB, MemoryGiB: t.MemoryMiB / 1024,
		Description: t.Description}
}

// machineDir is where machine id lives. Ids are short: the VM's unix
// sockets sit under it.
func (p *Provider) machineDir(id string) string { return filepath.Join(p.env.Dir, id) }

func (p *Provider) vmDir(id string) string { return filepath.Join(p.machineDir(id), "vm") }

func (p *Provider) agentDir(id string) string { return filepath.Join(p.machineDir(id), "agent") }

func (p *Provider) readMeta(id string) (*meta, error) {
	if !validID(id) {
		return nil, providers.ErrNoMachine
	}
	b, err := os.ReadFile(filepath.Join(p.machineDir(id), "machine.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, providers.ErrNoMachine
	}
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m.AccountID != p.env.AccountID {
		return nil, providers.ErrNoMachine // another account's
	}
	return &m, nil
}

// validID keeps ids to what this provider makes: no path tricks.
func validID(id string) bool {
	if !strings.HasPrefix(id, "lq_") || len(id) > 40 {
		return false
	}
	for _, c := range id[3:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

func (p *Provider) machine(m *meta) providers.Machine {
	state := "stopped"
	if vmAlive(p.vmDir(m.ID)) {
		state = "running"
	}
	hostname := m.Hostname
	if hostname == "" {
		hostname = m.ID
	}
	return providers.Machine{ID: m.ID, OfferID: m.OfferID, State: state, Hostname: hostname, VCPU: m.VCPU, MemoryMiB: m.MemoryMiB}
}

// Identify finds a machine of the account by id.
func (p *Provider) Identify(_ context.Context, id string) (providers.Machine, error) {
	m, err := p.readMeta(id)
	if err != nil {
		return providers.Machine{}, err
	}
	return p.machine(m), nil
}

// Claim boots a machine of the offer with the account's image and returns
// once its guest is up. The key makes a retried claim (after a crash) find
// the machine it made.
func (p *Provider) Claim(ctx context.Context, offerID, key string) (providers.Machine, error) {
	return p.Launch(ctx, offerID, key, providers.Launch{ImageID: p.cfg.Image})
}

// Launch boots (or finds again, by key) a machine of the offer with the
// launch's image, gives its guest the hostname and delivers the user data
// (run when it is a script), and returns once that is done: an instance
// of a provider pool.
func (p *Provider) Launch(ctx context.Context, offerID, key string, l providers.Launch) (providers.Machine, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var t *MachineType
	for i := range p.cfg.MachineTypes {
		if p.cfg.MachineTypes[i].Name == offerID {
			t = &p.cfg.MachineTypes[i]
		}
	}
	if t == nil {
		return providers.Machine{}, fmt.Errorf("localqemu: no offer %s on this account", offerID)
	}
	id := ids.Derive("lq", p.env.AccountID, key)
	if m, err := p.readMeta(id); err == nil {
		if vmAlive(p.vmDir(id)) {
			return p.machine(m), nil
		}
	} else if !errors.Is(err, providers.ErrNoMachine) {
		return providers.Machine{}, err
	} else if n := p.count(); n >= p.cfg.MaxMachines {
		return providers.Machine{}, fmt.Errorf("localqemu: the account has %d machines, its maxMachines", n)
	}
	if p.env.Images == nil {
		return providers.Machine{}, errors.New("localqemu: the service has no image source")
	}
	kernel, initrd, cmdline, err := p.env.Images(ctx, l.ImageID)
	if err != nil {
		return providers.Machine{}, fmt.Errorf("localqemu: %w", err)
	}
	hostname := l.Hostname
	if hostname == "" {
		hostname = id
	}
	m := &meta{ID: id, AccountID: p.env.AccountID, Key: key, OfferID: t.Name, VCPU: t.VCPU, MemoryMiB: t.MemoryMiB, Hostname: hostname,
		Region: p.cfg.Region}
	if err := os.MkdirAll(p.machineDir(id), 0o700); err != nil {
		return providers.Machine{}, err
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(p.machineDir(id), "machine.json"), b, 0o600); err != nil {
		return providers.Machine{}, err
	}
	vm, err := qemu.Start(ctx, &qemu.Config{ID: id, Dir: p.vmDir(id), VCPU: int(t.VCPU), MemoryMiB: int(t.MemoryMiB), Accel: p.cfg.Accel,
		Machine: qemu.MachineMicroVM, Kernel: kernel, Initrd: initrd, Cmdline: strings.TrimSpace(cmdline + " compute.hostname=" + hostname)})
	if err != nil {
		return providers.Machine{}, err
	}
	defer vm.Detach()
	// Booted means its guest answers (and took the user data).
	bctx, cancel := context.WithTimeout(ctx, BootTimeout)
	defer cancel()
	var g *qemu.Guest
	for {
		if g, err = vm.Guest(); err == nil {
			if _, err = g.Ready(bctx); err == nil {
				break
			}
		}
		if bctx.Err() != nil || !vm.Alive() {
			_ = vm.Kill()
			return providers.Machine{}, fmt.Errorf("localqemu: machine %s did not boot: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l.UserData != "" {
		if _, err := g.RunUserData(bctx, l.UserData); err != nil {
			_ = vm.Kill()
			return providers.Machine{}, fmt.Errorf("localqemu: machine %s: %w", id, err)
		}
	}
	return p.machine(m), nil
}

// BootTimeout bounds a claim's boot (TCG is slow on a loaded host).
var BootTimeout = 120 * time.Second

func (p *Provider) count() int {
	entries, _ := os.ReadDir(p.env.Dir)
	n := 0
	for _, e := range entries {
		if m, err := p.readMeta(e.Name()); err == nil && vmAlive(p.vmDir(m.ID)) {
			n++
		}
	}
	return n
}

// Release ends a machine of the account: its daemon, then its VM, and
// removes its directory.
func (p *Provider) Release(_ context.Context, id string) error {
	m, err := p.readMeta(id)
	if err != nil {
		return err
	}
	Kill(p.machineDir(m.ID))
	return os.RemoveAll(p.machineDir(m.ID))
}

// Kill ends the daemon and the VM of the machine in dir, if they run.
func Kill(dir string) {
	if pid := readPid(filepath.Join(dir, "agent.pid")); pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGTERM) // its session: the daemon's own children too
		for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	qemu.KillDir(filepath.Join(dir, "vm"))
}

// KillAll ends every machine under a provider directory (tests).
func KillAll(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			Kill(filepath.Join(dir, e.Name()))
		}
	}
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func vmAlive(dir string) bool {
	c, err := qemu.LoadConfig(dir)
	if err != nil {
		return false
	}
	pid := readPid(c.PidFile())
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// Install delivers the node daemon for a running machine: it joins with
// the token (passed in the environment of the join only) and then runs,
// detached, with the machine's capacity declared.
func (p *Provider) Install(ctx context.Context, mc providers.Machine, in providers.Install) error {
	m, err := p.readMeta(mc.ID)
	if err != nil {
		return err
	}
	if !vmAlive(p.vmDir(m.ID)) {
		return fmt.Errorf("localqemu: machine %s is not running", m.ID)
	}
	dir := p.agentDir(m.ID)
	if pid := readPid(filepath.Join(p.machineDir(m.ID), "agent.pid")); pid > 0 && syscall.Kill(pid, 0) == nil {
		return nil // installed by an attempt whose answer was lost
	}
	agent := in.Agent
	if in.AgentURL != "" {
		if agent, err = p.download(ctx, m.ID, in); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); err != nil {
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		args := []string{"join", "--api", in.JoinURL, "--dir", dir, "--hostname", m.ID, "--force"}
		if in.CloudAttested {
			// The machine's own socket of the metadata service
			// (cmd/localqemu-metadata).
			args = append(args, "--cloud-metadata", "unix:"+filepath.Join(p.machineDir(m.ID), metadata.SocketName))
		}
		join := exec.CommandContext(jctx, agent, args...)
		join.Env = append(os.Environ(), "COMPUTE_AGENT_TOKEN="+in.Token)
		out, err := join.CombinedOutput()
		if err != nil {
			return fmt.Errorf("localqemu: compute-agent join: %v: %s", err, strings.TrimSpace(lastLine(string(out))))
		}
	}
	logf, err := os.OpenFile(filepath.Join(p.machineDir(m.ID), "agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"run", "--dir", dir, "--runtime", p.cfg.AgentRuntime, "--vcpu", strconv.FormatInt(m.VCPU, 10),
		"--memory-mib", strconv.FormatInt(m.MemoryMiB, 10), "--disk-gib", "1"}
	if p.cfg.AgentRuntime == "qemu" {
		args = append(args, "--accel", p.cfg.Accel)
	}
	run := exec.Command(agent, args...)
	run.Env = os.Environ()
	run.Stdout, run.Stderr = logf, logf
	run.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // it outlives the service, like the VM
	if err := run.Start(); err != nil {
		return fmt.Errorf("localqemu: compute-agent run: %w", err)
	}
	pid := run.Process.Pid
	go func() { _ = run.Wait() }() // reap it if it ends while we run
	return os.WriteFile(filepath.Join(p.machineDir(m.ID), "agent.pid"), []byte(strconv.Itoa(pid)), 0o600)
}

// DownloadTimeout bounds the download of the daemon at an install.
const DownloadTimeout = 5 * time.Minute

// AgentFile is the daemon's binary in a machine's directory when it was
// downloaded.
const AgentFile = "compute-agent"

// download fetches the daemon for this host's platform (the daemon of a
// localqemu machine runs on this host) from the install's AgentURL,
// verifies its checksum and its signature with the release keys, and
// writes it executable into the machine's directory: that file is what
// joins and runs.
func (p *Provider) download(ctx context.Context, id string, in providers.Install) (string, error) {
	if len(in.ReleaseKeys) == 0 {
		return "", fmt.Errorf("localqemu: download the daemon: %w", release.ErrNoKey)
	}
	platform := runtime.GOOS + "-" + runtime.GOARCH
	ctx, cancel := context.WithTimeout(ctx, DownloadTimeout)
	defer cancel()
	dl, err := release.Get(ctx, &http.Client{Timeout: DownloadTimeout}, strings.TrimSuffix(in.AgentURL, "/")+"/"+platform)
	if err != nil {
		return "", fmt.Errorf("localqemu: download the daemon: %w", err)
	}
	defer dl.Close()
	dest := filepath.Join(p.machineDir(id), AgentFile)
	if _, err := dl.Install(dest, in.ReleaseKeys, "compute-agent", platform); err != nil {
		return "", fmt.Errorf("localqemu: download the daemon: %w", err)
	}
	return dest, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
