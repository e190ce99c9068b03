package sandboxtemplates_test

// Templates' egress policies (issue 23): checked and stored as given;
// only under network egress.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

func TestTemplateEgressPolicy(t *testing.T) {
	w := setup(t)
	count := func() (n int) {
		require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select count(*) from sandbox_templates where tenant_id = 'acme'`).Scan(&n))
		return n
	}

	// Refused: a domain in deny, a policy under another network. Nothing is left.
	for name, in := range map[string]func(*client.SandboxTemplatesCreateInput){
		"egress.deny[0]": func(in *client.SandboxTemplatesCreateInput) {
			in.Egress = client.NewOptEgressPolicy(client.EgressPolicy{Deny: []string{"files.example.com"}})
		},
		"egress: an egress policy applies only under network egress": func(in *client.SandboxTemplatesCreateInput) {
			in.Network = client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone)
			in.Egress = client.NewOptEgressPolicy(client.EgressPolicy{Allow: []string{"192.0.2.1"}})
		},
	} {
		before := count()
		c := base(w, "bad")
		in(c)
		_, err := w.owner.SandboxTemplatesCreate(t.Context(), c)
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, name)
		assert.Contains(t, e.Message, name)
		assert.Equal(t, before, count(), name)
	}

	in := base(w, "web")
	in.Egress = client.NewOptEgressPolicy(client.EgressPolicy{Allow: []string{"pypi.org", "192.0.2.0/24"}, Deny: []string{"192.0.2.128/25"}})
	res, err := w.owner.SandboxTemplatesCreate(t.Context(), in)
	require.NoError(t, err)
	tp := res.Data
	assert.Equal(t, "egress", string(tp.Network))
	assert.Equal(t, client.EgressPolicy{Allow: []string{"pypi.org", "192.0.2.0/24"}, Deny: []string{"192.0.2.128/25"}}, tp.Egress)

	// Update: a network other than egress with the policy kept is refused;
	// with the policy cleared it is taken.
	_, err = w.owner.SandboxTemplatesUpdate(t.Context(), &client.SandboxTemplatesUpdateInput{TenantId: "acme", TemplateId: tp.TemplateId,
		Network: client.NewOptSandboxTemplatesUpdateInputNetwork(client.SandboxTemplatesUpdateInputNetworkPrivate)})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	up, err := w.owner.SandboxTemplatesUpdate(t.Context(), &client.SandboxTemplatesUpdateInput{TenantId: "acme", TemplateId: tp.TemplateId,
		Network: client.NewOptSandboxTemplatesUpdateInputNetwork(client.SandboxTemplatesUpdateInputNetworkPrivate),
		Egress:  client.NewOptEgressPolicy(client.EgressPolicy{})})
	require.NoError(t, err)
	assert.Equal(t, "private", string(up.Data.Network))
	assert.Empty(t, up.Data.Egress.Allow)
	assert.Equal(t, tp.Version+1, up.Data.Version)
}
