package iam_test

// The identity backends the matrix runs against, and the outage of an
// external one.

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/iam/oidc/oidctest"
	"computeplane/internal/iam/spicedb/spicedbtest"
	"computeplane/internal/testenv"
)

// backend is an identity configuration: the configuration file's lines
// and the environment it needs, and its external servers.
type backend struct {
	name string
	yaml string
	vars map[string]string
	// spice decides (nil: the embedded policy); the service mirrors role
	// bindings into it from the identity inbox.
	spice *spicedbtest.Server
	// oidc authenticates every identity of the matrix by an access token
	// of its own (nil: by API keys).
	oidc *oidctest.Provider
}

func (b backend) env() testenv.Option {
	var opts []testenv.Option
	for _, k := range slices.Sorted(maps.Keys(b.vars)) {
		opts = append(opts, testenv.WithEnv(k, b.vars[k]))
	}
	return testenv.All(opts...)
}

// identityBackends are the embedded service alone, decisions by a SpiceDB
// of the test's own (the embedded service keeping tenants, keys and
// bindings), and both external adapters: every identity authenticated by
// an access token of an OIDC provider, decided by another SpiceDB.
func identityBackends(t *testing.T) []backend {
	t.Helper()
	return []backend{
		{name: "embedded"},
		spiceBackend(spicedbtest.Start(t)),
		externalBackend(oidctest.Start(t, oidctest.TokenTTL(matrixTokenTTL)), spicedbtest.Start(t)),
	}
}

// matrixTokenTTL is the lifetime of the matrix's access tokens: longer
// than its slowest run (15 minutes on a loaded machine), as a long-lived
// session's would be.
const matrixTokenTTL = 2 * time.Hour

func spiceBackend(s *spicedbtest.Server) backend {
	yaml, vars := s.Config()
	return backend{name: "spicedb", yaml: yaml, vars: vars, spice: s}
}

// externalBackend authenticates by p's access tokens and decides by s.
func externalBackend(p *oidctest.Provider, s *spicedbtest.Server) backend {
	_, vars := s.Config()
	yaml := fmt.Sprintf("iam: {authentication: {oidc: {issuer: '%s', audience: '%s'}}, decisions: {spicedb: {endpoint: '%s', plaintext: true}}}\n",
		p.Issuer, oidctest.Audience, s.Endpoint)
	return backend{name: "oidc+spicedb", yaml: yaml, vars: vars, spice: s, oidc: p}
}

// awaitRole waits until the backend decides on identity's role in tenant:
// at once for the embedded policy, once the identity inbox brought the
// binding to SpiceDB.
func (b backend) awaitRole(t *testing.T, tenant, identity, role string) {
	t.Helper()
	if b.spice != nil {
		b.spice.AwaitRole(t, tenant, identity, role)
	}
}

// credentials makes keys the backend's: each identity's role is decided
// on, and with an OIDC provider each identity presents an access token
// the provider issued to it (subject the identity, tenant claim its home
// tenant) instead of its API key.
func (b backend) credentials(t *testing.T, keys []keyOf) []keyOf {
	t.Helper()
	out := slices.Clone(keys)
	for i, k := range out {
		b.awaitRole(t, k.tenant, k.identity, k.role)
		if b.oidc != nil {
			out[i].token = b.oidc.Token(t, k.identity, k.tenant)
		}
	}
	if b.oidc != nil && len(out) > 0 {
		// The tokens outlive the slowest run of the matrix.
		require.WithinDuration(t, time.Now().Add(matrixTokenTTL), oidctest.Expiry(t, out[0].token), time.Minute)
	}
	return out
}

// An outage of SpiceDB answers UNAVAILABLE with retryAfterMs, for a read
// with a fresh credential (nothing cached decides it), a mutation (Require
// is never cached) and a create (its draft cannot be mirrored), and leaves no
// row behind: no draft, no audit, no lease, no idempotency record.
func TestSpiceDBOutageAnswersUnavailable(t *testing.T) {
	t.Parallel()
	server := spicedbtest.Start(t)
	b := spiceBackend(server)
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, b.yaml)), b.env())
	owner := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "owner@acme", owner)))
	b.awaitRole(t, "acme", "owner@acme", "owner")
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

// Role bindings reach SpiceDB from the identity inbox, not on the
// authentication path: a role change is decided on within the inbox's
// delay, and authenticating fresh credentials (an API key's and an access
// token's) writes nothing to SpiceDB (its revision stays).
func TestSpiceDBBindingsFollowTheInbox(t *testing.T) {
	t.Parallel()
	b := externalBackend(oidctest.Start(t), spicedbtest.Start(t))
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, b.yaml)), b.env())
	key := env.Key(t, "acme", "rita@acme", viewer)
	b.awaitRole(t, "acme", "rita@acme", viewer)
	rita := env.Client(t, computeclient.WithToken(key))
	create := func(c *computeclient.Client) error {
		_, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
			TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: fmt.Sprintf("k-%d", time.Now().UnixNano())})
		return err
	}
	_, err := rita.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
	require.NoError(t, err, "a viewer reads")
	requireCode(t, create(rita), "ACCESS_DENIED", http.StatusForbidden, "a viewer does not create")

	t.Run("authentication writes nothing", func(t *testing.T) {
		rev := b.spice.Revision(t)
		// A second key of the same identity (no new binding, no event)
		// and an access token: credentials no cache holds.
		fresh := []string{env.Key(t, "acme", "rita@acme", viewer), b.oidc.Token(t, "rita@acme", "acme")}
		for _, tok := range fresh {
			c := env.Client(t, computeclient.WithToken(tok))
			assert.Equal(t, "rita@acme", whoami(t, c).IdentityId.Value)
			_, err := c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
			require.NoError(t, err)
		}
		assert.Equal(t, rev, b.spice.Revision(t), "no SpiceDB write while authenticating and deciding")
	})

	t.Run("a role change is decided on within the inbox's delay", func(t *testing.T) {
		rev := b.spice.Revision(t)
		_, err := env.Identity().SetRole(t.Context(), "acme", "rita@acme", member)
		require.NoError(t, err)
		changed := time.Now()
		token := env.Client(t, computeclient.WithToken(b.oidc.Token(t, "rita@acme", "acme")))
		for _, c := range []*computeclient.Client{rita, token} {
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				assert.NoError(ct, create(c))
			}, spicedbtest.AwaitWithin, 20*time.Millisecond, "a member creates once the inbox brought the binding")
		}
		t.Logf("the role change was decided on %s after it committed (load %s)", time.Since(changed).Round(time.Millisecond), loadAverage())
		assert.NotEqual(t, rev, b.spice.Revision(t), "the change was written to SpiceDB (the revision is a true measure)")

		_, err = env.Identity().SetRole(t.Context(), "acme", "rita@acme", viewer)
		require.NoError(t, err)
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			e, ok := computeclient.AsError(create(rita))
			if assert.True(ct, ok, "refused") {
				assert.Equal(ct, "ACCESS_DENIED", e.Code)
			}
		}, spicedbtest.AwaitWithin, 20*time.Millisecond, "a viewer again: the cached credential is decided on the new binding")
	})
}

// loadAverage is the machine's load (a figure taken on a loaded machine
// says so).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
