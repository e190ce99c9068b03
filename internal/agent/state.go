// Package agent is compute-agent, the node daemon: it joins a pool with a
// single-use token, then holds a session with a gateway of its region
// (mutual TLS first, the WebSocket fallback second), applies the desired
// spec through a runtime, executes signed commands once each and reports
// status. Everything it keeps lives in one directory (State).
package agent

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"computeplane/internal/agentproto"
)

// Files of the agent's directory.
const (
	fileKey        = "node.key"        // the node key, PEM PKCS#8, 0600
	fileCert       = "node.crt"        // the node certificate, PEM
	fileState      = "state.json"      // State
	fileTransports = "transports.json" // the last transport that worked, per gateway
	fileStatus     = "status.json"     // Status, for operators and tests
	dirCommands    = "commands"        // one journal file per command id
	fileObserved   = "observed.json"   // the applied spec generation
)

// State is what a joined daemon keeps (state.json).
type State struct {
	NodeID             string               `json:"nodeId"`
	PoolID             string               `json:"poolId"`
	TrustDomain        string               `json:"trustDomain"`
	APIURL             string               `json:"apiUrl"`
	FallbackURL        string               `json:"fallbackUrl"`
	NodeCA             []byte               `json:"nodeCa"`    // DER
	ServingCA          []byte               `json:"servingCa"` // DER
	CommandSigningKeys [][]byte             `json:"commandSigningKeys"`
	Gateways           []agentproto.Gateway `json:"gateways"`
	// ReleaseKeys are the pinned release keys (Ed25519 public keys) that
	// upgrades must be signed with.
	ReleaseKeys [][]byte `json:"releaseKeys,omitempty"`
}

// writeFileAtomic writes through a temporary file and a rename.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b, 0o600)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Dir is the agent's directory.
type Dir string

func (d Dir) path(name string) string { return filepath.Join(string(d), name) }

// LoadState reads state.json.
func (d Dir) LoadState() (*State, error) {
	var s State
	if err := readJSON(d.path(fileState), &s); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("agent: %s holds no joined node: run compute-agent join first", d)
		}
		return nil, err
	}
	return &s, nil
}

// SaveState writes state.json.
func (d Dir) SaveState(s *State) error { return writeJSON(d.path(fileState), s) }

// LoadIdentity reads the node key and certificate.
func (d Dir) LoadIdentity() (*ecdsa.PrivateKey, *x509.Certificate, error) {
	kb, err := os.ReadFile(d.path(fileKey))
	if err != nil {
		return nil, nil, err
	}
	blk, _ := pem.Decode(kb)
	if blk == nil {
		return nil, nil, errors.New("agent: node.key is not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("agent: node.key is not ECDSA")
	}
	cb, err := os.ReadFile(d.path(fileCert))
	if err != nil {
		return nil, nil, err
	}
	blk, _ = pem.Decode(cb)
	if blk == nil {
		return nil, nil, errors.New("agent: node.crt is not PEM")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	return key, cert, err
}

// SaveCert writes the node certificate (a renewal).
func (d Dir) SaveCert(der []byte) error {
	return writeFileAtomic(d.path(fileCert), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// ReleasePublicKeys are the pinned release keys.
func (s *State) ReleasePublicKeys() []ed25519.PublicKey {
	var out []ed25519.PublicKey
	for _, k := range s.ReleaseKeys {
		if len(k) == ed25519.PublicKeySize {
			out = append(out, ed25519.PublicKey(k))
		}
	}
	return out
}

func (s *State) commandKeys() []ed25519.PublicKey {
	out := make([]ed25519.PublicKey, 0, len(s.CommandSigningKeys))
	for _, k := range s.CommandSigningKeys {
		if len(k) == ed25519.PublicKeySize {
			out = append(out, ed25519.PublicKey(k))
		}
	}
	return out
}

// Status is status.json: what the daemon is doing now.
type Status struct {
	NodeID             string    `json:"nodeId"`
	GatewayID          string    `json:"gatewayId"`
	GatewayURL         string    `json:"gatewayUrl,omitempty"` // the URL dialled
	Transport          string    `json:"transport"`
	SessionEpoch       int64     `json:"sessionEpoch"`
	ObservedGeneration int64     `json:"observedGeneration"`
	Connected          bool      `json:"connected"`
	UpdatedAt          time.Time `json:"updatedAt"`
	// Version, Pid and StartedAt name the daemon process: upgrade signals
	// that pid and waits for a start of the new version.
	Version   string    `json:"version,omitempty"`
	Pid       int       `json:"pid,omitempty"`
	StartedAt time.Time `json:"startedAt,omitzero"`
}

// statusFile keeps status.json current.
type statusFile struct {
	mu  sync.Mutex
	dir Dir
	s   Status
}

func (f *statusFile) update(fn func(*Status)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.s)
	f.s.UpdatedAt = time.Now().UTC()
	_ = writeJSON(f.dir.path(fileStatus), f.s)
}
