package iam_test

// The identity backends the matrix runs against, and the outage of an
// external one.

import (
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/iam/spicedb/spicedbtest"
	"computeplane/internal/testenv"
)

// backend is an identity configuration: the configuration file's lines
// and the environment it needs.
type backend struct {
	name string
	yaml string
	vars map[string]string
}

func (b backend) env() testenv.Option {
	var opts []testenv.Option
	for _, k := range slices.Sorted(maps.Keys(b.vars)) {
		opts = append(opts, testenv.WithEnv(k, b.vars[k]))
	}
	return testenv.All(opts...)
}

// identityBackends are the embedded service alone, and decisions by a
// SpiceDB of the test's own (the embedded service keeping tenants, keys
// and bindings).
func identityBackends(t *testing.T) []backend {
	t.Helper()
	return []backend{
		{name: "embedded"},
		spiceBackend(spicedbtest.Start(t)),
	}
}

func spiceBackend(s *spicedbtest.Server) backend {
	yaml, vars := s.Config()
	return backend{name: "spicedb", yaml: yaml, vars: vars}
}

// An outage of SpiceDB answers UNAVAILABLE with retryAfterMs, for a fresh
// credential (the role binding cannot be mirrored), a mutation (Require is
// never cached) and a create (its draft cannot be mirrored), and leaves no
// row behind: no draft, no audit, no lease, no idempotency record.
func TestSpiceDBOutageAnswersUnavailable(t *testing.T) {
	t.Parallel()
	server := spicedbtest.Start(t)
	b := spiceBackend(server)
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, b.yaml)), b.env())
	owner := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "owner@acme", owner)))
	site, err := owner.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "before-the-outage"})
	require.NoError(t, err, "SpiceDB decides before the outage")
	fresh := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "admin@acme", admin)))

	server.Stop()
	before := countRows(t, env.Store)
	unavailable := func(what string, err error) {
		t.Helper()
		e := requireCode(t, err, "UNAVAILABLE", http.StatusServiceUnavailable, what)
		if assert.NotNil(t, e.RetryAfterMs, what) {
			assert.Positive(t, *e.RetryAfterMs, what)
		}
	}
	_, err = owner.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "during-the-outage"})
	unavailable("a create", err)
	_, err = owner.SitesUpdate(t.Context(), &client.SitesUpdateInput{
		TenantId: "acme", SiteId: site.Data.SiteId, Region: client.NewOptString("eu-central")})
	unavailable("a mutation of a cached credential", err)
	_, err = fresh.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
	unavailable("a read with a fresh credential", err)
	assert.Equal(t, before, countRows(t, env.Store), "no row is left by a call SpiceDB could not decide")
}
