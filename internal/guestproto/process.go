package guestproto

import (
	"errors"
	"fmt"
)

// Background processes (OpProcess): programs that outlive the request that
// started them, kept in compute-guest's process table until the guest
// ends, the way E2B's commands API works. Their output is kept in a
// bounded buffer read by offset.
const (
	ProcessStart  = "start"  // Exec (argv, env, dir) -> the process
	ProcessList   = "list"   // -> every tracked process
	ProcessWait   = "wait"   // PID, WaitMs -> the process (running when the wait ended first)
	ProcessSignal = "signal" // PID, Signal -> the process
	ProcessStdin  = "stdin"  // PID, Data, EOF -> the process
	ProcessRead   = "output" // PID, Offset, WaitMs, Limit -> ProcessOutput
)

// Limits of the process table.
const (
	// MaxProcesses bounds the processes tracked at once; the oldest
	// exited ones are forgotten first, and a start beyond it with none
	// exited is refused.
	MaxProcesses = 64
	// MaxProcessOutput is the output kept per process (stdout and stderr
	// together); older bytes are dropped.
	MaxProcessOutput = 1 << 20
	// MaxProcessRead bounds one output read.
	MaxProcessRead = 256 << 10
	// MaxProcessWaitMs bounds a wait (for the exit or for new output).
	MaxProcessWaitMs = 60 * 1000
)

// Process is an OpProcess request.
type Process struct {
	Action string `json:"action"`
	PID    int    `json:"pid,omitempty"`
	Exec   *Exec  `json:"exec,omitempty"`
	Signal string `json:"signal,omitempty"`
	Data   []byte `json:"data,omitempty"`
	EOF    bool   `json:"eof,omitempty"`
	WaitMs int64  `json:"waitMs,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Limit  int    `json:"limit,omitempty"`
}

// ProcessInfo describes a tracked process.
type ProcessInfo struct {
	PID         int               `json:"pid"`
	Argv        []string          `json:"argv"`
	Env         map[string]string `json:"env,omitempty"`
	Dir         string            `json:"dir,omitempty"`
	StartedAtMs int64             `json:"startedAtMs"` // Unix milliseconds
	Running     bool              `json:"running"`
	ExitCode    *int              `json:"exitCode,omitempty"` // 128 plus the signal when one ended it
	EndedAtMs   int64             `json:"endedAtMs,omitempty"`
	StdinOpen   bool              `json:"stdinOpen"`
	OutputBytes int64             `json:"outputBytes"` // written since the start (kept or not)
}

// ProcessOutput is a read of a process's output from Offset (bytes since
// its start, stdout and stderr interleaved as written).
type ProcessOutput struct {
	Chunks []Output `json:"chunks"`
	// Offset is where Chunks start: past the asked offset when older
	// bytes were dropped (Dropped counts them).
	Offset     int64 `json:"offset"`
	NextOffset int64 `json:"nextOffset"`
	Dropped    int64 `json:"dropped"`
	// Exited with NextOffset at the end: nothing more will come.
	Exited bool        `json:"exited"`
	Info   ProcessInfo `json:"info"`
}

func (p *Process) validate() error {
	if p == nil {
		return errors.New("guestproto: process needs its body")
	}
	switch p.Action {
	case ProcessStart:
		if p.Exec == nil || len(p.Exec.Argv) == 0 || p.Exec.Argv[0] == "" {
			return errors.New("guestproto: process start needs argv")
		}
	case ProcessList:
	case ProcessWait, ProcessSignal, ProcessStdin, ProcessRead:
		if p.PID < 1 {
			return errors.New("guestproto: process needs a pid")
		}
	default:
		return fmt.Errorf("guestproto: unknown process action %q", p.Action)
	}
	if _, ok := Signals[p.Signal]; (p.Signal != "" || p.Action == ProcessSignal) && !ok {
		return fmt.Errorf("guestproto: unknown signal %q", p.Signal)
	}
	if p.WaitMs < 0 || p.WaitMs > MaxProcessWaitMs {
		return fmt.Errorf("guestproto: waitMs is 0 to %d", MaxProcessWaitMs)
	}
	if p.Offset < 0 || p.Limit < 0 || p.Limit > MaxProcessRead {
		return fmt.Errorf("guestproto: offset at least 0, limit 0 to %d", MaxProcessRead)
	}
	return nil
}
