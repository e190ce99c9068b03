// Package vmruntime is what runs a node's desired spec on the host: the
// qemu runtime (real virtual machines) and the recording runtime, which
// only records specs on disk, for protocol tests and scale benchmarks.
package vmruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// Runtime applies specs. Apply is called with increasing generations and
// must be idempotent: the same body again changes nothing. It refuses a
// spec that fails agentproto's Validate and changes nothing then.
type Runtime interface {
	Name() string
	// Accel is the acceleration the runtime uses (kvm, tcg), "" when none.
	Accel() string
	Apply(ctx context.Context, generation int64, spec agentproto.SpecBody) ([]agentproto.InstanceStatus, error)
	// Observe reports the instances as they are now (a VM killed from
	// outside shows here).
	Observe(ctx context.Context) []agentproto.InstanceStatus
	// Changes signals a change Apply did not return (a boot finished, a VM
	// died); nil when there are none.
	Changes() <-chan struct{}
	Close() error
}

// ResolveFunc resolves the secret references refs of instance id's user
// data through the daemon's session.
type ResolveFunc func(ctx context.Context, id string, refs []string) (map[string]string, error)

// SecretUser is a runtime that hands user data with secret references to
// its guests: the daemon gives it the way to resolve them.
type SecretUser interface {
	UseSecrets(ResolveFunc)
}

// Streams is a runtime that starts interactive programs in its guests
// (the exec tunnels), connects to its guests' TCP ports (tcp tunnels) and
// opens their serial consoles (console tunnels).
type Streams interface {
	Start(ctx context.Context, instanceID string, e *guestproto.Exec) (*qemu.Stream, error)
	Dial(ctx context.Context, instanceID string, port int) (*qemu.Stream, error)
	Console(instanceID string) (*qemu.Console, error)
}

// Guests is a runtime whose instances run a guest agent: the daemon's
// guest commands (exec, readFile, writeFile) go through it.
type Guests interface {
	Exec(ctx context.Context, a agentproto.ExecArgs) (agentproto.ExecOutput, error)
	ReadFile(ctx context.Context, a agentproto.FileArgs) (agentproto.FileOutput, error)
	WriteFile(ctx context.Context, a agentproto.FileArgs) (agentproto.FileOutput, error)
	Snapshot(ctx context.Context, a agentproto.SnapshotArgs) (agentproto.SnapshotOutput, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Processes is a runtime whose guests keep background processes
// (agentproto.CommandProcess).
type Processes interface {
	Process(ctx context.Context, a agentproto.ProcessArgs) (agentproto.ProcessOutput, error)
}

// Desired states (agentproto's).
const (
	StateRunning = agentproto.StateRunning
	StateStopped = agentproto.StateStopped
	StatePaused  = agentproto.StatePaused
	StateDeleted = agentproto.StateDeleted
)

// Recording records specs on disk (dir/spec.json and a line per applied
// generation in dir/applied.log) and reports every instance in its
// desired state. It runs nothing: the egress counters it reports are
// what dir/egress.json holds when it observes ({"<id>": {"tx": n, "rx": n}},
// written by a test to play a node's counters; none without the file).
type Recording struct {
	Dir string

	mu        sync.Mutex
	loaded    bool // instances hold what spec.json holds
	instances []agentproto.InstanceStatus
}

// desired is what a spec reports: each instance in its desired state,
// deleted ones omitted.
func desired(spec agentproto.SpecBody) []agentproto.InstanceStatus {
	var out []agentproto.InstanceStatus
	for _, in := range spec.Instances {
		if in.State != StateDeleted {
			out = append(out, agentproto.InstanceStatus{ID: in.ID, State: in.State})
		}
	}
	return out
}

// Name is "recording".
func (r *Recording) Name() string { return "recording" }

// Accel is none.
func (r *Recording) Accel() string { return "" }

// Apply records the spec.
func (r *Recording) Apply(_ context.Context, generation int64, spec agentproto.SpecBody) ([]agentproto.InstanceStatus, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return nil, err
	}
	b, _ := json.Marshal(agentproto.Spec{Generation: generation, Body: spec})
	tmp := filepath.Join(r.Dir, "spec.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(r.Dir, "spec.json")); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(r.Dir, "applied.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintf(f, "%d\n", generation)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	out := desired(spec)
	r.mu.Lock()
	r.instances, r.loaded = out, true
	r.mu.Unlock()
	return out, err
}

// Observe returns what was applied last, by this process or, after a
// restart, by the one before (spec.json).
func (r *Recording) Observe(context.Context) []agentproto.InstanceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.loaded {
		r.loaded = true
		var rec agentproto.Spec
		if b, err := os.ReadFile(filepath.Join(r.Dir, "spec.json")); err == nil && json.Unmarshal(b, &rec) == nil && rec.Body.Validate() == nil {
			r.instances = desired(rec.Body)
		}
	}
	out := append([]agentproto.InstanceStatus(nil), r.instances...)
	var counters map[string]struct{ Tx, Rx uint64 }
	if b, err := os.ReadFile(filepath.Join(r.Dir, RecordingCounters)); err == nil && json.Unmarshal(b, &counters) == nil {
		for i := range out {
			c := counters[out[i].ID]
			out[i].EgressTxBytes, out[i].EgressRxBytes = c.Tx, c.Rx
		}
	}
	return out
}

// RecordingCounters is the file of the recording runtime's egress counters.
const RecordingCounters = "egress.json"

// Changes is nil: nothing changes on its own.
func (r *Recording) Changes() <-chan struct{} { return nil }

// Close does nothing.
func (r *Recording) Close() error { return nil }
