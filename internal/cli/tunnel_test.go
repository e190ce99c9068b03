package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
)

func TestTunnelArguments(t *testing.T) {
	parse := func(args ...string) (*invocation, *tunnelArgs, error) {
		inv, err := parse(nil, args)
		require.NoError(t, err)
		a, err := parseTunnelArgs(inv, inv.rest)
		return inv, a, err
	}
	inv, a, err := parse("--cp-url", "http://x:1", "exec", "-it", "-e", "A=1", "--env=B=2", "--cp-token", "k", "sbx_0123456789abcdefghjkmnpqrs", "--", "sh", "-c", "exit 3")
	require.NoError(t, err)
	assert.Equal(t, "exec", inv.tunnel)
	assert.True(t, a.stdin && a.tty)
	assert.Equal(t, map[string]string{"A": "1", "B": "2"}, a.env)
	assert.Equal(t, client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: "sbx_0123456789abcdefghjkmnpqrs"}, a.target)
	assert.Equal(t, []string{"sh", "-c", "exit 3"}, a.argv)
	assert.Equal(t, map[string]string{"url": "http://x:1", "token": "k"}, inv.global)

	// The command's own flags after the target are its own.
	_, a, err = parse("exec", "inst_0123456789abcdefghjkmnpqrs", "ls", "-t")
	require.NoError(t, err)
	assert.False(t, a.tty)
	assert.Equal(t, client.TunnelTargetKindInstance, a.target.Kind)
	assert.Equal(t, []string{"ls", "-t"}, a.argv)

	_, a, err = parse("shell", "sbx_0123456789abcdefghjkmnpqrs")
	require.NoError(t, err)
	assert.True(t, a.stdin && a.tty)
	assert.Equal(t, "/bin/sh", a.argv[0])

	// A node's console (and shell): its daemon's shell on a terminal.
	for _, cmd := range []string{"console", "shell"} {
		inv, a, err = parse(cmd, "node_0123456789abcdefghjkmnpqrs")
		require.NoError(t, err)
		assert.Equal(t, "shell", inv.tunnel, cmd)
		assert.Equal(t, "node_0123456789abcdefghjkmnpqrs", a.node, cmd)
		assert.True(t, a.stdin && a.tty, cmd)
		assert.Empty(t, a.argv, cmd)
	}

	_, a, err = parse("port-forward", "sbx_0123456789abcdefghjkmnpqrs", "8080:80", "5432")
	require.NoError(t, err)
	assert.Equal(t, [][2]int{{8080, 80}, {0, 5432}}, a.forwards)

	for args, want := range map[string]string{
		"exec sbx_0123456789abcdefghjkmnpqrs": "needs a command",
		"exec":                                "needs a TARGET",
		"exec node_1 -- ls":                   "has a console only",
		"port-forward node_1 80":              "has a console only",
		"port-forward sbx_0123456789abcdefghjkmnpqrs":       "needs ports",
		"port-forward sbx_0123456789abcdefghjkmnpqrs 1:0":   "ports 1 to 65535",
		"console inst_0123456789abcdefghjkmnpqrs extra":     "unexpected arguments",
		"console --tty inst_0123456789abcdefghjkmnpqrs":     "unknown flag --tty",
		"exec -e NOVALUE sbx_0123456789abcdefghjkmnpqrs ls": "NAME=VALUE",
	} {
		_, _, err := parse(strings.Fields(args)...)
		var ue *UsageError
		require.ErrorAs(t, err, &ue, args)
		assert.Contains(t, err.Error(), want, args)
	}
}
