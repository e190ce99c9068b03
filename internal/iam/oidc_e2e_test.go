package iam_test

// Authentication of access tokens of a real OIDC provider
// (internal/iam/oidc/oidctest: tools/oidcprovider on zitadel/oidc's op).

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/iam/oidc"
	"computeplane/internal/iam/oidc/oidctest"
	"computeplane/internal/iam/spicedb/spicedbtest"
	"computeplane/internal/testenv"
)

// oidcEnv starts the api role accepting tokens of p, on a clock the test
// moves (set to now: tokens carry real times).
func oidcEnv(t *testing.T, p *oidctest.Provider, extra ...string) (*testenv.Env, *fakeClock) {
	t.Helper()
	clk := newClock()
	clk.Set(time.Now())
	yaml := p.Config()
	for _, e := range extra {
		yaml += e
	}
	return testenv.Start(t, withClock(clk), testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, yaml))), clk
}

func TestOIDCAccessTokens(t *testing.T) {
	t.Parallel()
	p := oidctest.Start(t)
	env, clk := oidcEnv(t, p)
	// The subject is an identity the embedded service keeps: its home
	// tenant and role binding decide (create-key made it; its key is
	// never used here).
	env.Key(t, "acme", "alice@acme", viewer)
	env.Key(t, "globex", "bob@globex", owner)
	tok := p.Token(t, "alice@acme", "acme")
	c := env.Client(t, computeclient.WithToken(tok))

	t.Run("discovered, verified and mapped to the identity", func(t *testing.T) {
		who := whoami(t, c)
		assert.Equal(t, "alice@acme", who.IdentityId.Value)
		assert.Equal(t, "acme", who.TenantId.Value)
		assert.Equal(t, oidc.SessionKindJWT, who.SessionKind.Value)
		_, err := c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		require.NoError(t, err, "a viewer reads")
		_, err = c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k1"})
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "a viewer does not create")
		_, err = c.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "another tenant")
	})

	t.Run("refused: unknown subject, wrong tenant claim, forged, other audience", func(t *testing.T) {
		for name, tok := range map[string]string{
			"unknown subject":    p.Token(t, "mallory@acme", "acme"),
			"wrong tenant claim": p.Token(t, "bob@globex", "acme"),
			"forged signature":   tok[:len(tok)-4] + "AAAA",
		} {
			_, err := env.Client(t, computeclient.WithToken(tok)).SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
			requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, name)
		}
		wrongAudience := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t,
			"iam: {authentication: {oidc: {issuer: '"+p.Issuer+"', audience: someone-else}}}\n")))
		wrongAudience.Key(t, "acme", "alice@acme", viewer)
		_, err := wrongAudience.Client(t, computeclient.WithToken(tok)).SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, "a token for another audience")
		q := oidctest.Start(t) // another provider: another issuer and keys
		env.Key(t, "acme", "carol@acme", viewer)
		_, err = env.Client(t, computeclient.WithToken(q.Token(t, "carol@acme", "acme"))).SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, "a token of another provider")
	})

	t.Run("keys rotated: the new key is taken, a removed key refused after the 30 s credential cache", func(t *testing.T) {
		old := p.Token(t, "bob@globex", "globex")
		bob := env.Client(t, computeclient.WithToken(old))
		_, err := bob.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
		require.NoError(t, err)
		p.Rotate(t)
		clk.Set(clk.Now().Add(2 * time.Second)) // past the refetch spacing
		fresh := env.Client(t, computeclient.WithToken(p.Token(t, "bob@globex", "globex")))
		_, err = fresh.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
		require.NoError(t, err, "a token signed by the new key (unknown id: the JWKS is fetched again)")
		p.Retire(t)
		_, err = bob.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
		require.NoError(t, err, "within 30 s the credential cache answers")
		clk.Set(clk.Now().Add(31 * time.Second))
		_, err = bob.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
		requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, "a token of the removed key")
		_, err = fresh.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
		require.NoError(t, err, "the new key's token still")
	})
}

// An outage of the provider answers UNAVAILABLE with retryAfterMs once the
// keys must be fetched again, and leaves no row.
func TestOIDCProviderOutageAnswersUnavailable(t *testing.T) {
	t.Parallel()
	p := oidctest.Start(t)
	env, clk := oidcEnv(t, p)
	env.Key(t, "acme", "alice@acme", owner)
	tok := p.Token(t, "alice@acme", "acme")
	_, err := env.Client(t, computeclient.WithToken(tok)).SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
	require.NoError(t, err)
	p.Stop()
	clk.Set(clk.Now().Add(oidc.KeysTTL + 31*time.Second)) // past the credential cache and the keys' lifetime
	before := countRows(t, env.Store)
	_, err = env.Client(t, computeclient.WithToken(tok)).SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "during-the-outage"})
	e := requireCode(t, err, "UNAVAILABLE", http.StatusServiceUnavailable, "provider down")
	if assert.NotNil(t, e.RetryAfterMs) {
		assert.Positive(t, *e.RetryAfterMs)
	}
	assert.Equal(t, before, countRows(t, env.Store), "no row is left")
}

// Both external adapters at once: a token of the provider, decided by
// SpiceDB on the identity's role binding.
func TestOIDCWithSpiceDBDecisions(t *testing.T) {
	t.Parallel()
	b := externalBackend(oidctest.Start(t), spicedbtest.Start(t))
	p := b.oidc
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, b.yaml)), b.env())
	env.Key(t, "acme", "alice@acme", member)
	env.Key(t, "acme", "vera@acme", viewer)
	b.awaitRole(t, "acme", "alice@acme", member)
	b.awaitRole(t, "acme", "vera@acme", viewer)
	alice := env.Client(t, computeclient.WithToken(p.Token(t, "alice@acme", "acme")))
	vera := env.Client(t, computeclient.WithToken(p.Token(t, "vera@acme", "acme")))
	created, err := alice.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k1"})
	require.NoError(t, err, "a member creates")
	_, err = alice.SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "acme", SiteId: created.Data.SiteId, Region: client.NewOptString("eu-central")})
	require.NoError(t, err, "and changes what she owns")
	_, err = vera.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: created.Data.SiteId})
	require.NoError(t, err, "a viewer reads")
	_, err = vera.SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "acme", SiteId: created.Data.SiteId, Region: client.NewOptString("eu-west")})
	requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "a viewer does not change")
	_, err = vera.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
	requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "another tenant")
}

// Delegated agent sessions and CONFIRMATION_REQUIRED with both external
// adapters: people sign in with access tokens, agents with the agent keys
// their delegation issued (a token is never a delegation), SpiceDB
// decides what the identity may do and the delegation then holds its
// listed actions for confirmation.
func TestAgentSessionsWithOIDCAndSpiceDB(t *testing.T) {
	t.Parallel()
	b := externalBackend(oidctest.Start(t), spicedbtest.Start(t))
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, b.yaml)), b.env())
	held := env.Key(t, "acme", "ann@acme", owner, testenv.KeyAgent("deploy-bot", "compute:sites:manage"))
	weak := env.Key(t, "acme", "vic@acme", viewer, testenv.KeyAgent("deploy-bot", "compute:sites:manage"))
	b.awaitRole(t, "acme", "ann@acme", owner)
	b.awaitRole(t, "acme", "vic@acme", viewer)
	ann := env.Client(t, computeclient.WithToken(b.oidc.Token(t, "ann@acme", "acme")))
	agent := env.Client(t, computeclient.WithToken(held))

	who := whoami(t, ann)
	assert.Equal(t, oidc.SessionKindJWT, who.SessionKind.Value)
	assert.False(t, who.AgentId.Set, "a token is never a delegated session")
	created, err := ann.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "by-ann"})
	require.NoError(t, err, "the owner herself, by token")

	who = whoami(t, agent)
	assert.Equal(t, "ann@acme", who.IdentityId.Value)
	assert.Equal(t, "deploy-bot", who.AgentId.Value)
	assert.NotEmpty(t, who.DelegationId.Value)
	_, err = agent.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: created.Data.SiteId})
	require.NoError(t, err, "an action off the delegation's list is done")

	before := countRows(t, env.Store)
	_, err = agent.SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "acme", SiteId: created.Data.SiteId, Region: client.NewOptString("eu-central")})
	e := requireCode(t, err, "CONFIRMATION_REQUIRED", http.StatusForbidden, "a held action SpiceDB allows the identity")
	require.NotNil(t, e.Details)
	id, _ := e.Details["confirmationId"].(string)
	assert.Regexp(t, `^cfm_[0-9a-hjkmnp-tv-z]{16}$`, id)
	assert.Equal(t, "compute:sites:manage", e.Details["action"])
	assert.Equal(t, map[string]any{"type": "compute-site", "id": created.Data.SiteId}, e.Details["resource"])
	var action string
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), "SELECT action FROM iam.confirmations WHERE id = $1", id).Scan(&action))
	assert.Equal(t, "compute:sites:manage", action, "the confirmation is recorded")
	after := countRows(t, env.Store)
	for table, n := range before {
		if table != "iam.confirmations" {
			assert.Equal(t, n, after[table], "%s: the held call changed nothing", table)
		}
	}
	got, err := ann.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: created.Data.SiteId})
	require.NoError(t, err)
	assert.Equal(t, "eu-west", got.Data.Region, "not changed")

	_, err = env.Client(t, computeclient.WithToken(weak)).SitesUpdate(t.Context(), &client.SitesUpdateInput{TenantId: "acme", SiteId: created.Data.SiteId, Region: client.NewOptString("eu-central")})
	requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "an identity SpiceDB refuses is refused, never asked to confirm")
	_, err = agent.SitesList(t.Context(), &client.SitesListInput{TenantId: "globex"})
	requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "another tenant")
}
