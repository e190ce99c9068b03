package tunnels_test

// Interactive tunnels end to end through real processes (computed with
// the api and the gateway, a compute-agent with the qemu runtime) and
// real VMs (TCG), driven by computectl as a user runs it: a shell on a
// pseudo-terminal the test holds (creack/pty), a program signalled
// without one, a server in a sandbox reached through port-forward, and
// the serial console of an instance.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	gencli "computeplane/gen/cli"
	"computeplane/gen/client"
	"computeplane/internal/cli"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// output is what a process wrote, read as it comes.
// startTerminal runs cmd (computectl) on a new 80x24 terminal, copies what
// it shows into an output and returns a function that types on it; the
// terminal is closed and the command killed when the test ends.
func startTerminal(t *testing.T, cmd *exec.Cmd) (*os.File, *output, func(string)) {
	t.Helper()
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 80, Rows: 24})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = tty.Close() })
	out := &output{}
	go func() { _, _ = io.Copy(out, tty) }()
	return tty, out, func(s string) {
		_, err := tty.Write([]byte(s))
		require.NoError(t, err)
	}
}

type output struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// await waits until the output after mark holds want and returns the
// output's length then (the next mark).
func (o *output) await(t *testing.T, mark int, want string) int {
	t.Helper()
	var at int
	ok := assert.Eventually(t, func() bool {
		s := o.String()
		if i := strings.Index(s[mark:], want); i >= 0 {
			at = mark + i + len(want)
			return true
		}
		return false
	}, 30*time.Second, 20*time.Millisecond)
	require.True(t, ok, "no %q in the output after %d: %q", want, mark, o.String()[mark:])
	return at
}

func TestInteractiveTunnels(t *testing.T) {
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.Tunnels())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("computed:\n%s\nagent:\n%s", proctest.Tail(f.Computed.Stderr.String(), 60), proctest.Tail(agent.Proc.Stderr.String(), 60))
		}
	})
	ctx := t.Context()
	computectl := proctest.Build(t, "computeplane/cmd/computectl")
	env := map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: f.Key, cli.EnvTenant: fleettest.Tenant}
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(computectl, args...)
		cmd.Env = append(proctest.ChildEnv(env), "TERM=xterm-256color")
		return cmd
	}

	// One sandbox and one instance, both running, shared by the cases.
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool,
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
		Flavor:  "small", ImageId: "computeplane/minimal"})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1"})
	require.NoError(t, err)
	inst, err := f.C.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: pool, Flavor: "small",
		ImageId: "computeplane/minimal", Name: "web", IdempotencyKey: "web",
		Network: client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone)})
	require.NoError(t, err)
	sandbox, instance := sbx.Data.SandboxId, inst.Data.InstanceId
	require.Eventually(t, func() bool {
		s, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: sandbox})
		require.NoError(t, err)
		i, err := f.C.InstancesGet(ctx, &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: instance})
		require.NoError(t, err)
		return s.Data.State == "running" && string(i.Data.State) == "running"
	}, 120*time.Second, 200*time.Millisecond)

	t.Run("an input of another kind's", func(t *testing.T) {
		target := client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: sandbox}
		for name, in := range map[string]*client.TunnelsOpenInput{
			"tcp without a port": {Kind: client.TunnelsOpenInputKindTCP, Target: target},
			"exec with a port":   {Kind: client.TunnelsOpenInputKindExec, Target: target, Argv: []string{"true"}, Port: client.NewOptInt64(80)},
			"console with argv":  {Kind: client.TunnelsOpenInputKindConsole, Target: target, Argv: []string{"true"}},
			"size without tty": {Kind: client.TunnelsOpenInputKindExec, Target: target, Argv: []string{"true"},
				Size: client.NewOptTerminalSize(client.TerminalSize{Cols: 80, Rows: 24})},
		} {
			in.TenantId = fleettest.Tenant
			_, err := f.C.TunnelsOpen(ctx, in)
			e, ok := computeclient.AsError(err)
			require.True(t, ok, "%s: %v", name, err)
			assert.Equal(t, "INVALID_INPUT", e.Code, name)
		}
	})

	t.Run("a shell on a terminal", func(t *testing.T) {
		cmd := command("shell", sandbox)
		tty, out, type_ := startTerminal(t, cmd)

		// A terminal of its own, of the local terminal's size and type.
		type_("tty; stty size; echo term=$TERM\r")
		m := out.await(t, 0, "/dev/pts/")
		m = out.await(t, m, "24 80")
		m = out.await(t, m, "term=xterm-256color")

		// The local terminal resized: SIGWINCH, a resize frame, the
		// remote terminal's new size.
		require.NoError(t, pty.Setsize(tty, &pty.Winsize{Cols: 120, Rows: 40}))
		time.Sleep(300 * time.Millisecond)
		type_("stty size\r")
		m = out.await(t, m, "40 120")

		// Ctrl-C is a byte in raw mode: the remote terminal interrupts
		// its foreground job, and the shell (and computectl) go on.
		type_("sleep 100\r")
		time.Sleep(time.Second)
		start := time.Now()
		type_("\x03")
		type_("echo rc=$?\r")
		m = out.await(t, m, "rc=130")
		assert.Less(t, time.Since(start), 20*time.Second)

		// The shell's exit code is computectl's.
		type_("exit 3\r")
		err = cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "output: %q", out.String())
		assert.Equal(t, 3, exit.ExitCode())
	})

	t.Run("a program signalled without a terminal", func(t *testing.T) {
		cmd := command("exec", sandbox, "--", "sh", "-c", "echo ready; sleep 100")
		var out, errOut output
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		out.await(t, 0, "ready\n")
		// computectl's SIGINT is the program's: it dies of it, 128+2.
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		err := cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "stderr: %s", errOut.String())
		assert.Equal(t, 130, exit.ExitCode(), errOut.String())
	})

	t.Run("a server in the sandbox through port-forward", func(t *testing.T) {
		// busybox httpd on the guest's loopback only, in the background.
		r, err := f.C.SandboxesExec(ctx, &client.SandboxesExecInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Argv: []string{"sh", "-c",
			"mkdir -p /www && echo hello from the sandbox > /www/index.html && busybox httpd -p 127.0.0.1:8080 -h /www"}})
		require.NoError(t, err)
		require.Equal(t, int64(0), r.Data.ExitCode, r.Data.Stderr)

		cmd := command("port-forward", sandbox, "0:8080")
		var out, errOut output
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		out.await(t, 0, " -> 8080\n")
		local := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> 8080`).FindStringSubmatch(out.String())
		require.NotNil(t, local, out.String())

		// Two requests, two connections: a tunnel each.
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		for range 2 {
			resp, err := hc.Get("http://" + local[1] + "/index.html")
			require.NoError(t, err, "stderr: %s", errOut.String())
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "hello from the sandbox\n", string(body))
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		require.NoError(t, cmd.Wait(), errOut.String())

		require.Eventually(t, func() bool {
			l, err := f.C.TunnelsList(ctx, &client.TunnelsListInput{TenantId: fleettest.Tenant, IncludeClosed: client.NewOptBool(true)})
			require.NoError(t, err)
			n := 0
			for _, tun := range l.Data.Items {
				if tun.Kind == client.TunnelKindTCP && tun.State == client.TunnelStateClosed {
					n++
					assert.Equal(t, client.NewNilInt64(8080), tun.Port)
					assert.Greater(t, tun.BytesOut, int64(0))
					assert.True(t, tun.ExitCode.Null, "a connection has no exit code")
				}
			}
			return n == 2
		}, 10*time.Second, 100*time.Millisecond)
	})

	t.Run("the serial console of an instance", func(t *testing.T) {
		in, typed := io.Pipe()
		var out, errOut output
		done := make(chan int, 1)
		cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		go func() {
			done <- cli.Run(cctx, gencli.Groups, []string{"console", instance}, func(k string) string { return env[k] },
				cli.Streams{Stdin: in, Stdout: &out, Stderr: &errOut})
		}()
		// The boot, from the log's tail (the instance booted before).
		m := out.await(t, 0, "compute-guest: READY")
		assert.Contains(t, out.String(), "Please press Enter to activate this console.")
		// Typed on the console: a shell answers.
		_, err := typed.Write([]byte("\r"))
		require.NoError(t, err)
		time.Sleep(500 * time.Millisecond)
		_, err = typed.Write([]byte("echo console-$((6*7))\r"))
		require.NoError(t, err)
		out.await(t, m, "console-42")
		// Ctrl-] leaves.
		_, err = typed.Write([]byte{0x1d})
		require.NoError(t, err)
		select {
		case code := <-done:
			assert.Equal(t, 0, code, errOut.String())
		case <-time.After(10 * time.Second):
			t.Fatal("Ctrl-] did not leave the console")
		}
		assert.Contains(t, errOut.String(), "Connected to the serial console of "+instance)
	})
}
