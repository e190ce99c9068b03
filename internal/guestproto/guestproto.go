// Package guestproto is the protocol between compute-agent's VM runtime and
// compute-guest, the agent inside each virtual machine: JSON lines over a
// virtio-serial port named PortName (no vsock on these hosts).
//
// The guest writes a Ready event (ID 0) when it is up, and again after a
// resume when asked (Identity). The host sends Requests with increasing
// IDs; the guest answers each with a Response of the same ID, in any
// order. Every request is bounded: exec by its timeout and output cap,
// files by MaxFileBytes.
package guestproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// PortName is the virtio-serial port's name (virtserialport name=...).
const PortName = "org.computeplane.guest.0"

// Limits.
const (
	MaxLineBytes      = 8 << 20 // one message
	MaxFileBytes      = 4 << 20 // readFile and writeFile
	MaxOutputBytes    = 1 << 20 // exec stdout and stderr, each
	MaxExecTimeoutMs  = 10 * 60 * 1000
	DefaultExecTimeMs = 60 * 1000
)

// Operations.
const (
	OpPing      = "ping"
	OpExec      = "exec"
	OpReadFile  = "readFile"
	OpWriteFile = "writeFile"
	OpMount     = "mount"
	OpIdentity  = "identity"
	OpSync      = "sync"
	OpPoweroff  = "poweroff"
	// OpStart runs a program whose output streams back as Responses with
	// the request's ID and Output set, then one with Exec (its exit code)
	// set and Output nil: the end. OpInput feeds it (Input.Proc names the
	// start request).
	OpStart = "start"
	OpInput = "input"
	// OpDial connects to a TCP port inside the guest (Dial): the
	// connection streams like a started program, its bytes as Output on
	// Fd 1, the client's as Input, and its end as an Exec with exit code
	// 0 (the guest's side closed) or an error.
	OpDial = "dial"
	// OpProcess manages background processes that outlive the request
	// (Process): start, list, wait, signal, stdin and output.
	OpProcess = "process"
)

// StreamWindow is how many output bytes a started program may have in
// flight before the host acknowledges them (Input.Ack): the host never
// buffers more per program, and a slow tunnel stalls only its program.
const StreamWindow = 256 << 10

// Request is one host-to-guest call.
type Request struct {
	ID       uint64    `json:"id"`
	Op       string    `json:"op"`
	Exec     *Exec     `json:"exec,omitempty"`
	File     *File     `json:"file,omitempty"`
	Mount    *Mount    `json:"mount,omitempty"`
	Identity *Identity `json:"identity,omitempty"`
	Input    *Input    `json:"input,omitempty"`
	Dial     *Dial     `json:"dial,omitempty"`
	Process  *Process  `json:"process,omitempty"`
	// BinaryOutput (start and dial) asks for the stream's output as
	// output frames (frame.go); a guest that predates it sends JSON lines.
	BinaryOutput bool `json:"binaryOutput,omitempty"`
}

// Dial names a TCP port of the guest's loopback (127.0.0.1): a server on
// any of the guest's addresses or on loopback answers, with or without a
// network card.
type Dial struct {
	Port int `json:"port"`
}

// Size is a terminal's size in characters.
type Size struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Signals a started program may be sent (Input.Signal), by name.
var Signals = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "CONT": 18, "STOP": 19, "WINCH": 28}

// Input goes to a started program: stdin bytes, the end of stdin, output
// bytes the host has delivered (Ack, freeing the window), a kill (the
// tunnel ended first), a signal by name (Signals; to the terminal's
// foreground process group under a TTY, else to the program's group) or
// its terminal's new size.
type Input struct {
	Proc   uint64 `json:"proc"`
	Data   []byte `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
	Ack    int64  `json:"ack,omitempty"`
	Kill   bool   `json:"kill,omitempty"`
	Signal string `json:"signal,omitempty"`
	Resize *Size  `json:"resize,omitempty"`
}

// Output is a chunk of a started program's stdout (Fd 1) or stderr (Fd 2).
type Output struct {
	Fd   int    `json:"fd"`
	Data []byte `json:"data"`
}

// Exec runs a program without a shell unless Argv names one.
type Exec struct {
	Argv      []string          `json:"argv"`
	Env       map[string]string `json:"env,omitempty"`
	Dir       string            `json:"dir,omitempty"`
	Stdin     []byte            `json:"stdin,omitempty"`
	TimeoutMs int64             `json:"timeoutMs,omitempty"`
	// TTY runs a started program (OpStart only) on a pseudo-terminal of
	// Size (default 80x24): stdin and its output (all on Fd 1) go through
	// it, and TERM defaults to xterm-256color.
	TTY  bool  `json:"tty,omitempty"`
	Size *Size `json:"size,omitempty"`
}

// File names a file to read or write.
type File struct {
	Path string `json:"path"`
	Data []byte `json:"data,omitempty"`
	Mode uint32 `json:"mode,omitempty"` // writeFile; default 0644
}

// Mount mounts a volume by its disk serial at Path, formatting it first
// when it holds no filesystem (and Format allows).
type Mount struct {
	Serial   string `json:"serial"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Format   bool   `json:"format,omitempty"`
}

// Identity gives a guest (a fresh boot or a resumed warm instance) its own
// hostname, machine id and environment.
type Identity struct {
	Hostname  string            `json:"hostname"`
	MachineID string            `json:"machineId"`
	Env       map[string]string `json:"env,omitempty"`
	// Network, when set, (re)configures the guest's network card: at boot
	// it comes on the kernel command line (compute.net=<base64url JSON>),
	// after a resume or restore with a new address in this request.
	Network *Network `json:"network,omitempty"`
}

// Network is the guest's side of its network: one card (virtio-net),
// addressed statically by compute-guest (no DHCP).
type Network struct {
	// MAC picks the card; empty is the first card that is not loopback.
	MAC string `json:"mac,omitempty"`
	// Address is the guest's IPv4 address with its prefix length, e.g.
	// 10.200.3.7/24.
	Address string `json:"address"`
	// Gateway is the default route's next hop; empty is no default route
	// (a private network).
	Gateway string `json:"gateway,omitempty"`
	// DNS are the resolvers written to /etc/resolv.conf.
	DNS []string `json:"dns,omitempty"`
	MTU int      `json:"mtu,omitempty"`
}

// Response answers a request; ID 0 with Ready set is the boot event.
type Response struct {
	ID     uint64      `json:"id"`
	OK     bool        `json:"ok"`
	Error  string      `json:"error,omitempty"`
	Ready  *Ready      `json:"ready,omitempty"`
	Exec   *ExecResult `json:"exec,omitempty"`
	Data   []byte      `json:"data,omitempty"` // readFile
	Status *Status     `json:"status,omitempty"`
	Output *Output     `json:"output,omitempty"` // a started program's output
	// Processes answers OpProcess (one entry for start, wait, signal and
	// stdin; every tracked process for list); ProcessOutput its output.
	Processes     []ProcessInfo  `json:"processes,omitempty"`
	ProcessOutput *ProcessOutput `json:"processOutput,omitempty"`
}

// Ready says the guest agent runs.
type Ready struct {
	BootID   string `json:"bootId"`
	Kernel   string `json:"kernel"`
	Hostname string `json:"hostname"`
	UptimeMs int64  `json:"uptimeMs"`
}

// ExecResult is a finished program.
type ExecResult struct {
	ExitCode   int    `json:"exitCode"`
	Stdout     []byte `json:"stdout"`
	Stderr     []byte `json:"stderr"`
	Truncated  bool   `json:"truncated,omitempty"`
	TimedOut   bool   `json:"timedOut,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

// Status answers ping and identity: what a host checks before it calls a
// resumed or restored guest ready.
type Status struct {
	BootID    string `json:"bootId"`
	Hostname  string `json:"hostname"`
	MachineID string `json:"machineId"`
	UptimeMs  int64  `json:"uptimeMs"`
	// RootOK is true when the root filesystem answered a write and read
	// back of a probe file.
	RootOK bool `json:"rootOk"`
}

// DecodeRequest reads one request line and checks that it carries the body
// its operation needs.
func DecodeRequest(line []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(line, &r); err != nil {
		return Request{}, fmt.Errorf("guestproto: %w", err)
	}
	if r.ID == 0 {
		return Request{}, errors.New("guestproto: a request id is at least 1")
	}
	switch r.Op {
	case OpPing, OpSync, OpPoweroff:
	case OpExec, OpStart:
		if r.Exec == nil || len(r.Exec.Argv) == 0 || r.Exec.Argv[0] == "" {
			return r, errors.New("guestproto: exec needs argv")
		}
		if r.Exec.TimeoutMs < 0 || r.Exec.TimeoutMs > MaxExecTimeoutMs {
			return r, fmt.Errorf("guestproto: exec timeoutMs is 0 to %d", MaxExecTimeoutMs)
		}
	case OpInput:
		if r.Input == nil || r.Input.Proc == 0 || r.Input.Ack < 0 {
			return r, errors.New("guestproto: input needs its program (proc)")
		}
		if _, ok := Signals[r.Input.Signal]; r.Input.Signal != "" && !ok {
			return r, fmt.Errorf("guestproto: unknown signal %q", r.Input.Signal)
		}
	case OpProcess:
		if err := r.Process.validate(); err != nil {
			return r, err
		}
	case OpDial:
		if r.Dial == nil || r.Dial.Port < 1 || r.Dial.Port > 65535 {
			return r, errors.New("guestproto: dial needs a port (1 to 65535)")
		}
	case OpReadFile, OpWriteFile:
		if r.File == nil || r.File.Path == "" || r.File.Path[0] != '/' {
			return r, errors.New("guestproto: a file op needs an absolute path")
		}
		if len(r.File.Data) > MaxFileBytes {
			return r, fmt.Errorf("guestproto: at most %d bytes per file", MaxFileBytes)
		}
	case OpMount:
		if r.Mount == nil || r.Mount.Serial == "" || r.Mount.Path == "" || r.Mount.Path[0] != '/' {
			return r, errors.New("guestproto: mount needs a serial and an absolute path")
		}
	case OpIdentity:
		if r.Identity == nil || r.Identity.Hostname == "" {
			return r, errors.New("guestproto: identity needs a hostname")
		}
		if n := r.Identity.Network; n != nil {
			if err := n.Validate(); err != nil {
				return r, err
			}
		}
	default:
		return r, fmt.Errorf("guestproto: unknown op %q", r.Op)
	}
	return r, nil
}

// Validate checks a network before the guest touches its card.
func (n *Network) Validate() error {
	p, err := netip.ParsePrefix(n.Address)
	if err != nil || !p.Addr().Is4() {
		return fmt.Errorf("guestproto: network address %q is not IPv4/len", n.Address)
	}
	if n.Gateway != "" {
		gw, err := netip.ParseAddr(n.Gateway)
		if err != nil || !p.Masked().Contains(gw) {
			return fmt.Errorf("guestproto: gateway %q is not in %v", n.Gateway, p.Masked())
		}
	}
	for _, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("guestproto: resolver %q is not an address", d)
		}
	}
	if n.MTU != 0 && (n.MTU < 576 || n.MTU > 9000) {
		return fmt.Errorf("guestproto: mtu %d is outside 576..9000", n.MTU)
	}
	if n.MAC != "" {
		if _, err := net.ParseMAC(n.MAC); err != nil {
			return fmt.Errorf("guestproto: mac %q: %w", n.MAC, err)
		}
	}
	return nil
}
