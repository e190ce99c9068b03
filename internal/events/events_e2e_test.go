package events_test

// events.list through the generated client over HTTP against the real host
// and PostgreSQL: visibility order, paging, patterns, cursors bound to the
// method and tenant, tenant isolation.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/cursor"
	"computeplane/internal/dbtest"
	"computeplane/internal/events"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
)

type fixture struct {
	env                          *testenv.Env
	root, acme, acmeViewer, glbx *computeclient.Client
	anonymous                    *computeclient.Client
	tokens                       map[string]string
}

func setup(t *testing.T, opts ...testenv.Option) *fixture {
	t.Helper()
	env := testenv.Start(t, opts...)
	f := &fixture{env: env, tokens: map[string]string{}}
	c := func(name, tenant, identity, role string) *computeclient.Client {
		tok := env.Key(t, tenant, identity, role)
		f.tokens[name] = tok
		return env.Client(t, computeclient.WithToken(tok))
	}
	f.root = c("root", env.Config.RootTenantID, "ops", "admin")
	f.acme = c("acme", "acme", "olivia", "owner")
	f.acmeViewer = c("acmeViewer", "acme", "vic", "viewer")
	f.glbx = c("globex", "globex", "gus", "owner")
	f.anonymous = env.Client(t, computeclient.WithToken("unused"),
		computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Del("Authorization") }))
	return f
}

// publish commits one event per subject, each in its own transaction, and
// waits until readers can see them.
func publish(t *testing.T, st *store.Store, tenant, typ string, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		require.NoError(t, st.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.Write(ctx, tx, outbox.Event{Type: typ, Subject: s, TenantID: tenant, Data: map[string]string{"name": s}})
		}))
	}
	visible(t, st)
}

// visible waits until every outbox row of the test's database is readable:
// readers take rows of finished transactions older than the snapshot's
// xmin, which write transactions of parallel tests hold back for a moment.
func visible(t *testing.T, st *store.Store) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, st.Pool().QueryRow(t.Context(),
			"SELECT count(*) FROM outbox WHERE xid >= pg_snapshot_xmin(pg_current_snapshot())").Scan(&n))
		return n == 0
	}, 10*time.Second, 5*time.Millisecond)
}

func list(t *testing.T, c *computeclient.Client, in client.EventsListInput) (client.EventPage, error) {
	t.Helper()
	res, err := c.EventsList(t.Context(), &in)
	if err != nil {
		return client.EventPage{}, err
	}
	return res.Data, nil
}

func subjectsOf(p client.EventPage) []string {
	out := []string{}
	for _, e := range p.Items {
		out = append(out, e.Subject)
	}
	return out
}

// all pages through the tenant's events with limit and returns them.
func all(t *testing.T, c *computeclient.Client, tenant string, limit int64, types ...string) ([]string, string) {
	t.Helper()
	var got []string
	in := client.EventsListInput{TenantId: tenant, Limit: client.NewOptInt64(limit), Types: types}
	for range 100 {
		page, err := list(t, c, in)
		require.NoError(t, err)
		got = append(got, subjectsOf(page)...)
		cur, ok := page.Cursor.Get()
		require.True(t, ok, "a cursor once anything was read")
		in.Cursor = client.NewOptString(cur)
		if int64(len(page.Items)) < limit {
			return got, cur
		}
	}
	t.Fatal("no end of paging")
	return nil, ""
}

func TestListInVisibilityOrderWithPaging(t *testing.T) {
	t.Parallel()
	f := setup(t)
	st := f.env.Store

	empty, err := list(t, f.acme, client.EventsListInput{TenantId: "acme"})
	require.NoError(t, err)
	assert.Empty(t, empty.Items)
	assert.True(t, empty.Cursor.IsNull(), "no cursor before the first event")

	publish(t, st, "acme", api.EventSiteCreated, "s1", "s2")
	publish(t, st, "globex", api.EventSiteCreated, "g1")
	publish(t, st, "acme", api.EventSecuritySecretPut, "s3")
	publish(t, st, "acme", api.EventSiteUpdated, "s4", "s5")
	publish(t, st, "globex", api.EventSiteDeleted, "g2")
	publish(t, st, "acme", api.EventSiteDeleted, "s6", "s7")

	got, cur := all(t, f.acme, "acme", 3)
	assert.Equal(t, []string{"s1", "s2", "s3", "s4", "s5", "s6", "s7"}, got)

	// Caught up: the cursor stays; what commits later follows it.
	page, err := list(t, f.acme, client.EventsListInput{TenantId: "acme", Cursor: client.NewOptString(cur)})
	require.NoError(t, err)
	assert.Empty(t, page.Items)
	again, _ := page.Cursor.Get()
	assert.Equal(t, cur, again)
	publish(t, st, "acme", api.EventSiteCreated, "s8")
	page, err = list(t, f.acme, client.EventsListInput{TenantId: "acme", Cursor: client.NewOptString(cur)})
	require.NoError(t, err)
	assert.Equal(t, []string{"s8"}, subjectsOf(page))

	// The default page is 100; items are CloudEvents with the tenant.
	page, err = list(t, f.acmeViewer, client.EventsListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, page.Items, 8)
	e := page.Items[2]
	assert.Equal(t, "1.0", e.Specversion)
	assert.Equal(t, "security.secret.put", e.Type)
	assert.Equal(t, "computeplane/secrets", e.Source)
	assert.Equal(t, "s3", e.Subject)
	assert.Equal(t, "acme", e.Tenantid)
	assert.Equal(t, "application/json", e.Datacontenttype)
	assert.JSONEq(t, `{"name":"s3"}`, string(e.Data))
	assert.Regexp(t, `^evt_`, e.ID)
	assert.WithinDuration(t, time.Now(), e.Time, time.Minute)
}

// A transaction that commits late is listed where it became visible, and
// nothing after it is listed before it commits: a reader's cursor never
// skips it.
func TestListNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	st := f.env.Store
	ctx := t.Context()
	slow, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(context.WithoutCancel(ctx)) }()
	require.NoError(t, outbox.Write(ctx, slow, outbox.Event{Type: api.EventSiteCreated, Subject: "late", TenantID: "acme", Data: map[string]string{}}))
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Event{Type: api.EventSiteCreated, Subject: "early", TenantID: "acme", Data: map[string]string{}})
	}))
	page, err := list(t, f.acme, client.EventsListInput{TenantId: "acme"})
	require.NoError(t, err)
	assert.Empty(t, page.Items)
	require.NoError(t, slow.Commit(ctx))
	visible(t, st)
	got, _ := all(t, f.acme, "acme", 1)
	assert.Equal(t, []string{"late", "early"}, got)
}

func TestListFiltersByTypePatterns(t *testing.T) {
	t.Parallel()
	f := setup(t)
	st := f.env.Store
	publish(t, st, "acme", api.EventSiteCreated, "c1")
	publish(t, st, "acme", api.EventSecuritySecretPut, "p1")
	publish(t, st, "acme", api.EventSiteDeleted, "d1")
	publish(t, st, "acme", api.EventSecuritySecretDeleted, "x1")
	publish(t, st, "acme", api.EventSiteUpdated, "u1")

	for name, tt := range map[string]struct {
		types []string
		want  []string
	}{
		"family":            {[]string{"site.*"}, []string{"c1", "d1", "u1"}},
		"deeper family":     {[]string{"security.secret.*"}, []string{"p1", "x1"}},
		"exact":             {[]string{"security.secret.put"}, []string{"p1"}},
		"exact and family":  {[]string{"site.deleted", "security.*"}, []string{"p1", "d1", "x1"}},
		"everything":        {[]string{"*"}, []string{"c1", "p1", "d1", "x1", "u1"}},
		"star among others": {[]string{"site.created", "*"}, []string{"c1", "p1", "d1", "x1", "u1"}},
		"no match yet":      {[]string{"sandbox.volume.created"}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Pages of one: the cursor steps over rows the filter leaves out.
			got, _ := all(t, f.acme, "acme", 1, tt.types...)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPatternsMustMatchTheCatalog(t *testing.T) {
	t.Parallel()
	f := setup(t)
	many := make([]string, 21)
	for i := range many {
		many[i] = "site.created"
	}
	for name, tt := range map[string]struct {
		types []string
		msg   string
	}{
		"unknown family": {[]string{"nope.*"}, `types[0]: pattern "nope.*" matches no type of the event catalog`},
		"unknown type":   {[]string{"site.created", "site.nope"}, `types[1]: pattern "site.nope"`},
		"partial name":   {[]string{"site"}, `types[0]: pattern "site"`},
		"malformed":      {[]string{"Site.created"}, "types[0]"},
		"inner star":     {[]string{"site.*.x"}, "types[0]"},
		"empty list":     {[]string{}, "types"},
		"too many":       {many, "types"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := list(t, f.acme, client.EventsListInput{TenantId: "acme", Types: tt.types})
			e := testenv.APIError(t, err)
			assert.Equal(t, "INVALID_INPUT", e.Code)
			assert.Equal(t, http.StatusBadRequest, e.Status)
			assert.Contains(t, e.Message, tt.msg)
		})
	}
	for _, limit := range []int64{0, 501} {
		_, err := list(t, f.acme, client.EventsListInput{TenantId: "acme", Limit: client.NewOptInt64(limit)})
		assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "limit %d", limit)
	}
}

func TestCursorIsBoundToMethodAndTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	publish(t, f.env.Store, "acme", api.EventSiteCreated, "a1", "a2")
	publish(t, f.env.Store, "globex", api.EventSiteCreated, "g1")
	page, err := list(t, f.root, client.EventsListInput{TenantId: "acme", Limit: client.NewOptInt64(1)})
	require.NoError(t, err)
	acmeCursor, _ := page.Cursor.Get()

	// The root tenant may read both tenants, but acme's cursor opens only for acme.
	page, err = list(t, f.root, client.EventsListInput{TenantId: "acme", Cursor: client.NewOptString(acmeCursor)})
	require.NoError(t, err)
	assert.Equal(t, []string{"a2"}, subjectsOf(page))
	_, err = list(t, f.root, client.EventsListInput{TenantId: "globex", Cursor: client.NewOptString(acmeCursor)})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Message, "cursor")

	sealer := cursor.New(testenv.TestSecret)
	for name, c := range map[string]string{
		"another method's cursor": sealer.Seal(api.MethodSitesList, "acme", []byte("0.0")),
		"not a position":          sealer.Seal(api.MethodEventsList, "acme", []byte("site_x")),
		"tampered":                acmeCursor[:len(acmeCursor)-2] + "AA",
		"not base64":              "not.a.cursor",
	} {
		_, err := list(t, f.acme, client.EventsListInput{TenantId: "acme", Cursor: client.NewOptString(c)})
		assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, name)
	}
	// A position sealed with the service secret for events.list and acme is a
	// cursor: what /watch sends as ids continues here too.
	start := sealer.Seal(api.MethodEventsList, "acme", []byte("0.0"))
	page, err = list(t, f.acme, client.EventsListInput{TenantId: "acme", Cursor: client.NewOptString(start)})
	require.NoError(t, err)
	assert.Equal(t, []string{"a1", "a2"}, subjectsOf(page))
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	publish(t, f.env.Store, "acme", api.EventSiteCreated, "a1")
	publish(t, f.env.Store, "globex", api.EventSiteCreated, "g1")

	page, err := list(t, f.glbx, client.EventsListInput{TenantId: "globex"})
	require.NoError(t, err)
	assert.Equal(t, []string{"g1"}, subjectsOf(page))

	// Another tenant's stream is refused before anything is read.
	_, err = list(t, f.glbx, client.EventsListInput{TenantId: "acme"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "ACCESS_DENIED", e.Code)
	assert.Equal(t, http.StatusForbidden, e.Status)

	// The root tenant's operators read any tenant; a viewer reads its own.
	page, err = list(t, f.root, client.EventsListInput{TenantId: "acme"})
	require.NoError(t, err)
	assert.Equal(t, []string{"a1"}, subjectsOf(page))
	_, err = list(t, f.acmeViewer, client.EventsListInput{TenantId: "acme"})
	require.NoError(t, err)

	_, err = list(t, f.anonymous, client.EventsListInput{TenantId: "acme"})
	e = testenv.APIError(t, err)
	assert.Equal(t, "UNAUTHENTICATED", e.Code)
	assert.Equal(t, http.StatusUnauthorized, e.Status)
}

// A real mutation's event is listed: sites.create publishes site.created
// in its own transaction.
func TestMutationEventsAreListed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, err := f.acme.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k1",
	})
	require.NoError(t, err)
	visible(t, f.env.Store)
	page, err := list(t, f.acme, client.EventsListInput{TenantId: "acme", Types: []string{"site.created"}})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	e := page.Items[0]
	assert.Equal(t, res.Data.SiteId, e.Subject)
	assert.Equal(t, "computeplane/sites", e.Source)
	var data map[string]any
	require.NoError(t, json.Unmarshal(e.Data, &data))
	assert.Equal(t, res.Data.SiteId, data["siteId"])
	assert.Equal(t, fmt.Sprint(res.Data.Version), fmt.Sprint(data["version"]))
}

// One read looks at about MaxScan rows: a filter that matches rarely gets a
// short page whose position moved on, and the next read goes on from there.
func TestReadBoundsTheScan(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	_, err := st.Pool().Exec(t.Context(), `INSERT INTO outbox (id, type, source, subject, tenant_id, data)
		SELECT 'evt_bulk' || i, 'site.updated', 'computeplane/sites', 's' || i, 'acme', '{}'::jsonb
		FROM generate_series(1, $1) AS i`, events.MaxScan+200)
	require.NoError(t, err)
	publish(t, st, "acme", api.EventSiteCreated, "needle")
	m, err := events.ParsePatterns([]string{"site.created"})
	require.NoError(t, err)

	rows, next, more, err := events.Read(t.Context(), st.Queries(), "acme", outbox.Position{}, m, 10)
	require.NoError(t, err)
	assert.Empty(t, rows)
	assert.True(t, more, "stopped before catching up")
	assert.Greater(t, next.Seq, int64(events.MaxScan-1))
	rows, _, more, err = events.Read(t.Context(), st.Queries(), "acme", next, m, 10)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, "needle", rows[0].Event.Subject)
	assert.False(t, more)

	// Without a filter a full page stops at limit.
	rows, _, more, err = events.Read(t.Context(), st.Queries(), "acme", outbox.Position{}, events.Matcher{}, 10)
	require.NoError(t, err)
	assert.Len(t, rows, 10)
	assert.True(t, more)
}
