package main

// computectl against a real fleet: computed with every role and a
// compute-agent with the qemu runtime; sandboxes are real VMs (TCG) whose
// guest agent runs the commands.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	gencli "computeplane/gen/cli"
	"computeplane/gen/client"
	"computeplane/internal/cli"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
)

func TestSandboxesOnARealVM(t *testing.T) {
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	env := map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: f.Key, cli.EnvTenant: fleettest.Tenant}

	// -q prints the template's id, not its image's.
	r := cmd(t, env, "", "-q", "sandboxTemplates", "create", "--name", "t1", "--pool-id", pool, "--flavor", "small", "--network", "none",
		"--image-id", "computeplane/minimal")
	require.Equal(t, 0, r.code, r.stderr)
	tpl := strings.TrimSpace(r.stdout)
	r = cmd(t, env, "", "sandboxTemplates", "get", "--template-id", tpl)
	require.Equal(t, 0, r.code, r.stderr)

	// --wait alone waits up to 30 s; on a terminal each state shows on
	// stderr; -q prints the sandbox's id, not its node's.
	var out, errOut strings.Builder
	code := cli.Run(context.Background(), gencli.Groups, []string{"-q", "sandboxes", "create", "--template-id", tpl, "--wait", "--idempotency-key", "s1"},
		func(k string) string { return env[k] }, cli.Streams{Stdout: &out, Stderr: &errOut, StderrTTY: true})
	require.Equal(t, 0, code, errOut.String())
	sbx := strings.TrimSpace(out.String())
	assert.NotEqual(t, agent.Node, sbx)
	assert.Regexp(t, regexp.MustCompile(`(?m)^\s+[0-9.]+s  sandboxes `+sbx+`: creating$`), errOut.String())
	assert.Regexp(t, regexp.MustCompile(`(?m)^\s+[0-9.]+s  sandboxes `+sbx+`: running$`), errOut.String())
	r = cmd(t, env, "", "-q", "sandboxes", "list")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, sbx+"\n", r.stdout)
	r = cmd(t, env, "", "-q", "sandboxes", "get", "--sandbox-id", sbx)
	assert.Equal(t, sbx+"\n", r.stdout)

	// exec: raw output on stdout and stderr, the command's exit code.
	r = cmd(t, env, "", "sandboxes", "exec", "--sandbox-id", sbx, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	assert.Equal(t, 3, r.code, r.stderr)
	assert.Equal(t, "out\n", r.stdout)
	assert.Equal(t, "err\n", r.stderr)
	// A process left running in the background, holding the output.
	r = cmd(t, env, "", "sandboxes", "exec", "--sandbox-id", sbx, "--", "sh", "-c", "(sleep 300) & echo $! > /tmp/bg.pid; echo started")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "started\n", r.stdout)
	r = cmd(t, env, "", "sandboxes", "exec", "--sandbox-id", sbx, "--", "sh", "-c", "kill -0 $(cat /tmp/bg.pid) && echo alive")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "alive\n", r.stdout)

	// writeFile from stdin or a file, readFile raw to stdout or a file.
	content := "bytes \x00\xff\n and more"
	r = cmd(t, env, content, "sandboxes", "writeFile", "--sandbox-id", sbx, "--path", "/tmp/a.bin", "--from", "-")
	require.Equal(t, 0, r.code, r.stderr)
	r = cmd(t, env, "", "sandboxes", "readFile", "--sandbox-id", sbx, "--path", "/tmp/a.bin")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, content, r.stdout)
	local := filepath.Join(t.TempDir(), "b.bin")
	require.NoError(t, os.WriteFile(local, []byte("from a file"), 0o600))
	r = cmd(t, env, "", "sandboxes", "writeFile", "--sandbox-id", sbx, "--path", "/tmp/b.bin", "--from", local)
	require.Equal(t, 0, r.code, r.stderr)
	back := filepath.Join(t.TempDir(), "back.bin")
	r = cmd(t, env, "", "sandboxes", "readFile", "--sandbox-id", sbx, "--path", "/tmp/b.bin", "--to", back)
	require.Equal(t, 0, r.code, r.stderr)
	got, err := os.ReadFile(back)
	require.NoError(t, err)
	assert.Equal(t, "from a file", string(got))
	r = cmd(t, env, "", "sandboxes", "writeFile", "--sandbox-id", sbx, "--path", "/tmp/c")
	assert.Equal(t, cli.ExitUsage, r.code, "no content: nothing sent")
}
