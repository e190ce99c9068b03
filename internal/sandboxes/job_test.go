package sandboxes_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/sandboxes"
	"computeplane/internal/store"
)

// TestAPassWithNothingToDoIsOneRoundTrip: the reconciler passes every
// second beside the claims; with no sandbox expired and every warm pool
// as its template asks (here a template keeping none, as a cold one
// does), a pass is one statement, no fenced transaction. A template short
// of its warm.min is still reconciled in the same pass.
func TestAPassWithNothingToDoIsOneRoundTrip(t *testing.T) {
	st := dbtest.NewStore(t)
	exec := func(sql string) {
		t.Helper()
		_, err := st.Pool().Exec(t.Context(), sql)
		require.NoError(t, err)
	}
	exec(`insert into sites (site_id, tenant_id, kind, region, created_by, idem_request)
		values ('site_0000000000000000000000000a', 'acme', 'custom', 'eu-west', 'ops', '{}')`)
	exec(`insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		values ('pool_0000000000000000000000000a', 'acme', 'site_0000000000000000000000000a', 'p', 'vps-host', 'hosted', 'qemu', 'node-daemon', 'ops', '{}')`)
	template := func(id string, warm int) {
		t.Helper()
		_, err := st.Pool().Exec(t.Context(), `insert into sandbox_templates (template_id, tenant_id, name, pool_id, flavor, image_id, runtime,
			default_ttl_seconds, max_ttl_seconds, warm_min, warm_max, network, owner)
			values ($1, 'acme', $1, 'pool_0000000000000000000000000a', 'missing', 'computeplane/minimal', 'vm', 60, 60, $2, $2, 'none', 'ops')`, id, warm)
		require.NoError(t, err)
	}
	template("sbxt_cold", 0)

	var logs bytes.Buffer
	j := &sandboxes.Job{Service: &sandboxes.Service{}, Store: st, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	var fenced atomic.Int64
	fence := func(ctx context.Context, tx pgx.Tx) error {
		fenced.Add(1)
		_, err := tx.Exec(ctx, "select 1") // FenceLease's place
		return err
	}
	var trips atomic.Int64
	ctx := store.CountRoundTrips(t.Context(), &trips)
	require.NoError(t, j.Pass(ctx, fence))
	assert.EqualValues(t, 1, trips.Load(), "round trips of a pass with nothing to do")
	assert.Zero(t, fenced.Load(), "fenced transactions of a pass with nothing to do")

	// A template short of its warm pool: the pass reconciles it (its
	// flavor does not exist here, so the refill fails and is logged, as
	// one without capacity would be).
	template("sbxt_warm", 1)
	trips.Store(0)
	require.NoError(t, j.Pass(ctx, fence))
	assert.Positive(t, fenced.Load(), "the pass opened the template's transaction")
	assert.Contains(t, logs.String(), "warm pool not refilled")
	assert.Contains(t, logs.String(), "sbxt_warm")
}
