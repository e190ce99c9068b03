package usage_test

// usage.list and usage.export through the generated client over HTTP.

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
	"computeplane/internal/usage"
)

type usageWorld struct {
	env     *testenv.Env
	viewer  *computeclient.Client
	project string
	start   time.Time // the first window's start
}

// setupUsage writes 6 hourly windows of node.hours (one allocation, 6
// hours) and 2 of vps.volume.gib.hours in a project, for tenant acme.
func setupUsage(t *testing.T) *usageWorld {
	t.Helper()
	env := testenv.Start(t)
	w := &usageWorld{env: env, viewer: env.Client(t, computeclient.WithToken(env.Key(t, "acme", "vic", "viewer")))}
	owner := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "olga", "owner")))
	p, err := owner.ProjectsCreate(t.Context(), &client.ProjectsCreateInput{TenantId: "acme", Name: "web", IdempotencyKey: "p"})
	require.NoError(t, err)
	w.project = p.Data.ProjectId
	w.start = time.Now().UTC().Truncate(time.Hour).Add(-8 * time.Hour)
	require.NoError(t, env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		node, err := usage.Open(ctx, tx, usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, PerHour: usage.Micro,
			Owner: usage.Owner{Type: "node", ID: "n1"}, At: w.start})
		if err != nil {
			return err
		}
		if err := usage.Close(ctx, tx, node, w.start.Add(6*time.Hour)); err != nil {
			return err
		}
		vol, err := usage.Open(ctx, tx, usage.Allocation{TenantID: "acme", ProjectID: w.project, Meter: api.MeterVpsVolumeGibHours,
			PerHour: 10 * usage.Micro, Owner: usage.Owner{Type: "volume", ID: "v1"}, At: w.start.Add(30 * time.Minute)})
		if err != nil {
			return err
		}
		if err := usage.Close(ctx, tx, vol, w.start.Add(2*time.Hour)); err != nil {
			return err
		}
		_, err = usage.Rollup(ctx, tx, "acme", time.Now())
		return err
	}))
	return w
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func TestUsageList(t *testing.T) {
	t.Parallel()
	w := setupUsage(t)
	c := w.viewer
	all, err := c.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, all.Data.Items, 8)
	assert.True(t, all.Data.Cursor.Null, "one page")
	for i := 1; i < len(all.Data.Items); i++ {
		assert.LessOrEqual(t, all.Data.Items[i-1].WindowStart, all.Data.Items[i].WindowStart, "by window start")
	}
	first := all.Data.Items[0]
	assert.True(t, strings.HasPrefix(first.IdempotencyKey, "cmp:alloc_"), first.IdempotencyKey)
	assert.True(t, first.RecordedAt.Null && first.Outcome.Null, "not handed over yet")

	// Range: windows that end after from and start before to.
	r, err := c.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", Meter: client.NewOptString(api.MeterNodeHours),
		From: client.NewOptInt64(ms(w.start.Add(time.Hour))), To: client.NewOptInt64(ms(w.start.Add(3*time.Hour + time.Minute)))})
	require.NoError(t, err)
	require.Len(t, r.Data.Items, 3, "hours 1, 2 and 3 (which starts before to)")
	r, err = c.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", Meter: client.NewOptString(api.MeterNodeHours),
		From: client.NewOptInt64(ms(w.start.Add(time.Hour))), To: client.NewOptInt64(ms(w.start.Add(3 * time.Hour)))})
	require.NoError(t, err)
	assert.Len(t, r.Data.Items, 2, "a window starting at to is out")
	_, err = c.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", From: client.NewOptInt64(5), To: client.NewOptInt64(5)})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "to not after from")

	// Pages with a cursor.
	var keys []string
	var cursor string
	for page := 0; ; page++ {
		in := &client.UsageListInput{TenantId: "acme", Limit: client.NewOptInt64(3)}
		if cursor != "" {
			in.Cursor = client.NewOptString(cursor)
		}
		res, err := c.UsageList(t.Context(), in)
		require.NoError(t, err)
		require.LessOrEqual(t, len(res.Data.Items), 3)
		for _, it := range res.Data.Items {
			keys = append(keys, it.IdempotencyKey)
		}
		if res.Data.Cursor.Null {
			break
		}
		cursor = res.Data.Cursor.Value
		assert.Regexp(t, `^[A-Za-z0-9_-]{1,256}$`, cursor, "the cursor shape usage.list promises")
		require.Less(t, page, 5)
	}
	require.Len(t, keys, 8)
	for i, it := range all.Data.Items {
		assert.Equal(t, it.IdempotencyKey, keys[i])
	}
	// The last character changed (to another one: it may be an A).
	last := "A"
	if strings.HasSuffix(cursor, "A") {
		last = "B"
	}
	_, err = c.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", Cursor: client.NewOptString(cursor[:len(cursor)-1] + last)})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "a changed cursor")
}

// TestUsageOfAProject: a member of a project reads its usage without a
// role in the tenant; an identity of the tenant with neither is refused;
// tenant-wide reads need a tenant role.
func TestUsageOfAProject(t *testing.T) {
	t.Parallel()
	w := setupUsage(t)
	owner := w.env.Client(t, computeclient.WithToken(w.env.Key(t, "acme", "olga", "owner")))
	member := roleless(t, w.env, "bob")
	stranger := roleless(t, w.env, "eve")
	_, err := owner.ProjectsAddMember(t.Context(), &client.ProjectsAddMemberInput{TenantId: "acme", ProjectId: w.project, IdentityId: "bob"})
	require.NoError(t, err)

	res, err := member.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", ProjectId: client.NewOptString(w.project)})
	require.NoError(t, err)
	require.Len(t, res.Data.Items, 2, "the project's two volume windows")
	for _, it := range res.Data.Items {
		assert.Equal(t, w.project, it.Tags[usage.TagProject])
	}
	exp, err := member.UsageExport(t.Context(), &client.UsageExportInput{TenantId: "acme", ProjectId: client.NewOptString(w.project),
		From: ms(w.start), To: ms(w.start.Add(24 * time.Hour))})
	require.NoError(t, err)
	assert.Equal(t, int64(2), exp.Data.Windows)
	_, err = member.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme"})
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code, "the whole tenant's usage needs a tenant role")
	_, err = stranger.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", ProjectId: client.NewOptString(w.project)})
	assert.Equal(t, "ACCESS_DENIED", testenv.APIError(t, err).Code, "not a member")
}

func roleless(t *testing.T, env *testenv.Env, identity string) *computeclient.Client {
	t.Helper()
	token := env.Key(t, "acme", identity, "viewer")
	_, err := env.Store.Pool().Exec(t.Context(), `delete from iam.role_bindings where tenant_id = 'acme' and identity_id = $1`, identity)
	require.NoError(t, err)
	return env.Client(t, computeclient.WithToken(token))
}

func TestUsageExport(t *testing.T) {
	t.Parallel()
	w := setupUsage(t)
	c := w.viewer
	from, to := ms(w.start), ms(w.start.Add(24*time.Hour))
	res, err := c.UsageExport(t.Context(), &client.UsageExportInput{TenantId: "acme", From: from, To: to})
	require.NoError(t, err)
	e := res.Data
	assert.Equal(t, "csv", string(e.Format))
	assert.Equal(t, int64(8), e.Windows)
	assert.False(t, e.Truncated)
	records, err := csv.NewReader(strings.NewReader(e.Content)).ReadAll()
	require.NoError(t, err)
	require.Len(t, records, 9, "a header row and one row per window")
	assert.Equal(t, usage.CSVHeader, records[0])
	_, err = time.Parse(time.RFC3339, records[1][3])
	require.NoError(t, err, "ISO 8601 timestamps")
	assert.Equal(t, int64(6), e.Meters[api.MeterNodeHours].Windows)
	assert.InDelta(t, 6.0, e.Meters[api.MeterNodeHours].Quantity, 1e-9)
	assert.InDelta(t, 15.0, e.Meters[api.MeterVpsVolumeGibHours].Quantity, 1e-9, "10 GiB for 1.5 hours")

	res, err = c.UsageExport(t.Context(), &client.UsageExportInput{TenantId: "acme", From: from, To: to,
		Format: client.NewOptUsageExportInputFormat(client.UsageExportInputFormatJsonl)})
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(res.Data.Content, "\n"), "\n")
	require.Len(t, lines, 8)
	var one map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &one))
	assert.Contains(t, one, "idempotencyKey")

	for name, in := range map[string]client.UsageExportInput{
		"to not after from": {TenantId: "acme", From: to, To: to},
		"over 93 days":      {TenantId: "acme", From: 0, To: 94 * 24 * 3600 * 1000},
	} {
		_, err := c.UsageExport(t.Context(), &in)
		assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, name)
	}
	_, err = c.UsageExport(t.Context(), &client.UsageExportInput{TenantId: "acme", From: 0, To: 93 * 24 * 3600 * 1000})
	require.NoError(t, err, "93 days is allowed")
}

func TestUsageExportTruncates(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "vic", "viewer")))
	start := time.Now().UTC().Truncate(time.Hour).Add(-10 * 24 * time.Hour)
	insertWindows(t, env, start, usage.MaxExportWindows+1)
	res, err := c.UsageExport(t.Context(), &client.UsageExportInput{TenantId: "acme", From: ms(start), To: ms(start.Add(24 * time.Hour)),
		Format: client.NewOptUsageExportInputFormat(client.UsageExportInputFormatJsonl)})
	require.NoError(t, err)
	assert.True(t, res.Data.Truncated)
	assert.Equal(t, int64(usage.MaxExportWindows), res.Data.Windows)
	assert.Equal(t, usage.MaxExportWindows, strings.Count(res.Data.Content, "\n"))
}

// insertWindows writes n windows of one allocation of acme in the hour
// starting at start, straight into the table.
func insertWindows(t testing.TB, env *testenv.Env, start time.Time, n int) {
	t.Helper()
	_, err := env.Store.Pool().Exec(context.Background(), `
		insert into allocations (allocation_id, tenant_id, meter, quantity_micro, owner_type, owner_id, started_at, rolled_until, dirty)
		values ('alloc_bulk', 'acme', 'node.hours', 1000000, 'node', 'bulk', $1, $1, false)`, start)
	require.NoError(t, err)
	_, err = env.Store.Pool().Exec(context.Background(), `
		insert into usage_windows (key, allocation_id, tenant_id, meter, window_start, window_end, quantity_micro_ms, adjustment)
		select 'cmp:alloc_bulk:' || i, 'alloc_bulk', 'acme', 'node.hours', $1::timestamptz, $1::timestamptz + interval '1 hour', 3600000000000, i
		from generate_series(0, $2 - 1) i`, start, n)
	require.NoError(t, err)
}

func TestSelfCheckUsageFindings(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	root := env.Client(t, computeclient.WithToken(env.Key(t, env.Config.RootTenantID, "ops", "owner")))
	findings := func() []client.Finding {
		res, err := root.SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
		require.NoError(t, err)
		var out []client.Finding
		for _, f := range res.Data.Findings {
			if f.Check == "usage" {
				out = append(out, f)
			}
		}
		return out
	}
	require.Len(t, findings(), 1)
	// A window closed long ago and never handed over, and one billing
	// dead-lettered.
	insertWindows(t, env, time.Now().UTC().Truncate(time.Hour).Add(-5*time.Hour), 2)
	_, err := env.Store.Pool().Exec(t.Context(), `update usage_windows set outcome = 'dead-lettered', recorded_at = now() where adjustment = 0`)
	require.NoError(t, err)
	f := findings()
	require.Len(t, f, 3)
	assert.Contains(t, f[1].Message, "1 usage windows are dead-lettered")
	assert.Contains(t, f[2].Message, "1 closed usage windows not handed to billing")
}
