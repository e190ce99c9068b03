package guest

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/guestproto"
)

func TestBackgroundProcesses(t *testing.T) {
	p, _ := serve(t)
	p.next(t) // ready
	id := uint64(0)
	call := func(pr guestproto.Process) guestproto.Response {
		t.Helper()
		id++
		return p.call(t, guestproto.Request{ID: id, Op: guestproto.OpProcess, Process: &pr})
	}
	dir := t.TempDir()
	// A process that outlives its start: it echoes its stdin line by line.
	r := call(guestproto.Process{Action: guestproto.ProcessStart, Exec: &guestproto.Exec{
		Argv: []string{"/bin/sh", "-c", `echo "up $GREETING $(pwd)"; echo warn >&2; while read l; do echo "got $l"; done; exit 7`},
		Env:  map[string]string{"GREETING": "hi"}, Dir: dir}})
	require.True(t, r.OK, r.Error)
	require.Len(t, r.Processes, 1)
	pid := r.Processes[0].PID
	assert.True(t, r.Processes[0].Running)

	// Output by offset, waiting for it to come (stdout and stderr may
	// come in either order).
	text := func(o *guestproto.ProcessOutput, fd int) (s string) {
		for _, c := range o.Chunks {
			if c.Fd == fd {
				s += string(c.Data)
			}
		}
		return s
	}
	var stdout string
	next := int64(0)
	follow := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stdout, want) && time.Now().Before(deadline); {
			r := call(guestproto.Process{Action: guestproto.ProcessRead, PID: pid, Offset: next, WaitMs: 2000})
			require.True(t, r.OK, r.Error)
			stdout += text(r.ProcessOutput, 1)
			next = r.ProcessOutput.NextOffset
		}
		require.Contains(t, stdout, want)
	}
	follow("up hi " + dir + "\n")
	r = call(guestproto.Process{Action: guestproto.ProcessStdin, PID: pid, Data: []byte("one\n")})
	require.True(t, r.OK, r.Error)
	follow("got one\n")
	assert.Equal(t, "up hi "+dir+"\ngot one\n", stdout)

	// A wait bounded by waitMs answers it running.
	r = call(guestproto.Process{Action: guestproto.ProcessWait, PID: pid, WaitMs: 100})
	require.True(t, r.OK, r.Error)
	assert.True(t, r.Processes[0].Running)

	r = call(guestproto.Process{Action: guestproto.ProcessList})
	require.True(t, r.OK, r.Error)
	require.Len(t, r.Processes, 1)
	assert.Equal(t, []string{"/bin/sh", "-c"}, r.Processes[0].Argv[:2])

	// The end of stdin ends the loop; the exit code is the program's.
	r = call(guestproto.Process{Action: guestproto.ProcessStdin, PID: pid, EOF: true})
	require.True(t, r.OK, r.Error)
	r = call(guestproto.Process{Action: guestproto.ProcessWait, PID: pid, WaitMs: 5000})
	require.True(t, r.OK, r.Error)
	require.False(t, r.Processes[0].Running)
	assert.Equal(t, 7, *r.Processes[0].ExitCode)
	r = call(guestproto.Process{Action: guestproto.ProcessRead, PID: pid})
	assert.True(t, r.ProcessOutput.Exited)
	assert.Equal(t, "warn\n", text(r.ProcessOutput, 2))

	// A signal ends a sleeper: 128 plus the signal, as a shell says.
	r = call(guestproto.Process{Action: guestproto.ProcessStart, Exec: &guestproto.Exec{Argv: []string{"sleep", "60"}}})
	require.True(t, r.OK, r.Error)
	sleeper := r.Processes[0].PID
	r = call(guestproto.Process{Action: guestproto.ProcessSignal, PID: sleeper, Signal: "TERM"})
	require.True(t, r.OK, r.Error)
	r = call(guestproto.Process{Action: guestproto.ProcessWait, PID: sleeper, WaitMs: 5000})
	require.True(t, r.OK, r.Error)
	assert.Equal(t, 128+15, *r.Processes[0].ExitCode)
	r = call(guestproto.Process{Action: guestproto.ProcessSignal, PID: sleeper, Signal: "TERM"})
	assert.Contains(t, r.Error, "exited")
	r = call(guestproto.Process{Action: guestproto.ProcessWait, PID: 999999})
	assert.Contains(t, r.Error, "no such process")
}
