package iam_test

// Authentication of access tokens of a real OIDC provider
// (internal/iam/oidc/oidctest: tools/oidcprovider on zitadel/oidc's op).

import (
	"fmt"
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
	p := oidctest.Start(t)
	s := spicedbtest.Start(t)
	_, vars := s.Config()
	yaml := fmt.Sprintf("iam: {authentication: {oidc: {issuer: '%s', audience: '%s'}}, decisions: {spicedb: {endpoint: '%s', plaintext: true}}}\n",
		p.Issuer, oidctest.Audience, s.Endpoint)
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, yaml)), backend{vars: vars}.env())
	env.Key(t, "acme", "alice@acme", member)
	env.Key(t, "acme", "vera@acme", viewer)
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
