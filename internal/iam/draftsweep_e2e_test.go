package iam_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/testenv"
)

// A draft a killed process left behind (older than embedded.DraftTTL) is
// swept by the iam role's singleton job; a fresh draft, which a live call
// may still hold, and real resources stay.
func TestStaleDraftsAreSweptByTheIAMJob(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_ROLES", "api,iam"))
	ctx := t.Context()
	pool := env.Store.Pool()
	insert := func(id string, draft bool, age time.Duration) {
		_, err := pool.Exec(ctx, `INSERT INTO iam.resources (type, id, tenant_id, owner_id, draft, created_at, updated_at)
			VALUES ('compute-site', $1, 'acme', 'ann', $2, now() - $3::interval, now() - $3::interval)`, id, draft, age.String())
		require.NoError(t, err)
	}
	insert("site-stale-draft", true, embedded.DraftTTL+time.Minute)
	insert("site-old-real", false, time.Hour)
	// A fresh draft, written as the gate writes them.
	_, err := env.Identity().Projection().PutDraft(ctx, iam.Resource{Type: "compute-site", ID: "site-fresh-draft", TenantID: "acme", Owner: "ann", Draft: true})
	require.NoError(t, err)
	exists := func(id string) bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM iam.resources WHERE id = $1", id).Scan(&n))
		return n == 1
	}
	require.True(t, exists("site-stale-draft"))

	runner := env.Host.Workers()
	require.NotNil(t, runner, "the iam role runs workers")
	require.NoError(t, runner.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = runner.Stop(sctx)
	})
	require.Eventually(t, func() bool { return !exists("site-stale-draft") }, 15*time.Second, 100*time.Millisecond,
		"the stale draft is swept")
	assert.True(t, exists("site-fresh-draft"), "a fresh draft stays")
	assert.True(t, exists("site-old-real"), "real resources are never swept")
	var held bool
	for _, l := range runner.Held() {
		held = held || l.Name == "job/"+embedded.DraftSweepJob
	}
	assert.True(t, held, "run under the singleton lease job/%s", embedded.DraftSweepJob)
}
