// Package agentproto is the node-daemon protocol: the messages a
// compute-agent and a gateway exchange over one WebSocket session, and the
// join exchange before it. Both ends import it and nothing else of each
// other.
//
// A session is a WebSocket carrying one JSON message per text frame. Over
// mutual TLS (the gateway's listener) the client certificate is the
// identity. Over the fallback (wss://<publicHost>/v1/session, for sites
// behind TLS-inspecting proxies) the gateway first sends a Challenge and the
// daemon answers with its certificate chain and a signature of the
// challenge by its node key. Then:
//
//	agent -> hello            node, protocol range, agent version, inventory
//	gateway -> welcome        session epoch, chosen protocol, region's gateways
//	gateway -> spec           desired state with a generation (on change)
//	agent -> status           observed generation, instances, volume store
//	gateway -> command        signed; re-sent until its result arrives
//	agent -> result           once per command id, repeated on re-send
//	agent -> resolve          the secret references of an instance's user data
//	gateway -> resolved       their values (over this session only)
//	agent -> renew            a CSR at two thirds of the certificate's life
//	gateway -> renewed        the new certificate
//	gateway -> reconnect      drain: dial elsewhere after DelayMS
//	gateway -> revoked        the node's certificate or node was revoked
package agentproto

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Protocol versions this build speaks.
const (
	ProtocolMin = 1
	ProtocolMax = 1
)

// SessionPath is the WebSocket path on gateways and on the public host
// (the fallback).
const SessionPath = "/v1/session"

// JoinPath is the join endpoint on the public host (the api role).
const JoinPath = "/v1/join"

// MaxMessageBytes bounds one message in either direction.
const MaxMessageBytes = 1 << 20

// Transports a daemon can use, in the order it tries them.
const (
	TransportMTLS      = "mtls"
	TransportWebSocket = "wss-fallback"
)

// Message types.
const (
	TypeChallenge = "challenge"
	TypeProof     = "proof"
	TypeHello     = "hello"
	TypeWelcome   = "welcome"
	TypeSpec      = "spec"
	TypeStatus    = "status"
	TypeCommand   = "command"
	TypeResult    = "result"
	TypeRenew     = "renew"
	TypeResolve   = "resolve"
	TypeResolved  = "resolved"
	TypeRenewed   = "renewed"
	TypeReconnect = "reconnect"
	TypeRevoked   = "revoked"
	TypeError     = "error"
)

// Message is one frame: its type and the one body that type carries.
type Message struct {
	Type      string     `json:"type"`
	Challenge *Challenge `json:"challenge,omitempty"`
	Proof     *Proof     `json:"proof,omitempty"`
	Hello     *Hello     `json:"hello,omitempty"`
	Welcome   *Welcome   `json:"welcome,omitempty"`
	Spec      *Spec      `json:"spec,omitempty"`
	Status    *Status    `json:"status,omitempty"`
	Command   *Command   `json:"command,omitempty"`
	Result    *Result    `json:"result,omitempty"`
	Renew     *Renew     `json:"renew,omitempty"`
	Resolve   *Resolve   `json:"resolve,omitempty"`
	Resolved  *Resolved  `json:"resolved,omitempty"`
	Renewed   *Renewed   `json:"renewed,omitempty"`
	Reconnect *Reconnect `json:"reconnect,omitempty"`
	Error     *Error     `json:"error,omitempty"`
}

// Decode reads one message and checks that it carries the body its type
// names.
func Decode(data []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return Message{}, fmt.Errorf("agentproto: %w", err)
	}
	missing := false
	switch m.Type {
	case TypeChallenge:
		missing = m.Challenge == nil
	case TypeProof:
		missing = m.Proof == nil
	case TypeHello:
		missing = m.Hello == nil
	case TypeWelcome:
		missing = m.Welcome == nil
	case TypeSpec:
		missing = m.Spec == nil
	case TypeStatus:
		missing = m.Status == nil
	case TypeCommand:
		missing = m.Command == nil
	case TypeResult:
		missing = m.Result == nil
	case TypeRenew:
		missing = m.Renew == nil
	case TypeRenewed:
		missing = m.Renewed == nil
	case TypeResolve:
		missing = m.Resolve == nil
	case TypeResolved:
		missing = m.Resolved == nil
	case TypeReconnect:
		missing = m.Reconnect == nil
	case TypeError:
		missing = m.Error == nil
	case TypeRevoked:
	default:
		return Message{}, fmt.Errorf("agentproto: unknown message type %q", m.Type)
	}
	if missing {
		return Message{}, fmt.Errorf("agentproto: a %s message without its body", m.Type)
	}
	return m, nil
}

// Challenge opens a fallback session: the daemon signs Nonce.
type Challenge struct {
	Nonce []byte `json:"nonce"`
}

// ProofContext prefixes what a fallback proof signs, so a signature made
// for it is good for nothing else.
const ProofContext = "computeplane agent session proof v1\x00"

// Proof answers a Challenge: the node certificate chain (DER, leaf first)
// and an ECDSA signature (ASN.1) of SHA-256(ProofContext || nonce) by the
// leaf's key.
type Proof struct {
	Chain     [][]byte `json:"chain"`
	Signature []byte   `json:"signature"`
}

// Hello is the daemon's first message of a session.
type Hello struct {
	NodeID       string    `json:"nodeId"`
	ProtocolMin  int       `json:"protocolMin"`
	ProtocolMax  int       `json:"protocolMax"`
	AgentVersion string    `json:"agentVersion"`
	Transport    string    `json:"transport"`
	Inventory    Inventory `json:"inventory"`
	// ObservedGeneration is the spec generation the daemon has applied.
	ObservedGeneration int64 `json:"observedGeneration"`
	// Streams names the stream multiplexing the daemon accepts in the
	// session's binary messages (tunnel.StreamsYamux); empty: none, and
	// the gateway opens no tunnel to it.
	Streams string `json:"streams,omitempty"`
}

// Inventory is what a host offers.
type Inventory struct {
	Hostname  string `json:"hostname"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int64  `json:"memoryMiB"`
	DiskGiB   int64  `json:"diskGiB"`
	GPUs      int    `json:"gpus"`
	GPUModel  string `json:"gpuModel,omitempty"`
	// Runtime names the runtime behind specs (recording, qemu) and Accel
	// its acceleration (kvm, tcg) where it has one.
	Runtime string `json:"runtime"`
	Accel   string `json:"accel,omitempty"`
	// Networks are the VM network modes the node wires besides none
	// (NetEgress, NetPrivate; empty: none only, as every node before
	// issue 23): placement sends a VM asking for a mode only to a node
	// offering it.
	Networks []string `json:"networks,omitempty"`
	// Underlay is the node's address on the pool's own connection, where
	// the other nodes reach its private networks' overlay (VXLAN);
	// invalid: the node takes part in no overlay.
	Underlay netip.Addr `json:"underlay,omitzero"`
}

// Offers says whether the node wires VMs of network mode (none always).
func (inv Inventory) Offers(mode string) bool {
	return mode == "" || mode == NetNone || slices.Contains(inv.Networks, mode)
}

// Gateway is one gateway a daemon may dial.
type Gateway struct {
	ID         string `json:"id"`
	URL        string `json:"url"` // https://host:port of the mutual-TLS listener
	ServerName string `json:"serverName,omitempty"`
	Region     string `json:"region"`
	// Draining gateways refuse new sessions: daemons dial them last.
	Draining bool `json:"draining,omitempty"`
}

// Welcome accepts a session.
type Welcome struct {
	SessionEpoch int64     `json:"sessionEpoch"`
	Protocol     int       `json:"protocol"`
	GatewayID    string    `json:"gatewayId"`
	Gateways     []Gateway `json:"gateways"`
	// HeartbeatMS is how often the daemon sends a status when nothing
	// changed.
	HeartbeatMS int64 `json:"heartbeatMs"`
	// TrustVersion is the trust bundle's version: it changes with the
	// CAs or the command key (pki.trustVersion is the lowest).
	TrustVersion int `json:"trustVersion,omitempty"`
}

// Spec is the desired state of a node at a generation (spec.go).
type Spec struct {
	Generation int64    `json:"generation"`
	Body       SpecBody `json:"body"`
}

// VolumeStore is the daemon's volume storage, from statfs and its own
// files: bytes available on the filesystem, reserved for volumes, and
// outstanding (sparse space volumes may still write).
type VolumeStore struct {
	AvailableBytes   int64 `json:"availableBytes"`
	ReservedBytes    int64 `json:"reservedBytes"`
	OutstandingBytes int64 `json:"outstandingBytes"`
}

// VolumeSpec is one volume of a node spec: a sparse raw file named by
// its serial in the daemon's volume store, grown (never shrunk) to
// SizeGiB. A volume left out of the spec is deleted.
type VolumeSpec struct {
	Serial  string `json:"serial"`
	SizeGiB int64  `json:"sizeGiB"`
}

// VolumeStatus is a volume file the daemon holds.
type VolumeStatus struct {
	Serial    string `json:"serial"`
	SizeBytes int64  `json:"sizeBytes"`
}

// InstanceStatus is the observed state of one instance of the spec.
type InstanceStatus struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Identity is the identity generation the guest runs with: the spec's
	// Identity.Generation once the guest took it and then answered a
	// check (its agent and its root filesystem), 0 before any.
	Identity int64 `json:"identity,omitempty"`
	// Timings of the instance's last start, as the host saw them.
	Timings *HostTimings `json:"timings,omitempty"`
	// EgressTxBytes and EgressRxBytes count the VM's routed traffic
	// through the node since its network was added (egress mode: Tx left
	// the VM past its policy, Rx came back). Cumulative: the control plane
	// meters the growth; a smaller value than last seen is a new count.
	EgressTxBytes uint64 `json:"egressTxBytes,omitempty"`
	EgressRxBytes uint64 `json:"egressRxBytes,omitempty"`
}

// BusyPrefix starts the error of a command the node refused because it
// runs as many as it takes: a retry may succeed.
const BusyPrefix = "busy: "

// HostTimings say where a start's host time went, in milliseconds: qemu
// started (or a paused VM resumed, or a snapshot restored) to the guest
// agent answering, and to the identity taken and checked.
type HostTimings struct {
	// How: boot, resume or restore.
	How        string `json:"how"`
	StartMs    int64  `json:"startMs"`    // qemu process started / resume / restore issued
	GuestMs    int64  `json:"guestMs"`    // the guest agent answered
	IdentityMs int64  `json:"identityMs"` // identity taken and checked (ready)
}

// SpecIdentity is who a guest is: a warm instance claimed by a sandbox gets
// a new generation with a fresh hostname, machine id and environment, so
// two claims never share them.
type SpecIdentity struct {
	Generation int64             `json:"generation"`
	Hostname   string            `json:"hostname"`
	MachineID  string            `json:"machineId"`
	Env        map[string]string `json:"env,omitempty"`
}

// SpecVolume attaches a volume of the node's volume store (a VolumeSpec
// of the same spec, by serial) to an instance: a virtio disk with that
// serial, mounted by the guest at MountPath (formatted ext4 only when it
// holds no filesystem yet).
type SpecVolume struct {
	Serial    string `json:"serial"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

// Status reports what the daemon observes.
type Status struct {
	ObservedGeneration int64            `json:"observedGeneration"`
	ApplyError         string           `json:"applyError,omitempty"`
	Instances          []InstanceStatus `json:"instances"`
	VolumeStore        VolumeStore      `json:"volumeStore"`
	// Volumes are the volume files the daemon holds (nil: it does not
	// report them; an empty list: none).
	Volumes   []VolumeStatus `json:"volumes"`
	Inventory *Inventory     `json:"inventory,omitempty"`
}

// Command kinds this protocol version knows.
const (
	CommandEcho      = "echo"      // answers its args: a round trip through the daemon
	CommandInventory = "inventory" // re-reads and reports the host's inventory
	// CommandNotice tells the daemon that work on its node loses its
	// capacity at a deadline (a spot reservation preempted): the daemon
	// keeps it for the workloads to read.
	CommandNotice = "notice"
	// Guest commands: run inside an instance's guest through its agent.
	CommandExec      = "exec"      // ExecArgs -> ExecOutput
	CommandReadFile  = "readFile"  // FileArgs -> FileOutput
	CommandWriteFile = "writeFile" // FileArgs (with data) -> FileOutput
	// CommandProcess manages a guest's background processes.
	CommandProcess = "process" // ProcessArgs -> ProcessOutput
	// Snapshots of an instance's memory and disks, kept on the node.
	CommandSnapshot       = "snapshot"       // SnapshotArgs -> SnapshotOutput
	CommandDeleteSnapshot = "deleteSnapshot" // SnapshotArgs -> {}
	// Support bundles: the daemon collects and scrubs a bundle on its disk,
	// then uploads it through the presigned PUT the control plane signed
	// for exactly its size.
	CommandSupportBundle       = "supportBundle"       // SupportBundleArgs -> SupportBundleOutput
	CommandUploadSupportBundle = "uploadSupportBundle" // UploadSupportBundleArgs -> SupportBundleOutput
)

// SupportBundleArgs ask for a bundle of at most MaxBytes.
type SupportBundleArgs struct {
	BundleID string `json:"bundleId"`
	MaxBytes int64  `json:"maxBytes"`
}

// SupportBundleOutput is a bundle collected (or uploaded): its size, hex
// SHA-256, the secrets scrubbed from it and its number of files.
type SupportBundleOutput struct {
	SizeBytes  int64  `json:"sizeBytes"`
	SHA256     string `json:"sha256"`
	Redactions int    `json:"redactions"`
	Entries    int    `json:"entries"`
}

// UploadSupportBundleArgs send a collected bundle: a PUT of URL with
// Headers (signed with it), of exactly SizeBytes with digest SHA256.
type UploadSupportBundleArgs struct {
	BundleID  string            `json:"bundleId"`
	URL       string            `json:"url"`
	Headers   map[string]string `json:"headers,omitempty"`
	SizeBytes int64             `json:"sizeBytes"`
	SHA256    string            `json:"sha256"`
	MaxBytes  int64             `json:"maxBytes"`
}

// ExecArgs run a bounded, non-interactive program in instance's guest.
type ExecArgs struct {
	InstanceID string            `json:"instanceId"`
	Argv       []string          `json:"argv"`
	Env        map[string]string `json:"env,omitempty"`
	Dir        string            `json:"dir,omitempty"`
	Stdin      []byte            `json:"stdin,omitempty"`
	TimeoutMs  int64             `json:"timeoutMs"`
}

// ExecOutput is the finished program (output capped at 1 MiB each).
type ExecOutput struct {
	ExitCode   int    `json:"exitCode"`
	Stdout     []byte `json:"stdout"`
	Stderr     []byte `json:"stderr"`
	Truncated  bool   `json:"truncated,omitempty"`
	TimedOut   bool   `json:"timedOut,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

// ProcessArgs carry a request of the guest's process table (a
// guestproto.Process, passed as it is) to instance's guest.
type ProcessArgs struct {
	InstanceID string          `json:"instanceId"`
	Process    json.RawMessage `json:"process"`
}

// ProcessOutput is the guest's answer: guestproto.Response's processes
// and processOutput, passed as they are.
type ProcessOutput struct {
	Processes     json.RawMessage `json:"processes,omitempty"`
	ProcessOutput json.RawMessage `json:"processOutput,omitempty"`
}

// FileArgs name a file in instance's guest (absolute path); Data and Mode
// for writeFile. At most 4 MiB.
type FileArgs struct {
	InstanceID string `json:"instanceId"`
	Path       string `json:"path"`
	Data       []byte `json:"data,omitempty"`
	Mode       uint32 `json:"mode,omitempty"`
}

// FileOutput answers readFile (Data) and writeFile (SizeBytes written).
type FileOutput struct {
	Data      []byte `json:"data,omitempty"`
	SizeBytes int64  `json:"sizeBytes"`
}

// SnapshotArgs name a snapshot of an instance (memory and disks) kept on
// the node under SnapshotID; deleteSnapshot needs only SnapshotID.
type SnapshotArgs struct {
	InstanceID string `json:"instanceId,omitempty"`
	SnapshotID string `json:"snapshotId"`
}

// SnapshotOutput is a snapshot taken: its size on the node's disk and how
// long the guest was paused for it.
type SnapshotOutput struct {
	SizeBytes int64 `json:"sizeBytes"`
	PausedMs  int64 `json:"pausedMs"`
}

// Command is one signed instruction. It is executed at most once per ID:
// a re-sent command gets the first result again.
type Command struct {
	ID        string          `json:"id"`
	NodeID    string          `json:"nodeId"`
	Kind      string          `json:"kind"`
	Args      json.RawMessage `json:"args"`
	ExpiresAt time.Time       `json:"expiresAt"`
	Signature []byte          `json:"signature"`
}

// signed is what a command's signature covers: every field but the
// signature, in a fixed encoding.
func (c Command) signed() []byte {
	b, _ := json.Marshal(struct {
		Context   string          `json:"ctx"`
		ID        string          `json:"id"`
		NodeID    string          `json:"nodeId"`
		Kind      string          `json:"kind"`
		Args      json.RawMessage `json:"args"`
		ExpiresAt int64           `json:"exp"`
	}{"computeplane command v1", c.ID, c.NodeID, c.Kind, c.Args, c.ExpiresAt.UnixMilli()})
	return b
}

// Sign signs c with the command signing key.
func (c *Command) Sign(key ed25519.PrivateKey) { c.Signature = ed25519.Sign(key, c.signed()) }

// Refusals of Verify.
var (
	ErrBadSignature = errors.New("agentproto: the command's signature does not verify")
	ErrOtherNode    = errors.New("agentproto: the command names another node")
	ErrExpired      = errors.New("agentproto: the command has expired")
)

// Verify checks c against any of the signing roots, for node, at now.
func (c Command) Verify(roots []ed25519.PublicKey, node string, now time.Time) error {
	ok := false
	msg := c.signed()
	for _, r := range roots {
		ok = ok || ed25519.Verify(r, msg, c.Signature)
	}
	switch {
	case !ok:
		return ErrBadSignature
	case c.NodeID != node:
		return ErrOtherNode
	case !now.Before(c.ExpiresAt):
		return ErrExpired
	}
	return nil
}

// Result answers a command.
type Result struct {
	ID     string          `json:"id"`
	OK     bool            `json:"ok"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// Resolve asks for the values of secret references in the user data of an
// instance placed on the daemon's node. The gateway answers only for
// references that instance's user data holds, so a node learns no secret
// of work it does not run. The daemon uses the values in memory (handed to
// the guest) and never writes them to its disk.
type Resolve struct {
	ID         string   `json:"id"`
	InstanceID string   `json:"instanceId"`
	References []string `json:"references"`
}

// Resolved answers a Resolve: every value, or an error naming what could
// not be resolved (never a value).
type Resolved struct {
	ID     string            `json:"id"`
	Values map[string]string `json:"values,omitempty"`
	Error  string            `json:"error,omitempty"`
}

// Renew asks for a new certificate for the same key.
type Renew struct {
	CSR []byte `json:"csr"` // DER
}

// Renewed carries it.
type Renewed struct {
	Certificate []byte `json:"certificate"` // DER
}

// Reconnect tells the daemon to leave and dial another gateway of its
// region after DelayMS.
type Reconnect struct {
	DelayMS int64 `json:"delayMs"`
}

// Error ends a session with a reason before it is welcomed.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfterMS, with UNAVAILABLE, is when the gateway expects to
	// answer again (its database did not answer in time).
	RetryAfterMS int64 `json:"retryAfterMs,omitempty"`
}

// JoinRequest is the body of POST /v1/join.
type JoinRequest struct {
	Token string `json:"token"`
	CSR   []byte `json:"csr"` // DER, ECDSA P-256
	// TPM is the TPM attestor's proof, required where the control plane
	// runs that attestor (attestors: [tpm]).
	TPM *TPMQuote `json:"tpm,omitempty"`
	// CloudIdentity is the provider's signed instance-identity document
	// (a compact JWT from the machine's metadata service, for the audience
	// JoinURL), required for a provider machine's token where the control
	// plane runs the cloud attestor (attestors: [cloud]).
	CloudIdentity string `json:"cloudIdentity,omitempty"`
}

// InstanceIdentityPath is where a provider's metadata service answers a
// machine's signed instance-identity document: GET
// InstanceIdentityPath?audience=<JoinAudience(api)>, the compact JWT as
// text (internal/providers/instanceid is its shape).
const InstanceIdentityPath = "/v1/instance/identity"

// JoinAudience is the audience of an identity document for the join
// endpoint of the public host at base (compute-agent join --api).
func JoinAudience(base string) string { return strings.TrimRight(base, "/") + JoinPath }

// JoinTPMChallengePath is where a node with a TPM asks for its challenge
// before it joins (POST, TPMChallengeRequest -> TPMChallenge).
const JoinTPMChallengePath = JoinPath + "/tpm-challenge"

// TPMAttestationKey is a TPM 2.0 attestation key as its TPM created it
// (go-attestation's AttestationParameters: TPMT_PUBLIC, TPMS_CREATION_DATA,
// TPMS_ATTEST and TPMT_SIGNATURE encodings).
type TPMAttestationKey struct {
	Public            []byte `json:"public"`
	CreateData        []byte `json:"createData"`
	CreateAttestation []byte `json:"createAttestation"`
	CreateSignature   []byte `json:"createSignature"`
}

// TPMChallengeRequest names the node's TPM: its endorsement key (PKIX DER
// public key) and a fresh attestation key, with the join token and the
// certificate request the join will present.
type TPMChallengeRequest struct {
	Token          string            `json:"token"`
	CSR            []byte            `json:"csr"`
	EndorsementKey []byte            `json:"endorsementKey"`
	AttestationKey TPMAttestationKey `json:"attestationKey"`
}

// TPMChallenge is a credential only the TPM holding the endorsement key
// can activate (TPM2_ActivateCredential), and the control plane's sealed
// memory of it (Challenge, returned with the quote).
type TPMChallenge struct {
	Challenge  []byte `json:"challenge"`
	Credential []byte `json:"credential"`
	Secret     []byte `json:"secret"`
}

// TPMQuote proves the join: a quote by the attestation key over
// SHA-256(activated secret || SHA-256(node public key, PKIX DER)), with the
// PCRs it covers (SHA-256 bank).
type TPMQuote struct {
	Challenge      []byte   `json:"challenge"`
	AttestationKey []byte   `json:"attestationKey"` // TPMT_PUBLIC
	Quote          []byte   `json:"quote"`
	Signature      []byte   `json:"signature"`
	PCRs           [][]byte `json:"pcrs"` // digests of PCR 0..n-1
}

// JoinResponse is what a joined daemon keeps.
type JoinResponse struct {
	NodeID      string `json:"nodeId"`
	PoolID      string `json:"poolId"`
	TrustDomain string `json:"trustDomain"`
	Certificate []byte `json:"certificate"` // DER
	// NodeCA verifies node certificates (sent for completeness); ServingCA
	// verifies gateways.
	NodeCA    []byte `json:"nodeCa"`
	ServingCA []byte `json:"servingCa"`
	// CommandSigningKeys verify commands (Ed25519 public keys).
	CommandSigningKeys [][]byte  `json:"commandSigningKeys"`
	Gateways           []Gateway `json:"gateways"`
	// FallbackURL is the wss:// URL of the public host's session endpoint.
	FallbackURL string `json:"fallbackUrl"`
	// ReleaseKeys verify downloaded releases (Ed25519 public keys): the
	// daemon pins them and `compute-agent upgrade` installs only what one
	// of them signed. Absent from an older control plane.
	ReleaseKeys [][]byte `json:"releaseKeys,omitempty"`
}

var uriRe = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]*`)

// SecretReferences returns the secret:// URIs in user data, each once, in
// order of appearance: what a host resolves (Resolve) and substitutes
// before the guest sees the user data. Both ends find them this way.
func SecretReferences(userData string) []string {
	var out []string
	seen := map[string]bool{}
	for _, u := range uriRe.FindAllString(userData, -1) {
		if strings.HasPrefix(u, "secret://") && !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return out
}
