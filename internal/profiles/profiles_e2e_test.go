package profiles_test

// profiles through the client against a real PostgreSQL: every rule of
// the specification's profiles section and its Profile version table.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/go-faster/jx"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/profiles"
	"computeplane/internal/testenv"
	"computeplane/internal/workflows"
)

type world struct {
	env    *testenv.Env
	acme   *computeclient.Client // owner of acme
	viewer *computeclient.Client // viewer of acme
	globex *computeclient.Client // owner of globex
}

func setup(t *testing.T) *world {
	t.Helper()
	env := testenv.Start(t)
	return &world{env: env,
		acme:   env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner"))),
		viewer: env.Client(t, computeclient.WithToken(env.Key(t, "acme", "vic", "viewer"))),
		globex: env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner")))}
}

// doc is a profile document: steps are "name:phase:uses" (with from the
// action's required inputs filled).
func doc(id string, version int, steps ...string) map[string]any {
	m := map[string]any{"id": id, "version": version}
	var ss []any
	for _, s := range steps {
		parts := strings.SplitN(s, ":", 3)
		st := map[string]any{"name": parts[0], "phase": parts[1], "uses": parts[2]}
		switch parts[2] {
		case "media.insert":
			st["with"] = map[string]any{"slot": "usb", "image": "${image}"}
		case "boot.set":
			st["with"] = map[string]any{"device": "disk"}
		}
		ss = append(ss, st)
	}
	m["steps"] = ss
	return m
}

func createDoc(t *testing.T, m map[string]any) client.ProfilesCreateInputDocument {
	t.Helper()
	out := client.ProfilesCreateInputDocument{}
	for k, v := range m {
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		out[k] = jx.Raw(raw)
	}
	return out
}

func raw(t *testing.T, v any) jx.Raw {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func (w *world) create(t *testing.T, c *computeclient.Client, tenant string, m map[string]any, public bool) *client.Profile {
	t.Helper()
	in := &client.ProfilesCreateInput{TenantId: tenant, Document: createDoc(t, m)}
	if public {
		in.Visibility = client.NewOptProfilesCreateInputVisibility(client.ProfilesCreateInputVisibilityPublic)
	}
	p, err := c.ProfilesCreate(t.Context(), in)
	require.NoError(t, err)
	return &p.Data
}

func get(t *testing.T, c *computeclient.Client, tenant, id string, version int64) (*client.Profile, error) {
	in := &client.ProfilesGetInput{TenantId: tenant, ProfileId: id}
	if version > 0 {
		in.ProfileVersion = client.NewOptInt64(version)
	}
	p, err := c.ProfilesGet(t.Context(), in)
	if err != nil {
		return nil, err
	}
	return &p.Data, nil
}

func code(t *testing.T, err error) string { t.Helper(); return testenv.APIError(t, err).Code }

func issuePaths(t *testing.T, issues any) []string {
	t.Helper()
	list, ok := issues.([]any)
	require.True(t, ok, "details.issues is a list: %v", issues)
	var out []string
	for _, is := range list {
		out = append(out, is.(map[string]any)["path"].(string))
	}
	return out
}

func TestCreate(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()

	p := w.create(t, w.acme, "acme", doc("web", 1, "on:prepare:power.on"), false)
	assert.Equal(t, "acme", p.TenantId)
	assert.Equal(t, "web", p.ProfileId)
	assert.EqualValues(t, 1, p.ProfileVersion)
	assert.Equal(t, client.ProfileVisibilityPrivate, p.Visibility, "private by default")
	assert.EqualValues(t, 1, p.Version)
	assert.True(t, p.LockedAt.Null, "unused")
	assert.Contains(t, p.Document, "steps")

	t.Run("CONFLICT when that id and version exist", func(t *testing.T) {
		_, err := w.acme.ProfilesCreate(ctx, &client.ProfilesCreateInput{TenantId: "acme", Document: createDoc(t, doc("web", 1, "off:prepare:power.off"))})
		e := testenv.APIError(t, err)
		assert.Equal(t, "CONFLICT", e.Code)
		// Another version, and the same id and version in another tenant, are new.
		w.create(t, w.acme, "acme", doc("web", 2, "on:prepare:power.on"), false)
		w.create(t, w.globex, "globex", doc("web", 1, "on:prepare:power.on"), false)
	})

	t.Run("INVALID_INPUT with details.path naming the first offending field", func(t *testing.T) {
		for name, c := range map[string]struct {
			m    map[string]any
			path string
		}{
			"no id":                 {map[string]any{"version": 1, "steps": []any{}}, "document.id"},
			"an id not a ProfileId": {doc("Web_1", 1, "on:prepare:power.on"), "document.id"},
			"version 0":             {doc("web", 0, "on:prepare:power.on"), "document.version"},
			"version above 1000000": {doc("web", 1000001, "on:prepare:power.on"), "document.version"},
			"no steps":              {doc("web", 9), "document.steps"},
			"a phase not known":     {doc("web", 9, "on:prepare:power.on", "x:deploy:power.off"), "document.steps[1].phase"},
			"phases going back":     {doc("web", 9, "on:verify:power.on", "x:prepare:power.off"), "document.steps[1].phase"},
			"a step named twice":    {doc("web", 9, "on:prepare:power.on", "on:verify:power.off"), "document.steps[1].name"},
			"a field not known": {func() map[string]any {
				m := doc("web", 9, "on:prepare:power.on")
				m["drivers"] = "redfish"
				return m
			}(), "document.drivers"},
			"with on a step using a profile": {func() map[string]any {
				m := doc("web", 9, "base:prepare:profile:base@1")
				m["steps"].([]any)[0].(map[string]any)["with"] = map[string]any{"a": 1}
				return m
			}(), "document.steps[0].with"},
			"the first of two problems": {func() map[string]any {
				m := doc("web", 9, "on:prepare:power.on", "x:deploy:power.off")
				m["image"] = "!"
				return m
			}(), "document.image"},
		} {
			_, err := w.acme.ProfilesCreate(ctx, &client.ProfilesCreateInput{TenantId: "acme", Document: createDoc(t, c.m)})
			e := testenv.APIError(t, err, name)
			assert.Equal(t, "INVALID_INPUT", e.Code, name)
			assert.Equal(t, c.path, e.Details["path"], name)
			assert.True(t, strings.HasPrefix(e.Message, c.path+":"), "%s: %s", name, e.Message)
			assert.Equal(t, c.path, issuePaths(t, e.Details["issues"])[0], name)
		}
	})

	t.Run("a use that does not resolve and a rejected with are stored, and found by validate", func(t *testing.T) {
		m := doc("later", 1, "base:prepare:profile:not-yet@1", "x:prepare:media.insert")
		m["steps"].([]any)[1].(map[string]any)["with"] = map[string]any{"slot": "floppy"}
		w.create(t, w.acme, "acme", m, false)
	})

	t.Run("a viewer may not create", func(t *testing.T) {
		_, err := w.viewer.ProfilesCreate(ctx, &client.ProfilesCreateInput{TenantId: "acme", Document: createDoc(t, doc("v", 1, "on:prepare:power.on"))})
		assert.Equal(t, "ACCESS_DENIED", code(t, err))
	})
}

func TestGetLookupOrder(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()

	w.create(t, w.acme, "acme", doc("app", 1, "on:prepare:power.on"), false)
	w.create(t, w.acme, "acme", doc("app", 2, "on:prepare:power.on", "off:verify:power.off"), false)
	p, err := get(t, w.acme, "acme", "app", 0)
	require.NoError(t, err)
	assert.EqualValues(t, 2, p.ProfileVersion, "the latest when the version is omitted")
	p, err = get(t, w.viewer, "acme", "app", 1)
	require.NoError(t, err)
	assert.EqualValues(t, 1, p.ProfileVersion)

	// Private profiles of another tenant are absent; public ones are seen.
	_, err = get(t, w.globex, "globex", "app", 0)
	assert.Equal(t, "NOT_FOUND", code(t, err))
	w.create(t, w.globex, "globex", doc("shared", 1, "on:prepare:power.on"), true)
	w.create(t, w.globex, "globex", doc("shared", 2, "on:prepare:power.on"), false)
	p, err = get(t, w.acme, "acme", "shared", 0)
	require.NoError(t, err)
	assert.Equal(t, "globex", p.TenantId, "a public profile of another tenant")
	assert.EqualValues(t, 1, p.ProfileVersion, "the latest public version: version 2 is private")
	_, err = get(t, w.acme, "acme", "shared", 2)
	assert.Equal(t, "NOT_FOUND", code(t, err))

	// The tenant's own comes first.
	w.create(t, w.acme, "acme", doc("shared", 1, "off:prepare:power.off"), false)
	p, err = get(t, w.acme, "acme", "shared", 1)
	require.NoError(t, err)
	assert.Equal(t, "acme", p.TenantId)

	// Module-shipped profiles come last: tenant builtin, read-only.
	p, err = get(t, w.acme, "acme", "metal-host", 0)
	require.NoError(t, err)
	assert.Equal(t, profiles.BuiltinTenant, p.TenantId)
	assert.EqualValues(t, 1, p.ProfileVersion)
	assert.Equal(t, client.ProfileVisibilityPublic, p.Visibility)
	w.create(t, w.globex, "globex", doc("metal-host", 1, "on:prepare:power.on"), true)
	p, err = get(t, w.acme, "acme", "metal-host", 1)
	require.NoError(t, err)
	assert.Equal(t, "globex", p.TenantId, "a public stored one before a shipped one")
	w.create(t, w.acme, "acme", doc("metal-host", 1, "on:prepare:power.on"), false)
	p, err = get(t, w.acme, "acme", "metal-host", 1)
	require.NoError(t, err)
	assert.Equal(t, "acme", p.TenantId, "the tenant's own before all")

	_, err = get(t, w.acme, "acme", "nothing", 0)
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = get(t, w.acme, "acme", "app", 3)
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.acme.ProfilesGet(ctx, &client.ProfilesGetInput{TenantId: "acme", ProfileId: "app", ProfileVersion: client.NewOptInt64(1000001)})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = w.acme.ProfilesGet(ctx, &client.ProfilesGetInput{TenantId: "acme", ProfileId: "App!"})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
}

func TestValidateAndRender(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()

	base := doc("base", 1, "off:prepare:power.off", "cd:prepare:boot.set")
	w.create(t, w.acme, "acme", base, false)
	app := doc("app", 1, "media:prepare:media.insert", "base:prepare:profile:base@1", "inspect:verify:profile:metal-inspect@1", "join:verify:node.join")
	app["steps"].([]any)[0].(map[string]any)["timeoutSeconds"] = 45
	app["steps"].([]any)[0].(map[string]any)["retries"] = 3
	w.create(t, w.acme, "acme", app, false)

	v, err := w.viewer.ProfilesValidate(ctx, &client.ProfilesValidateInput{TenantId: "acme", ProfileId: "app"})
	require.NoError(t, err)
	assert.True(t, v.Data.Valid)
	assert.Empty(t, v.Data.Issues)

	r, err := w.viewer.ProfilesRender(ctx, &client.ProfilesRenderInput{TenantId: "acme", ProfileId: "app", ProfileVersion: client.NewOptInt64(1)})
	require.NoError(t, err)
	assert.Equal(t, "acme", r.Data.TenantId)
	assert.Equal(t, "app", r.Data.ProfileId)
	assert.Contains(t, r.Data.Document, "steps")
	var got []string
	for _, s := range r.Data.Steps {
		got = append(got, fmt.Sprintf("%s %s %s %d %d %s", s.Name, s.Phase, s.Uses, s.TimeoutMs, s.Retries, s.Profile))
	}
	assert.Equal(t, []string{
		"media prepare media.insert 45000 3 acme/app@1",
		"base/off prepare power.off 300000 0 acme/base@1",
		"base/cd prepare boot.set 300000 0 acme/base@1",
		"inspect/power-on prepare power.on 60000 2 builtin/metal-inspect@1",
		"inspect/inventory verify inventory 60000 2 builtin/metal-inspect@1",
		"inspect/console verify console.read 30000 1 builtin/metal-inspect@1",
		"join verify node.join 300000 0 acme/app@1",
	}, got)
	assert.JSONEq(t, `{"slot": "usb", "image": "${image}"}`, string(mustJSON(t, r.Data.Steps[0].With)))

	t.Run("shipped profiles render, composition included", func(t *testing.T) {
		r, err := w.acme.ProfilesRender(ctx, &client.ProfilesRenderInput{TenantId: "acme", ProfileId: "metal-reinstall"})
		require.NoError(t, err)
		assert.Equal(t, profiles.BuiltinTenant, r.Data.TenantId)
		assert.Len(t, r.Data.Steps, 3+14)
		assert.Equal(t, "install/join", r.Data.Steps[len(r.Data.Steps)-1].Name)
	})

	// A profile that does not resolve: every issue, by path.
	bad := doc("bad", 1, "x:prepare:media.insert", "y:prepare:power.jump", "z:prepare:profile:nowhere@1", "b:provision:profile:base@1")
	bad["steps"].([]any)[0].(map[string]any)["with"] = map[string]any{"slot": "floppy", "speed": 9}
	w.create(t, w.acme, "acme", bad, false)
	v, err = w.acme.ProfilesValidate(ctx, &client.ProfilesValidateInput{TenantId: "acme", ProfileId: "bad"})
	require.NoError(t, err, "problems of the profile are issues, not errors")
	assert.False(t, v.Data.Valid)
	var paths []string
	for _, is := range v.Data.Issues {
		paths = append(paths, is.Path.Value)
	}
	assert.Equal(t, []string{"steps[0].with.image", "steps[0].with.slot", "steps[0].with.speed", "steps[1].uses", "steps[2].uses"}, paths)

	_, err = w.acme.ProfilesRender(ctx, &client.ProfilesRenderInput{TenantId: "acme", ProfileId: "bad"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Equal(t, paths, issuePaths(t, e.Details["issues"]))

	// A cycle, and a problem inside an included profile, are issues of the
	// step that includes it.
	w.create(t, w.acme, "acme", doc("ping", 1, "on:prepare:power.on", "pong:verify:profile:pong@1"), false)
	w.create(t, w.acme, "acme", doc("pong", 1, "ping:prepare:profile:ping@1"), false)
	v, err = w.acme.ProfilesValidate(ctx, &client.ProfilesValidateInput{TenantId: "acme", ProfileId: "ping"})
	require.NoError(t, err)
	require.False(t, v.Data.Valid)
	require.Len(t, v.Data.Issues, 1)
	assert.Equal(t, "steps[1].uses", v.Data.Issues[0].Path.Value)
	assert.Contains(t, v.Data.Issues[0].Message, "cycle")
	w.create(t, w.acme, "acme", doc("outer", 1, "inner:prepare:profile:bad@1"), false)
	v, err = w.acme.ProfilesValidate(ctx, &client.ProfilesValidateInput{TenantId: "acme", ProfileId: "outer"})
	require.NoError(t, err)
	require.False(t, v.Data.Valid)
	for _, is := range v.Data.Issues {
		assert.Equal(t, "steps[0].uses", is.Path.Value)
		assert.Contains(t, is.Message, "profile bad@1: steps[")
	}

	// Unknown profiles are NOT_FOUND, for both.
	_, err = w.acme.ProfilesValidate(ctx, &client.ProfilesValidateInput{TenantId: "acme", ProfileId: "nope"})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.acme.ProfilesRender(ctx, &client.ProfilesRenderInput{TenantId: "acme", ProfileId: "app", ProfileVersion: client.NewOptInt64(7)})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.globex.ProfilesRender(ctx, &client.ProfilesRenderInput{TenantId: "globex", ProfileId: "app"})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's private profile")
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestListPagesByIDAndVersion(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()
	for _, id := range []string{"b", "a", "c.x"} {
		for v := 3; v >= 1; v-- {
			w.create(t, w.acme, "acme", doc(id, v, "on:prepare:power.on"), false)
		}
	}
	w.create(t, w.globex, "globex", doc("a", 2, "on:prepare:power.on"), true) // the same id and version, public
	w.create(t, w.globex, "globex", doc("hidden", 1, "on:prepare:power.on"), false)

	want := []string{"a@1/acme", "a@2/acme", "a@2/globex", "a@3/acme", "b@1/acme", "b@2/acme", "b@3/acme",
		"c.x@1/acme", "c.x@2/acme", "c.x@3/acme", "metal-host@1/builtin", "metal-inspect@1/builtin", "metal-reinstall@1/builtin"}
	var all []string
	for _, limit := range []int{1, 2, 5, 200} {
		all = nil
		var pages int
		in := &client.ProfilesListInput{TenantId: "acme", Limit: client.NewOptInt64(int64(limit))}
		for {
			res, err := w.viewer.ProfilesList(ctx, in)
			require.NoError(t, err)
			pages++
			assert.LessOrEqual(t, len(res.Data.Items), limit)
			for _, p := range res.Data.Items {
				all = append(all, fmt.Sprintf("%s@%d/%s", p.ProfileId, p.ProfileVersion, p.TenantId))
			}
			if res.Data.Cursor.Null {
				break
			}
			assert.LessOrEqual(t, len(res.Data.Cursor.Value), 256)
			in.Cursor = client.NewOptString(res.Data.Cursor.Value)
			require.Less(t, pages, 50)
		}
		assert.Equal(t, want, all, "limit %d", limit)
		assert.Equal(t, (len(want)+limit-1)/limit, pages, "limit %d", limit)
	}

	// The longest id and version still make a cursor of at most 256
	// characters.
	long := strings.Repeat("z", 128)
	w.create(t, w.globex, "globex", doc(long, 1000000, "on:prepare:power.on"), false)
	w.create(t, w.globex, "globex", doc(long, 999999, "on:prepare:power.on"), false)
	page, err := w.globex.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "globex", Limit: client.NewOptInt64(6)})
	require.NoError(t, err)
	require.False(t, page.Data.Cursor.Null)
	assert.Equal(t, long, page.Data.Items[5].ProfileId)
	assert.LessOrEqual(t, len(page.Data.Cursor.Value), 256)
	page, err = w.globex.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "globex", Limit: client.NewOptInt64(6), Cursor: client.NewOptString(page.Data.Cursor.Value)})
	require.NoError(t, err)
	require.Len(t, page.Data.Items, 1)
	assert.EqualValues(t, 1000000, page.Data.Items[0].ProfileVersion)

	// One page of everything, default limit 50.
	res, err := w.acme.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "acme"})
	require.NoError(t, err)
	assert.Len(t, res.Data.Items, len(all))
	assert.True(t, res.Data.Cursor.Null)

	// A cursor the method did not return, or returned to another tenant.
	first, err := w.acme.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "acme", Limit: client.NewOptInt64(1)})
	require.NoError(t, err)
	_, err = w.globex.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "globex", Cursor: client.NewOptString(first.Data.Cursor.Value)})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = w.acme.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "acme", Cursor: client.NewOptString("bm90LWEtY3Vyc29y")})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = w.acme.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "acme", Limit: client.NewOptInt64(201)})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	_, err = w.acme.ProfilesList(ctx, &client.ProfilesListInput{TenantId: "acme", Cursor: client.NewOptString(strings.Repeat("a", 257))})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
}

func lock(t *testing.T, w *world, tenant, id string, version int) {
	t.Helper()
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return profiles.Lock(ctx, tx, tenant, id, version)
	}))
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()
	w.create(t, w.acme, "acme", doc("web", 1, "on:prepare:power.on"), false)
	upd := func(c *computeclient.Client, in *client.ProfilesUpdateInput) (*client.Profile, error) {
		if in.TenantId == "" {
			in.TenantId, in.ProfileId, in.ProfileVersion = "acme", "web", 1
		}
		res, err := c.ProfilesUpdate(ctx, in)
		if err != nil {
			return nil, err
		}
		return &res.Data, nil
	}

	_, err := upd(w.acme, &client.ProfilesUpdateInput{})
	assert.Equal(t, "INVALID_INPUT", code(t, err), "neither document nor visibility")

	p, err := upd(w.acme, &client.ProfilesUpdateInput{Document: raw(t, doc("web", 1, "off:prepare:power.off", "on:verify:power.on"))})
	require.NoError(t, err, "stored, unused: the document is replaced")
	assert.EqualValues(t, 2, p.Version)
	assert.JSONEq(t, `[{"name":"off","phase":"prepare","uses":"power.off"},{"name":"on","phase":"verify","uses":"power.on"}]`, string(p.Document["steps"]))

	for name, c := range map[string]struct {
		d    any
		path string
	}{
		"another id":      {doc("web2", 1, "on:prepare:power.on"), "document.id"},
		"another version": {doc("web", 2, "on:prepare:power.on"), "document.version"},
		"a bad document":  {doc("web", 1, "on:later:power.on"), "document.steps[0].phase"},
		"not an object":   {[]any{1}, "document"},
	} {
		_, err := upd(w.acme, &client.ProfilesUpdateInput{Document: raw(t, c.d)})
		e := testenv.APIError(t, err, name)
		assert.Equal(t, "INVALID_INPUT", e.Code, name)
		assert.Equal(t, c.path, e.Details["path"], name)
	}

	_, err = upd(w.acme, &client.ProfilesUpdateInput{Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPublic),
		ExpectedVersion: client.NewOptInt64(1)})
	assert.Equal(t, "CONFLICT", code(t, err), "a stale expectedVersion")
	p, err = upd(w.acme, &client.ProfilesUpdateInput{Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPublic),
		ExpectedVersion: client.NewOptInt64(2)})
	require.NoError(t, err)
	assert.Equal(t, client.ProfileVisibilityPublic, p.Visibility)
	assert.EqualValues(t, 3, p.Version)

	// The first use by a workflow: the document is immutable, the
	// visibility is not.
	lock(t, w, "acme", "web", 1)
	lock(t, w, "acme", "web", 1) // a second use keeps the first time
	got, err := get(t, w.acme, "acme", "web", 1)
	require.NoError(t, err)
	require.False(t, got.LockedAt.Null)
	_, err = upd(w.acme, &client.ProfilesUpdateInput{Document: raw(t, doc("web", 1, "on:prepare:power.on"))})
	assert.Equal(t, "INVALID_STATE", code(t, err))
	_, err = upd(w.acme, &client.ProfilesUpdateInput{Document: raw(t, doc("web", 1, "on:prepare:power.on")),
		Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPrivate)})
	assert.Equal(t, "INVALID_STATE", code(t, err), "a document with a visibility is refused whole")
	p, err = upd(w.acme, &client.ProfilesUpdateInput{Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPrivate)})
	require.NoError(t, err)
	assert.Equal(t, client.ProfileVisibilityPrivate, p.Visibility)
	p, err = upd(w.acme, &client.ProfilesUpdateInput{Document: raw(t, got.Document)})
	require.NoError(t, err, "its own document again changes nothing")
	assert.Equal(t, got.LockedAt.Value, p.LockedAt.Value)

	// Only the tenant's own versions: a public one of another tenant, a
	// shipped one and an absent one are NOT_FOUND.
	w.create(t, w.globex, "globex", doc("pub", 1, "on:prepare:power.on"), true)
	for _, id := range []string{"pub", "metal-host", "absent"} {
		_, err = upd(w.acme, &client.ProfilesUpdateInput{TenantId: "acme", ProfileId: id, ProfileVersion: 1,
			Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPrivate)})
		assert.Equal(t, "NOT_FOUND", code(t, err), id)
	}
	_, err = upd(w.viewer, &client.ProfilesUpdateInput{Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPublic)})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
}

func TestDelete(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()
	for v := 1; v <= 3; v++ {
		w.create(t, w.acme, "acme", doc("web", v, "on:prepare:power.on"), false)
	}
	del := func(tenant, id string, version int64) (int64, error) {
		in := &client.ProfilesDeleteInput{TenantId: tenant, ProfileId: id}
		if version > 0 {
			in.ProfileVersion = client.NewOptInt64(version)
		}
		res, err := w.acme.ProfilesDelete(ctx, in)
		if err != nil {
			return 0, err
		}
		return res.Data.Deleted, nil
	}
	lock(t, w, "acme", "web", 2)
	n, err := del("acme", "web", 2)
	require.NoError(t, err, "a used version can be deleted: running workflows keep their snapshot")
	assert.EqualValues(t, 1, n)
	_, err = get(t, w.acme, "acme", "web", 2)
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = del("acme", "web", 2)
	assert.Equal(t, "NOT_FOUND", code(t, err))
	n, err = del("acme", "web", 0)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "every version")
	_, err = del("acme", "web", 0)
	assert.Equal(t, "NOT_FOUND", code(t, err))

	_, err = del("acme", "metal-host", 0)
	assert.Equal(t, "NOT_FOUND", code(t, err), "shipped profiles cannot be deleted")
	_, err = del("acme", "metal-host", 1)
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = get(t, w.acme, "acme", "metal-host", 1)
	require.NoError(t, err)

	w.create(t, w.globex, "globex", doc("pub", 1, "on:prepare:power.on"), true)
	_, err = del("acme", "pub", 0)
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's public profile")
	_, err = get(t, w.acme, "acme", "pub", 1)
	require.NoError(t, err)

	// An own version deleted uncovers a public one of the same id again.
	w.create(t, w.acme, "acme", doc("pub", 1, "off:prepare:power.off"), false)
	n, err = del("acme", "pub", 1)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	p, err := get(t, w.acme, "acme", "pub", 1)
	require.NoError(t, err)
	assert.Equal(t, "globex", p.TenantId)
}

// The workflow engine's ports: Render as the tenant sees the profile,
// Lock at start.
func TestForWorkflows(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.create(t, w.acme, "acme", doc("base", 1, "off:prepare:power.off"), false)
	w.create(t, w.acme, "acme", doc("mine", 1, "base:prepare:profile:base@1", "join:verify:node.join"), false)
	var r *workflows.Rendered
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		var port workflows.Renderer = profiles.ForWorkflows{}
		if r, err = port.Render(ctx, tx, "acme", "mine", 0); err != nil {
			return err
		}
		return workflows.Locker(profiles.ForWorkflows{}).Lock(ctx, tx, r.Tenant, r.ID, r.Version)
	}))
	assert.Equal(t, "acme", r.Tenant)
	require.Len(t, r.Steps, 2)
	assert.Equal(t, workflows.Step{Name: "base/off", Phase: "prepare", Uses: "power.off", With: map[string]any{}, TimeoutMs: 300000}, r.Steps[0])
	p, err := get(t, w.acme, "acme", "mine", 1)
	require.NoError(t, err)
	assert.False(t, p.LockedAt.Null)

	err = w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return profiles.Lock(ctx, tx, "acme", "absent", 1)
	})
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, api.CodeNotFound, ae.Code)
	require.NoError(t, w.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return profiles.Lock(ctx, tx, profiles.BuiltinTenant, "metal-host", 1)
	}), "shipped profiles are immutable already")
}
