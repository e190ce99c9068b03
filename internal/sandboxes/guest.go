package sandboxes

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/iam"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/rpc"
)

// GuestGrace is how long beyond a guest command's own timeout its answer
// is waited for (the command travels through a gateway to the node).
const GuestGrace = 15 * time.Second

// FileTimeout bounds a readFile or writeFile.
const FileTimeout = 30 * time.Second

// guest sends a command into a running sandbox's guest and answers its
// result after the commit: decode turns the node's output into the call's
// answer; no answer within wait is UNAVAILABLE (nothing was lost: the
// command may still run).
func (s *Service) guest(ctx context.Context, tenant, sandbox, kind string, args func(instanceID string) any, wait time.Duration,
	decode func(json.RawMessage) (any, error)) error {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return err
	}
	r, vm, err := load(ctx, q, tenant, sandbox)
	if err != nil {
		return err
	}
	if st := state(r, vm); st != StateRunning {
		return api.Errorf(api.CodeInvalidState, "sandbox %s is %s; only a running one runs commands", sandbox, st).WithDetails(map[string]any{"state": st})
	}
	body, _ := json.Marshal(args(vm.InstanceID))
	cmd, topic, err := nodework.EnqueueCommand(ctx, tx, r.NodeID, kind, body, "sandboxes", wait, time.Now())
	if err != nil {
		return err
	}
	notify.Later(ctx, topic)
	id := cmd.CommandID
	rpc.ThenPoll(ctx, rpc.Poll{Timeout: wait, Topic: nodework.ResultTopic(id), TimedOut: unanswered(sandbox)}, func(ctx context.Context) (any, bool, error) {
		res, err := db.New(s.Store.Pool()).GetCommandResult(ctx, id)
		if err != nil {
			return nil, false, nil
		}
		switch res.State {
		case "succeeded":
			var out agentproto.Result
			if err := json.Unmarshal(res.Result, &out); err != nil {
				return nil, true, err
			}
			v, err := decode(out.Output)
			return v, true, err
		case "failed":
			var out agentproto.Result
			_ = json.Unmarshal(res.Result, &out)
			return nil, true, guestError(out.Error)
		case "expired":
			return nil, true, unanswered(sandbox)
		}
		return nil, false, nil
	})
	return nil
}

func unanswered(sandbox string) error {
	return api.Errorf(api.CodeUnavailable, "the host of sandbox %s did not answer in time; retry", sandbox).
		WithDetails(map[string]any{"retryAfterMs": rpc.DefaultRetryAfterMs})
}

// guestError maps what the guest said to the call's error.
func guestError(msg string) error {
	switch {
	case strings.HasPrefix(msg, agentproto.BusyPrefix):
		return api.Errorf(api.CodeUnavailable, "the sandbox's host is busy (%s)", strings.TrimPrefix(msg, agentproto.BusyPrefix)).
			WithDetails(map[string]any{"retryAfterMs": rpc.DefaultRetryAfterMs})
	case strings.Contains(msg, "no such file") || strings.Contains(msg, "not exist"):
		return api.Errorf(api.CodeNotFound, "path: %s", msg)
	case strings.Contains(msg, "not running") || strings.Contains(msg, "no such instance"):
		return api.Errorf(api.CodeInvalidState, "%s", msg)
	// The process table's refusals (processes.go).
	case strings.Contains(msg, ": no such process"):
		return api.Errorf(api.CodeNotFound, "%s", msg)
	case strings.HasSuffix(msg, " exited") || strings.Contains(msg, "its stdin is closed") || strings.Contains(msg, "does not read its stdin"):
		return api.Errorf(api.CodeInvalidState, "%s", msg)
	}
	return api.Errorf(api.CodeInvalidInput, "the sandbox refused it: %s", msg)
}

// Exec answers sandboxes.exec.
func (s *Service) Exec(ctx context.Context, in *api.SandboxesExecInput) (*api.ExecResult, error) {
	timeout := in.TimeoutMs
	err := s.guest(ctx, in.TenantID, in.SandboxID, agentproto.CommandExec, func(vm string) any {
		a := agentproto.ExecArgs{InstanceID: vm, Argv: in.Argv, Env: in.Env, TimeoutMs: timeout}
		if in.Dir != nil {
			a.Dir = *in.Dir
		}
		if in.Stdin != nil {
			a.Stdin = []byte(*in.Stdin)
		}
		return a
	}, time.Duration(timeout)*time.Millisecond+GuestGrace, func(raw json.RawMessage) (any, error) {
		var out agentproto.ExecOutput
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, err
		}
		return &api.ExecResult{ExitCode: int64(out.ExitCode), Stdout: strings.ToValidUTF8(string(out.Stdout), "\uFFFD"),
			Stderr: strings.ToValidUTF8(string(out.Stderr), "\uFFFD"), Truncated: out.Truncated, TimedOut: out.TimedOut, DurationMs: out.DurationMs}, nil
	})
	return &api.ExecResult{}, err
}

// ReadFile answers sandboxes.readFile.
func (s *Service) ReadFile(ctx context.Context, in *api.SandboxesReadFileInput) (*api.SandboxFile, error) {
	err := s.guest(ctx, in.TenantID, in.SandboxID, agentproto.CommandReadFile, func(vm string) any {
		return agentproto.FileArgs{InstanceID: vm, Path: in.Path}
	}, FileTimeout, func(raw json.RawMessage) (any, error) {
		var out agentproto.FileOutput
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, err
		}
		content := out.Data
		if content == nil {
			content = []byte{} // an empty file is "", not null (writeFile's answer)
		}
		return &api.SandboxFile{Path: in.Path, SizeBytes: int64(len(content)), ContentBase64: &content}, nil
	})
	return &api.SandboxFile{Path: in.Path}, err
}

// WriteFile answers sandboxes.writeFile.
func (s *Service) WriteFile(ctx context.Context, in *api.SandboxesWriteFileInput) (*api.SandboxFile, error) {
	// The decoder refused text that is not base64; maxLength lets through
	// 2 bytes more than 4 MiB.
	data := in.ContentBase64
	if len(data) > 4<<20 {
		return nil, api.Errorf(api.CodeInvalidInput, "contentBase64: %d bytes; at most 4 MiB", len(data))
	}
	mode := uint32(in.Mode)
	err := s.guest(ctx, in.TenantID, in.SandboxID, agentproto.CommandWriteFile, func(vm string) any {
		return agentproto.FileArgs{InstanceID: vm, Path: in.Path, Data: data, Mode: mode}
	}, FileTimeout, func(json.RawMessage) (any, error) {
		return &api.SandboxFile{Path: in.Path, SizeBytes: int64(len(data))}, nil
	})
	if err != nil {
		return nil, err
	}
	return &api.SandboxFile{Path: in.Path}, nil
}

// RunningVM is the VM and node of a running sandbox of tenant (the tunnels
// group reaches it): NOT_FOUND for another tenant's or an absent one,
// INVALID_STATE for one not running.
func RunningVM(ctx context.Context, q *db.Queries, tenant, sandbox string) (instanceID, nodeID string, err error) {
	r, vm, err := load(ctx, q, tenant, sandbox)
	if err != nil {
		return "", "", err
	}
	if st := state(r, vm); st != StateRunning {
		return "", "", api.Errorf(api.CodeInvalidState, "sandbox %s is %s; only a running one opens tunnels", sandbox, st).WithDetails(map[string]any{"state": st})
	}
	return vm.InstanceID, r.NodeID, nil
}
