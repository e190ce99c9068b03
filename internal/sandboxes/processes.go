package sandboxes

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	"computeplane/gen/api"
	"computeplane/internal/agentproto"
	"computeplane/internal/guestproto"
)

// Background processes (docs/sandboxes.md, "Processes"): each call is a
// guest command that reaches the process table compute-guest keeps.

// process sends one request to the sandbox's process table; answer
// decodes the guest's reply.
func (s *Service) process(ctx context.Context, tenant, sandbox string, p guestproto.Process, answer func(agentproto.ProcessOutput) (any, error)) error {
	body, _ := json.Marshal(p)
	wait := time.Duration(p.WaitMs)*time.Millisecond + FileTimeout
	return s.guest(ctx, tenant, sandbox, agentproto.CommandProcess, func(vm string) any {
		return agentproto.ProcessArgs{InstanceID: vm, Process: body}
	}, wait, func(raw json.RawMessage) (any, error) {
		var out agentproto.ProcessOutput
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, err
		}
		return answer(out)
	})
}

// one answers the single process of a start, wait, signal or stdin.
func one(out agentproto.ProcessOutput) (any, error) {
	var ps []guestproto.ProcessInfo
	if err := json.Unmarshal(out.Processes, &ps); err != nil || len(ps) != 1 {
		return nil, api.Errorf(api.CodeUnavailable, "the sandbox's guest answered no process; retry").
			WithDetails(map[string]any{"retryAfterMs": 1000})
	}
	p := processAPI(ps[0])
	return &p, nil
}

func processAPI(p guestproto.ProcessInfo) api.SandboxProcess {
	out := api.SandboxProcess{Pid: int64(p.PID), Argv: p.Argv, Env: maps.Clone(p.Env), Running: p.Running, StdinOpen: p.StdinOpen,
		OutputBytes: p.OutputBytes, StartedAt: stampMs(p.StartedAtMs)}
	if out.Env == nil {
		out.Env = map[string]string{}
	}
	if out.Argv == nil {
		out.Argv = []string{}
	}
	if p.Dir != "" {
		out.Dir = &p.Dir
	}
	if p.ExitCode != nil {
		c := int64(*p.ExitCode)
		out.ExitCode = &c
	}
	if p.EndedAtMs != 0 {
		e := stampMs(p.EndedAtMs)
		out.EndedAt = &e
	}
	return out
}

func stampMs(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

// StartProcess answers sandboxes.startProcess.
func (s *Service) StartProcess(ctx context.Context, in *api.SandboxesStartProcessInput) (*api.SandboxProcess, error) {
	e := &guestproto.Exec{Argv: in.Argv, Env: in.Env}
	if in.Dir != nil {
		e.Dir = *in.Dir
	}
	err := s.process(ctx, in.TenantID, in.SandboxID, guestproto.Process{Action: guestproto.ProcessStart, Exec: e}, one)
	return &api.SandboxProcess{}, err
}

// ListProcesses answers sandboxes.listProcesses.
func (s *Service) ListProcesses(ctx context.Context, in *api.SandboxesListProcessesInput) (*api.SandboxProcessList, error) {
	err := s.process(ctx, in.TenantID, in.SandboxID, guestproto.Process{Action: guestproto.ProcessList}, func(out agentproto.ProcessOutput) (any, error) {
		var ps []guestproto.ProcessInfo
		if len(out.Processes) > 0 {
			if err := json.Unmarshal(out.Processes, &ps); err != nil {
				return nil, err
			}
		}
		list := &api.SandboxProcessList{Items: make([]api.SandboxProcess, 0, len(ps))}
		for _, p := range ps {
			list.Items = append(list.Items, processAPI(p))
		}
		return list, nil
	})
	return &api.SandboxProcessList{}, err
}

// WaitProcess answers sandboxes.waitProcess.
func (s *Service) WaitProcess(ctx context.Context, in *api.SandboxesWaitProcessInput) (*api.SandboxProcess, error) {
	err := s.process(ctx, in.TenantID, in.SandboxID, guestproto.Process{Action: guestproto.ProcessWait, PID: int(in.Pid), WaitMs: in.TimeoutMs}, one)
	return &api.SandboxProcess{}, err
}

// SignalProcess answers sandboxes.signalProcess.
func (s *Service) SignalProcess(ctx context.Context, in *api.SandboxesSignalProcessInput) (*api.SandboxProcess, error) {
	err := s.process(ctx, in.TenantID, in.SandboxID, guestproto.Process{Action: guestproto.ProcessSignal, PID: int(in.Pid), Signal: in.Signal}, one)
	return &api.SandboxProcess{}, err
}

// WriteProcessStdin answers sandboxes.writeProcessStdin.
func (s *Service) WriteProcessStdin(ctx context.Context, in *api.SandboxesWriteProcessStdinInput) (*api.SandboxProcess, error) {
	err := s.process(ctx, in.TenantID, in.SandboxID, guestproto.Process{Action: guestproto.ProcessStdin, PID: int(in.Pid),
		Data: []byte(in.Data), EOF: in.Eof}, one)
	return &api.SandboxProcess{}, err
}

// ReadProcessOutput answers sandboxes.readProcessOutput.
func (s *Service) ReadProcessOutput(ctx context.Context, in *api.SandboxesReadProcessOutputInput) (*api.SandboxProcessOutput, error) {
	err := s.process(ctx, in.TenantID, in.SandboxID, guestproto.Process{Action: guestproto.ProcessRead, PID: int(in.Pid), Offset: in.Offset,
		Limit: int(in.Limit), WaitMs: in.WaitMs}, func(out agentproto.ProcessOutput) (any, error) {
		var o guestproto.ProcessOutput
		if err := json.Unmarshal(out.ProcessOutput, &o); err != nil {
			return nil, err
		}
		res := &api.SandboxProcessOutput{Chunks: make([]api.SandboxOutputChunk, 0, len(o.Chunks)), Offset: o.Offset, NextOffset: o.NextOffset,
			Dropped: o.Dropped, Exited: o.Exited, Process: processAPI(o.Info)}
		for _, c := range o.Chunks {
			stream := "stdout"
			if c.Fd == 2 {
				stream = "stderr"
			}
			res.Chunks = append(res.Chunks, api.SandboxOutputChunk{Stream: stream, Data: strings.ToValidUTF8(string(c.Data), "\uFFFD")})
		}
		return res, nil
	})
	return &api.SandboxProcessOutput{}, err
}
