package tunnels_test

// Break-glass tunnels to a node end to end through real processes:
// computed (api and gateway), compute-agents (the recording runtime: a
// node needs no VM for its own console) and computectl as an operator
// runs it, on a pseudo-terminal the test holds, and the system's OpenSSH
// client for SSH to the node. The node's shell is a script that runs
// /bin/sh in a directory the test made (--node-console-command).

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/cli"
	"computeplane/internal/config"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
)

func TestNodeTunnels(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("the OpenSSH client is not installed (apt-get install openssh-client; .ci/run installs it)")
	}
	f := fleettest.Start(t, "", fleettest.SSH())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	home := t.TempDir()
	shell := filepath.Join(t.TempDir(), "node-shell")
	require.NoError(t, os.WriteFile(shell, []byte(fmt.Sprintf("#!/bin/sh\ncd %q || exit 1\nexec /bin/sh \"$@\"\n", home)), 0o755))
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "100", "--node-console-command", shell)
	bare := f.Join(pool, "--runtime", "recording", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "100")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("computed:\n%s\nagent:\n%s", proctest.Tail(f.Computed.Stderr.String(), 60), proctest.Tail(agent.Proc.Stderr.String(), 60))
		}
	})
	ctx := t.Context()
	node := agent.Node
	root := config.DefaultRootTenantID
	mfaKey := f.CreateKey(root, "operator", "owner", "--mfa")
	plainKey := f.CreateKey(root, "operator2", "owner")
	computectl := proctest.Build(t, "computeplane/cmd/computectl")
	command := func(key string, args ...string) *exec.Cmd {
		cmd := exec.Command(computectl, args...)
		cmd.Env = append(proctest.ChildEnv(map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: key, cli.EnvTenant: root,
			cli.EnvConfig: filepath.Join(t.TempDir(), "none.json")}), "TERM=xterm-256color")
		return cmd
	}
	as := func(key string) *computeclient.Client { return newClient(t, f, key) }
	openNode := func(c *computeclient.Client, tenant string) error {
		_, err := c.TunnelsOpenNode(ctx, &client.TunnelsOpenNodeInput{TenantId: tenant, NodeId: node, Kind: client.TunnelsOpenNodeInputKindNodeConsole})
		return err
	}
	code := func(err error) string {
		e, ok := computeclient.AsError(err)
		require.True(t, ok, "%v", err)
		return e.Code
	}

	t.Run("refusals", func(t *testing.T) {
		// Without an MFA session: ACCESS_DENIED, reason mfa-required.
		err := openNode(as(plainKey), root)
		require.Equal(t, "ACCESS_DENIED", code(err))
		e, _ := computeclient.AsError(err)
		assert.Equal(t, "mfa-required", e.Details["reason"])
		// Another tenant than the root: INVALID_INPUT before anything.
		assert.Equal(t, "INVALID_INPUT", code(openNode(f.C, fleettest.Tenant)))
		// A root-tenant member (not an operator), even from MFA.
		assert.Equal(t, "ACCESS_DENIED", code(openNode(as(f.CreateKey(root, "dev", "member", "--mfa")), root)))
		// Another tenant's owner naming the root tenant.
		assert.Equal(t, "ACCESS_DENIED", code(openNode(f.C, root)))
		// computectl says it, with the access exit code.
		cmd := command(plainKey, "console", node)
		out, _ := cmd.CombinedOutput()
		assert.Equal(t, cli.ExitAccess, cmd.ProcessState.ExitCode(), "%s", out)
		assert.Contains(t, string(out), "mfa-required")
		// A node whose daemon has no --node-console-command refuses.
		cmd = command(mfaKey, "console", bare.Node)
		out, _ = cmd.CombinedOutput()
		assert.NotEqual(t, 0, cmd.ProcessState.ExitCode())
		assert.Contains(t, string(out), "without --node-console-command")
	})

	t.Run("the node's console on a terminal", func(t *testing.T) {
		cmd := command(mfaKey, "console", node)
		tty, out, type_ := startTerminal(t, cmd)
		// The configured shell, in its directory, on a terminal of the
		// local one's size.
		type_("pwd; tty; stty size; echo term=$TERM\r")
		m := out.await(t, 0, home)
		m = out.await(t, m, "/dev/pts/")
		m = out.await(t, m, "24 80")
		m = out.await(t, m, "term=xterm-256color")
		// Resized: the remote terminal follows.
		require.NoError(t, pty.Setsize(tty, &pty.Winsize{Cols: 120, Rows: 40}))
		time.Sleep(300 * time.Millisecond)
		type_("stty size\r")
		m = out.await(t, m, "40 120")
		// Ctrl-C interrupts the foreground job; the shell goes on.
		type_("sleep 100\r")
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		type_("\x03")
		type_("echo rc=$?\r")
		out.await(t, m, "rc=130")
		assert.Less(t, time.Since(start), 10*time.Second)
		// The shell's exit code is computectl's.
		type_("exit 3\r")
		err := cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "output: %q", out.String())
		assert.Equal(t, 3, exit.ExitCode())

		// Recorded: the root tenant's tunnel to the node, its exit code
		// and events.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			l, err := as(mfaKey).TunnelsList(ctx, &client.TunnelsListInput{TenantId: root, IncludeClosed: client.NewOptBool(true)})
			require.NoError(c, err)
			require.NotEmpty(c, l.Data.Items)
			got := l.Data.Items[0]
			assert.Equal(c, client.TunnelEnd{Kind: client.TunnelEndKindNode, ID: node}, got.Target)
			assert.Equal(c, client.TunnelKindNodeConsole, got.Kind)
			assert.Equal(c, client.TunnelStateClosed, got.State)
			assert.Equal(c, client.NewNilInt64(3), got.ExitCode)
			assert.Equal(c, 1, f.Events("tunnel.opened", got.TunnelId))
			assert.Equal(c, 1, f.Events("tunnel.closed", got.TunnelId))
		}, 10*time.Second, 100*time.Millisecond)
	})

	t.Run("ssh to the node with a fresh certificate", func(t *testing.T) {
		cmd := command(mfaKey, "ssh", node, "--", "echo hi from $(pwd) as $(id -un); echo to-err >&2; exit 5")
		cmd.Env = append(cmd.Env, os.Environ()...)
		var stdout, stderr output
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		done := make(chan error, 1)
		require.NoError(t, cmd.Start())
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("computectl ssh did not end; stderr: %s", stderr.String())
		}
		require.Equal(t, 5, cmd.ProcessState.ExitCode(), "stdout %q stderr %q", stdout.String(), stderr.String())
		assert.Equal(t, "hi from "+home+" as root\n", stdout.String())
		assert.Equal(t, "to-err\n", stderr.String())
		assert.Equal(t, 1, f.Events("security.ssh.certificate.issued", node))

		// Without MFA the certificate is refused first.
		cmd = command(plainKey, "ssh", node, "--", "true")
		out, _ := cmd.CombinedOutput()
		assert.Equal(t, cli.ExitAccess, cmd.ProcessState.ExitCode(), "%s", out)
		assert.Contains(t, string(out), "mfa-required")
	})

	t.Run("a restarted daemon ends the console with a clear message", func(t *testing.T) {
		cmd := command(mfaKey, "console", node)
		tty, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 80, Rows: 24})
		require.NoError(t, err)
		defer tty.Close()
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		var out output
		go func() { _, _ = io.Copy(&out, tty) }()
		_, err = tty.Write([]byte("echo ready-$((2*3))\r"))
		require.NoError(t, err)
		out.await(t, 0, "ready-6")
		agent.Stop()
		err = cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "output: %q", out.String())
		assert.Equal(t, cli.ExitTunnelLost, exit.ExitCode())
		assert.Contains(t, out.String(), "the node's daemon went away")
		agent.Run()
		require.Eventually(t, func() bool { return f.NodeState(node) == "ready" }, 60*time.Second, 50*time.Millisecond)
	})
}
