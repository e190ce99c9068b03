package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto"
)

var commandIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// journal keeps each command's result on disk before it is sent: a
// command re-sent (the sweeper, a new session) gets the first result and
// is never executed twice.
type journal struct{ dir string }

func (j journal) path(id string) string { return filepath.Join(j.dir, id+".json") }

func (j journal) get(id string) (*agentproto.Result, bool) {
	var r agentproto.Result
	if readJSON(j.path(id), &r) != nil {
		return nil, false
	}
	return &r, true
}

func (j journal) put(r *agentproto.Result) error {
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return err
	}
	return writeJSON(j.path(r.ID), r)
}

// execute runs a verified command once and journals its result.
func (a *Agent) execute(c *agentproto.Command) *agentproto.Result {
	if !commandIDRe.MatchString(c.ID) {
		return &agentproto.Result{ID: c.ID, Error: "a command id of 1 to 128 characters of A-Z a-z 0-9 _ -"}
	}
	j := journal{dir: a.dir.path(dirCommands)}
	if r, ok := j.get(c.ID); ok {
		return r
	}
	r := &agentproto.Result{ID: c.ID}
	if err := c.Verify(a.state.commandKeys(), a.state.NodeID, time.Now()); err != nil {
		r.Error = err.Error()
	} else {
		out, err := a.run(c)
		if err != nil {
			r.Error = err.Error()
		} else {
			r.OK, r.Output = true, out
		}
	}
	if err := j.put(r); err != nil {
		a.log.Warn("journaling a command result", "command", c.ID, "error", err.Error())
	}
	return r
}

func (a *Agent) run(c *agentproto.Command) (json.RawMessage, error) {
	switch c.Kind {
	case agentproto.CommandEcho:
		return c.Args, nil
	case agentproto.CommandNotice:
		// Kept where workloads and operators read them: notices/<id>.json.
		if err := os.MkdirAll(a.dir.path("notices"), 0o700); err != nil {
			return nil, err
		}
		return json.RawMessage(`{"kept":true}`), writeFileAtomic(a.dir.path("notices/"+c.ID+".json"), c.Args, 0o600)
	case agentproto.CommandInventory:
		inv := a.inventory()
		a.pendingInventory.Store(&inv)
		return json.Marshal(inv)
	case agentproto.CommandExec, agentproto.CommandReadFile, agentproto.CommandWriteFile,
		agentproto.CommandSnapshot, agentproto.CommandDeleteSnapshot:
		return a.guestCommand(c)
	case agentproto.CommandProcess:
		return a.processCommand(c)
	case agentproto.CommandSupportBundle:
		return a.supportBundle(c)
	case agentproto.CommandUploadSupportBundle:
		return a.uploadSupportBundle(c)
	}
	return nil, errors.New("unknown command kind " + c.Kind)
}

// guestCommand runs a command inside an instance's guest through the
// runtime.
func (a *Agent) guestCommand(c *agentproto.Command) (json.RawMessage, error) {
	g, ok := a.o.Runtime.(vmruntime.Guests)
	if !ok {
		return nil, errors.New("the " + a.o.Runtime.Name() + " runtime runs no guests")
	}
	ctx := context.Background()
	switch c.Kind {
	case agentproto.CommandExec:
		var args agentproto.ExecArgs
		if err := json.Unmarshal(c.Args, &args); err != nil {
			return nil, err
		}
		out, err := g.Exec(ctx, args)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	case agentproto.CommandSnapshot, agentproto.CommandDeleteSnapshot:
		var args agentproto.SnapshotArgs
		if err := json.Unmarshal(c.Args, &args); err != nil {
			return nil, err
		}
		if c.Kind == agentproto.CommandDeleteSnapshot {
			return json.RawMessage(`{}`), g.DeleteSnapshot(ctx, args.SnapshotID)
		}
		out, err := g.Snapshot(ctx, args)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	default:
		var args agentproto.FileArgs
		if err := json.Unmarshal(c.Args, &args); err != nil {
			return nil, err
		}
		read := g.ReadFile
		if c.Kind == agentproto.CommandWriteFile {
			read = g.WriteFile
		}
		out, err := read(ctx, args)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}
}

// processCommand passes a request of a guest's process table through.
func (a *Agent) processCommand(c *agentproto.Command) (json.RawMessage, error) {
	g, ok := a.o.Runtime.(vmruntime.Processes)
	if !ok {
		return nil, errors.New("the " + a.o.Runtime.Name() + " runtime runs no guest processes")
	}
	var args agentproto.ProcessArgs
	if err := json.Unmarshal(c.Args, &args); err != nil {
		return nil, err
	}
	out, err := g.Process(context.Background(), args)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// guestKinds are the commands that may run long (inside a guest, copying
// a VM's files, collecting or uploading a support bundle): they run beside
// each other.
var guestKinds = map[string]bool{agentproto.CommandExec: true, agentproto.CommandProcess: true, agentproto.CommandReadFile: true, agentproto.CommandWriteFile: true,
	agentproto.CommandSnapshot: true, agentproto.CommandDeleteSnapshot: true,
	agentproto.CommandSupportBundle: true, agentproto.CommandUploadSupportBundle: true}

// MaxGuestCommands bounds the guest commands in flight on a node: each
// holds a goroutine, a guest channel request and, for an exec, a process
// in the guest.
const MaxGuestCommands = 64

// ErrBusy answers a guest command beyond MaxGuestCommands; the control
// plane answers UNAVAILABLE with a retry hint.
var ErrBusy = errors.New(agentproto.BusyPrefix + "this node runs as many guest commands as it takes; retry")

// begin marks a guest command in flight: false when it already is (a
// re-send waits for its first run's result), ErrBusy when the node runs
// MaxGuestCommands.
func (a *Agent) begin(id string) (bool, error) {
	a.imu.Lock()
	defer a.imu.Unlock()
	if a.inflight[id] {
		return false, nil
	}
	if len(a.inflight) >= MaxGuestCommands {
		return false, ErrBusy
	}
	a.inflight[id] = true
	return true, nil
}

func (a *Agent) finish(id string) {
	a.imu.Lock()
	delete(a.inflight, id)
	a.imu.Unlock()
}
