package join_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/dbtest"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/join"
	"computeplane/internal/pki"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
)

type world struct {
	st     *store.Store
	bundle *pki.Bundle
}

func setup(t *testing.T) *world {
	t.Helper()
	st := dbtest.NewStore(t)
	_, err := st.Pool().Exec(t.Context(), `insert into sites (site_id, tenant_id, kind, region, created_by, idem_request)
		values ('site_0000000000000000000000000a', 'acme', 'custom', 'eu-west', 'ops', '{}')`)
	require.NoError(t, err)
	_, err = st.Pool().Exec(t.Context(), `insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		values ('pool_0000000000000000000000000a', 'acme', 'site_0000000000000000000000000a', 'p', 'vps-host', 'hosted', 'qemu', 'node-daemon', 'ops', '{}')`)
	require.NoError(t, err)
	b, err := pki.Generate("example.org")
	require.NoError(t, err)
	return &world{st: st, bundle: b}
}

func (w *world) mint(t *testing.T, ttl time.Duration) string {
	t.Helper()
	var token string
	require.NoError(t, w.st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		token, _, err = join.Mint(ctx, tx, w.bundle, "acme", "pool_0000000000000000000000000a", "site_0000000000000000000000000a", "ops", ttl, time.Now())
		return err
	}))
	return token
}

func (w *world) redeem(t *testing.T, b *pki.Bundle, token string, key *ecdsa.PrivateKey) (*join.Grant, error) {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "host-1"}}, key)
	require.NoError(t, err)
	csr, err := x509.ParseCertificateRequest(der)
	require.NoError(t, err)
	var g *join.Grant
	err = w.st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		g, err = join.Redeem(ctx, tx, b, embedded.New(w.st, "root", "compute-", time.Now).Projection(), "compute-", token, csr, time.Now())
		return err
	})
	return g, err
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

func TestJoinOnceBoundToTheKey(t *testing.T) {
	t.Parallel()
	w := setup(t)
	token := w.mint(t, 0)
	require.True(t, strings.HasPrefix(token, join.TokenPrefix))
	var stored int
	require.NoError(t, w.st.Pool().QueryRow(t.Context(), `select count(*) from join_tokens where token_id = $1 or bound_key = $1`, token).Scan(&stored))
	assert.Zero(t, stored, "the token itself is never stored")

	key := newKey(t)
	g, err := w.redeem(t, w.bundle, token, key)
	require.NoError(t, err)
	assert.Regexp(t, `^node_`, g.NodeID)
	id, err := w.bundle.VerifyNode(g.Cert, time.Now())
	require.NoError(t, err)
	assert.Equal(t, g.NodeID, id)
	var state, owner string
	require.NoError(t, w.st.Pool().QueryRow(t.Context(), `select n.state, r.tenant_id from nodes n join iam.resources r on r.id = n.node_id where n.node_id = $1`, g.NodeID).Scan(&state, &owner))
	assert.Equal(t, "joining", state)
	assert.Equal(t, "acme", owner)

	// A retry with the same key: the same node.
	again, err := w.redeem(t, w.bundle, token, key)
	require.NoError(t, err)
	assert.Equal(t, g.NodeID, again.NodeID)
	// Another key: refused, no second node.
	_, err = w.redeem(t, w.bundle, token, newKey(t))
	assert.ErrorIs(t, err, join.ErrReused)
	var nodes int
	require.NoError(t, w.st.Pool().QueryRow(t.Context(), `select count(*) from nodes`).Scan(&nodes))
	assert.Equal(t, 1, nodes)
}

func TestRefusedTokens(t *testing.T) {
	t.Parallel()
	w := setup(t)
	expired := w.mint(t, time.Nanosecond)
	time.Sleep(1100 * time.Millisecond)
	_, err := w.redeem(t, w.bundle, expired, newKey(t))
	assert.ErrorIs(t, err, join.ErrExpired)

	token := w.mint(t, 0)
	other, err := pki.Generate("example.org")
	require.NoError(t, err)
	_, err = w.redeem(t, other, token, newKey(t))
	assert.ErrorIs(t, err, join.ErrInvalid, "another deployment's join key")
	tampered := token[:len(token)-2] + map[bool]string{true: "AA", false: "BB"}[!strings.HasSuffix(token, "AA")]
	_, err = w.redeem(t, w.bundle, tampered, newKey(t))
	assert.ErrorIs(t, err, join.ErrInvalid, "a changed token")
	_, err = w.redeem(t, w.bundle, "cjt_nope", newKey(t))
	assert.ErrorIs(t, err, join.ErrInvalid)

	require.NoError(t, w.st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		n, err := join.RevokeSite(ctx, tx, "site_0000000000000000000000000a")
		assert.Equal(t, int64(2), n)
		return err
	}))
	_, err = w.redeem(t, w.bundle, token, newKey(t))
	assert.ErrorIs(t, err, join.ErrRevoked, "sites.delete revokes its tokens")
}

// sites.delete revokes the site's join tokens, through the HTTP API.
func TestSiteDeletionRevokesTokens(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")))
	site, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "p", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	w := &world{st: env.Store}
	w.bundle, err = pki.Generate("example.org")
	require.NoError(t, err)
	var token string
	require.NoError(t, env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
		token, _, err = join.Mint(ctx, tx, w.bundle, "acme", pool.Data.PoolId, site.Data.SiteId, "ann", 0, time.Now())
		return err
	}))
	_, err = c.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: "acme", PoolId: pool.Data.PoolId})
	require.NoError(t, err)
	del, err := c.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: "acme", SiteId: site.Data.SiteId})
	require.NoError(t, err)
	assert.True(t, del.Data.Tombstoned)
	_, err = w.redeem(t, w.bundle, token, newKey(t))
	assert.ErrorIs(t, err, join.ErrRevoked)
}

// pools.joinToken mints through the HTTP API; the token joins once.
func TestJoinTokenMethod(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pki.json")
	bundle, _, err := pki.Init(path, testenv.TestSecret, "example.org")
	require.NoError(t, err)
	env := testenv.Start(t, testenv.WithEnv("SERVICE_PKI", path))
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")))
	site, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "p", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	res, err := c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: pool.Data.PoolId, TtlSeconds: client.NewOptInt64(600)})
	require.NoError(t, err)
	tok := res.Data
	assert.True(t, strings.HasPrefix(tok.Token, join.TokenPrefix))
	assert.WithinDuration(t, time.Now().Add(10*time.Minute), tok.ExpiresAt, time.Minute)

	w := &world{st: env.Store, bundle: bundle}
	g, err := w.redeem(t, bundle, tok.Token, newKey(t))
	require.NoError(t, err)
	assert.Equal(t, pool.Data.PoolId, g.PoolID)
	_, err = w.redeem(t, bundle, tok.Token, newKey(t))
	assert.ErrorIs(t, err, join.ErrReused)
	var audited int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), `select count(*) from audit_log where method = 'pools.joinToken'`).Scan(&audited))
	assert.Equal(t, 1, audited)

	globex := env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner")))
	_, err = globex.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "globex", PoolId: pool.Data.PoolId})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)
	_, err = c.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: "acme", PoolId: pool.Data.PoolId})
	require.NoError(t, err)
	_, err = c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: pool.Data.PoolId})
	assert.Equal(t, "INVALID_STATE", testenv.APIError(t, err).Code)

	// Without a PKI bundle: INVALID_CONFIG.
	bare := testenv.Start(t, testenv.WithEnv("SERVICE_PKI", filepath.Join(t.TempDir(), "none.json")))
	bc := bare.Client(t, computeclient.WithToken(bare.Key(t, "acme", "ann", "owner")))
	s2, err := bc.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "s"})
	require.NoError(t, err)
	p2, err := bc.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: s2.Data.SiteId, Name: "p", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	_, err = bc.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: p2.Data.PoolId})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_CONFIG", e.Code)
	assert.Contains(t, e.Message, "computed pki init")
	var tokens int
	require.NoError(t, bare.Store.Pool().QueryRow(t.Context(), `select count(*) from join_tokens`).Scan(&tokens))
	assert.Zero(t, tokens, "a refused mint leaves no row")
}
