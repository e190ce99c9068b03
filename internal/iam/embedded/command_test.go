package embedded

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/iam"
)

func run(s *Service, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = RunCommand(context.Background(), s, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestRunCommand(t *testing.T) {
	s, _, _ := newTestService(t)
	ctx := context.Background()

	code, out, errOut := run(s, "create-key", "--tenant", "acme", "--identity", "alice@acme", "--role", "admin", "--mfa")
	require.Equal(t, 0, code, errOut)
	assert.GreaterOrEqual(t, strings.Count(out, "\n"), 2, "a human line, then the key")
	assert.True(t, strings.HasSuffix(out, "\n"))
	token := lastLine(out)
	require.Regexp(t, tokenShape, token)
	c, err := s.Authenticate(ctx, iam.Credential{Token: token})
	require.NoError(t, err)
	assert.Equal(t, "alice@acme", c.IdentityID)
	assert.Equal(t, "acme", c.TenantID)
	assert.True(t, c.MFA)
	require.NoError(t, s.Require(ctx, c, "compute:sites:manage", iam.Resource{Type: "compute-tenant", ID: "acme"}))

	// An agent key: --confirm repeated, with further actions after it.
	code, out, errOut = run(s, "create-key", "-tenant=acme", "--identity", "carol", "--role", "member",
		"--agent", "bot-1", "--confirm", "compute:sites:manage", "compute:sandboxes:manage", "--confirm", "compute:webhooks:manage")
	require.Equal(t, 0, code, errOut)
	agent, err := s.Authenticate(ctx, iam.Credential{Token: lastLine(out)})
	require.NoError(t, err)
	assert.Equal(t, "bot-1", agent.AgentID)
	var cr *iam.ConfirmationRequired
	require.ErrorAs(t, s.Require(ctx, agent, "compute:sites:manage", iam.Resource{Type: "compute-tenant", ID: "acme"}), &cr)

	code, out, errOut = run(s, "list-keys", "--tenant", "acme")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.True(t, strings.HasPrefix(lines[0], "KEY ID"))
	assert.Contains(t, out, token[4:20])
	assert.Contains(t, out, "compute:sandboxes:manage,compute:sites:manage,compute:webhooks:manage")
	assert.NotContains(t, out, token)
	assert.NotContains(t, out, token[21:])

	code, out, _ = run(s, "list-keys", "--tenant", "nobody")
	require.Equal(t, 0, code)
	assert.Equal(t, 1, strings.Count(out, "\n"), "the header only")

	code, out, errOut = run(s, "revoke-key", "--key-id", token[4:20])
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, token[4:20])
	_, err = s.Authenticate(ctx, iam.Credential{Token: token})
	assert.ErrorIs(t, err, iam.ErrUnauthenticated)

	// Failures that are not usage: exit 1.
	code, _, errOut = run(s, "revoke-key", "--key-id", "0000000000000000")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "not found")
	code, out, errOut = run(s, "create-key", "--tenant", "acme", "--identity", "alice@acme", "--role", "viewer")
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "holds role admin")

	code, out, _ = run(s, "help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "create-key")
}

func TestRunCommandUsage(t *testing.T) {
	s, _, _ := newTestService(t)
	for _, args := range [][]string{
		{},
		{"make-key"},
		{"create-key"},
		{"create-key", "--tenant", "acme", "--identity", "a"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "root"},
		{"create-key", "--tenant", "a b", "--identity", "a", "--role", "owner"},
		{"create-key", "--tenant", strings.Repeat("t", 129), "--identity", "a", "--role", "owner"},
		{"create-key", "--tenant", "acme", "--identity", "a/b", "--role", "owner"},
		{"create-key", "--tenant", "acme", "--identity", strings.Repeat("i", 129), "--role", "owner"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "owner", "--kind", "robot"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "owner", "--confirm", "compute:sites:manage"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "owner", "--agent", "bot", "--confirm", "compute:Sites:manage"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "owner", "--agent", "bot", "--confirm", "compute:sites:manage", "sites:read"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "owner", "extra"},
		{"create-key", "--tenant", "acme", "--identity", "a", "--role", "owner", "--color"},
		{"revoke-key"},
		{"revoke-key", "--key-id", "short"},
		{"revoke-key", "--key-id", "0000000000000000", "again"},
		{"list-keys", "--tenant", "a b"},
		{"list-keys", "--all"},
	} {
		code, out, errOut := run(s, args...)
		assert.Equal(t, 2, code, "%q", args)
		assert.Empty(t, out, "%q", args)
		assert.NotEmpty(t, errOut, "%q", args)
	}
	keys, err := s.ListKeys(context.Background(), "")
	require.NoError(t, err)
	assert.Empty(t, keys, "usage errors create nothing")
}

func TestSetRoleCommand(t *testing.T) {
	s, _, _ := newTestService(t)
	ctx := context.Background()
	code, out, errOut := run(s, "create-key", "--tenant", "acme", "--identity", "dora", "--role", "viewer")
	require.Equal(t, 0, code, errOut)
	c, err := s.Authenticate(ctx, iam.Credential{Token: lastLine(out)})
	require.NoError(t, err)
	require.Error(t, s.Require(ctx, c, "compute:sites:manage", iam.Resource{Type: "compute-tenant", ID: "acme"}), "a viewer changes nothing")

	code, out, errOut = run(s, "set-role", "--tenant", "acme", "--identity", "dora", "--role", "admin")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "viewer -> admin")
	require.NoError(t, s.Require(ctx, c, "compute:sites:manage", iam.Resource{Type: "compute-tenant", ID: "acme"}), "the same key, now an admin")

	code, _, errOut = run(s, "set-role", "--tenant", "globex", "--identity", "dora", "--role", "admin")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "not in tenant globex")
	code, _, _ = run(s, "set-role", "--tenant", "acme", "--identity", "dora", "--role", "god")
	assert.Equal(t, 2, code)
}
