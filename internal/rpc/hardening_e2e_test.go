package rpc_test

// Input hardening through the HTTP API (issue 9, defects 1, 2, 5 and 12):
// cursors open only exactly as a method returned them, NUL characters and
// duplicate keys are refused where the body is decoded, for every method,
// and UNAVAILABLE always carries its retry hint.

import (
	"context"
	"net/http"
	"net/url"
	"slices"
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
	"computeplane/internal/wire"
)

func TestDuplicateKeysAreInvalidInput(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for body, path := range map[string]string{
		`{"tenantId":"acme","tenantId":"root"}`:                      "tenantId",
		`{"tenantId":"acme","limit":1,"limit":50}`:                   "limit",
		`{"tenantId":"acme","kind":"custom","kind":"shared"}`:        "kind",
		`{"tenantId":"acme","region":"a","cursor":"x","region":"b"}`: "region",
	} {
		c := env.Client(t, computeclient.WithToken("any"), computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, body) }))
		_, err := c.SitesList(t.Context(), &client.SitesListInput{TenantId: "acme"})
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, body)
		assert.Equal(t, path+": appears more than once", e.Message, body)
		require.Len(t, e.Issues(), 1, body)
		assert.Equal(t, path, e.Issues()[0].Path, body)
	}
}

func TestNULInAnyStringIsInvalidInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	token := env.Key(t, "acme", "ann", "owner")
	for _, tt := range []struct{ path, body string }{
		{"webhooks/create", `{"tenantId":"acme","url":"https://example.com/hook","events":["site.created"],"description":"a\u0000b"}`},
		{"webhooks/create", `{"tenantId":"acme","url":"https://example.com/hook","events":["site.created","\u0000"]}`},
		{"secrets/put", `{"tenantId":"acme","name":"db","value":"x\u0000y","idempotencyKey":"k1"}`},
		{"sites/create", `{"tenantId":"acme","kind":"custom","region":"eu-west","idempotencyKey":"k\u0000"}`},
		{"providerAccounts/create", `{"tenantId":"acme","provider":"p","name":"n","config":{"nested":["ok","\u0000"]}}`},
	} {
		c := env.Client(t, computeclient.WithToken(token), computeclient.WithRequestEditor(func(r *http.Request) {
			r.URL.Path = env.Config.BasePath + "/" + tt.path
			setBody(r, tt.body)
		}))
		_, err := c.SystemVersion(t.Context(), &client.SystemVersionInput{})
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, tt.body)
		assert.Contains(t, e.Message, "must not contain the NUL character (U+0000)", tt.body)
	}
	// The NUL names its field.
	c := env.Client(t, computeclient.WithToken(token))
	_, err := c.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{
		TenantId: "acme", URL: "https://example.com/hook", Events: []string{"site.created"},
		Description: client.NewOptString("a\x00b"),
	})
	e := testenv.APIError(t, err)
	assert.Equal(t, "description: must not contain the NUL character (U+0000)", e.Message)

	// Nothing was written.
	var webhooks, secrets, sites int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), `select
		(select count(*) from webhooks), (select count(*) from secrets), (select count(*) from sites)`).
		Scan(&webhooks, &secrets, &sites))
	assert.Zero(t, webhooks+secrets+sites)
}

// cursorMethods are the served methods that take a cursor, each listing a
// page of tenant's items after cursor ("" for the first page) and
// returning the next cursor.
func cursorMethods(t *testing.T, c *computeclient.Client, tenant string) map[string]func(cursor string) (string, error) {
	sitesList := func(cursor string) (string, error) {
		in := &client.SitesListInput{TenantId: tenant, Limit: client.NewOptInt64(1)}
		if cursor != "" {
			in.Cursor = client.NewOptString(cursor)
		}
		res, err := c.SitesList(t.Context(), in)
		if err != nil {
			return "", err
		}
		return res.Data.Cursor.Or(""), nil
	}
	eventsList := func(cursor string) (string, error) {
		in := &client.EventsListInput{TenantId: tenant, Limit: client.NewOptInt64(1)}
		if cursor != "" {
			in.Cursor = client.NewOptString(cursor)
		}
		res, err := c.EventsList(t.Context(), in)
		if err != nil {
			return "", err
		}
		return res.Data.Cursor.Or(""), nil
	}
	usageList := func(cursor string) (string, error) {
		in := &client.UsageListInput{TenantId: tenant, Limit: client.NewOptInt64(1)}
		if cursor != "" {
			in.Cursor = client.NewOptString(cursor)
		}
		res, err := c.UsageList(t.Context(), in)
		if err != nil {
			return "", err
		}
		return res.Data.Cursor.Or(""), nil
	}
	profilesList := func(cursor string) (string, error) {
		in := &client.ProfilesListInput{TenantId: tenant, Limit: client.NewOptInt64(1)}
		if cursor != "" {
			in.Cursor = client.NewOptString(cursor)
		}
		res, err := c.ProfilesList(t.Context(), in)
		if err != nil {
			return "", err
		}
		return res.Data.Cursor.Or(""), nil
	}
	return map[string]func(string) (string, error){
		api.MethodSitesList:    sitesList,
		api.MethodEventsList:   eventsList,
		api.MethodUsageList:    usageList,
		api.MethodProfilesList: profilesList,
	}
}

func TestCursorsOpenOnlyAsTheMethodReturnedThem(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")))
	// Two sites, so site.created events and a second page exist.
	for _, key := range []string{"c1", "c2"} {
		_, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
			TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: key,
		})
		require.NoError(t, err)
	}
	// Three hourly usage windows, so usage.list has a second page.
	require.NoError(t, env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := usage.Open(ctx, tx, usage.Allocation{TenantID: "acme", Meter: api.MeterNodeHours, PerHour: usage.Micro,
			Owner: usage.Owner{Type: "node", ID: "n"}, At: time.Now().Add(-4 * time.Hour)}); err != nil {
			return err
		}
		_, err := usage.Rollup(ctx, tx, "acme", time.Now())
		return err
	}))
	methods := cursorMethods(t, c, "acme")

	// Every served method with a cursor input is covered here.
	var withCursor []string
	for _, m := range api.Methods {
		var iss wire.Issues
		m.Decode(map[string]any{"cursor": true}, &iss)
		takesCursor := slices.ContainsFunc(iss.List, func(i wire.Issue) bool { return i.Path == "cursor" && i.Message != "unknown field" })
		if m.Registered() && takesCursor {
			withCursor = append(withCursor, m.FullName)
		}
	}
	covered := make([]string, 0, len(methods))
	for name := range methods {
		covered = append(covered, name)
	}
	assert.ElementsMatch(t, withCursor, covered, "a served list method with a cursor has no cursor test")

	genuine := map[string]string{}
	for name, list := range methods {
		var cur string
		// Events become readable once every older transaction finished.
		require.Eventually(t, func() bool {
			var err error
			cur, err = list("")
			require.NoError(t, err, name)
			return cur != ""
		}, 10*time.Second, 50*time.Millisecond, name)
		_, err := list(cur)
		require.NoError(t, err, "%s: its own cursor opens", name)
		genuine[name] = cur
	}
	other := env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner")))
	for name, list := range methods {
		cur := genuine[name]
		last := cur[len(cur)-1:]
		bad := map[string]string{
			"last character changed":           cur[:len(cur)-1] + map[bool]string{true: "B", false: "A"}[last == "A"],
			"last character's unused bits set": cur[:len(cur)-1] + string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[(strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", last[0])^1)]),
			"first character changed":          map[bool]string{true: "B", false: "A"}[cur[0] == 'A'] + cur[1:],
			"truncated":                        cur[:len(cur)-2],
			"empty":                            "",
		}
		for otherName, otherCur := range genuine {
			if otherName != name {
				bad["cursor of "+otherName] = otherCur
			}
		}
		for what, b := range bad {
			if b == "" {
				continue // an empty cursor is the first page, or refused by the pattern
			}
			_, err := list(b)
			e := testenv.APIError(t, err, "%s: %s", name, what)
			assert.Equal(t, "INVALID_INPUT", e.Code, "%s: %s", name, what)
			assert.Contains(t, e.Message, "cursor", "%s: %s", name, what)
		}
		// Another tenant's cursor, presented in that tenant.
		otherList := cursorMethods(t, other, "globex")[name]
		_, err := otherList(cur)
		e := testenv.APIError(t, err, "%s: another tenant's cursor", name)
		assert.Equal(t, "INVALID_INPUT", e.Code, "%s: another tenant's cursor", name)
	}

	// GET /watch resumes only from an id its stream sent (Last-Event-ID,
	// or lastEventId in the query).
	token := env.Key(t, "acme", "ann2", "owner")
	events := genuine[api.MethodEventsList]
	for what, id := range map[string]string{
		"tampered":        events[:len(events)-1] + map[bool]string{true: "B", false: "A"}[strings.HasSuffix(events, "A")],
		"sites.list's":    genuine[api.MethodSitesList],
		"truncated":       events[:10],
		"with a new line": events[:8] + "\n" + events[8:],
	} {
		for _, inHeader := range []bool{true, false} {
			u := env.URL + "/watch?tenantId=acme"
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
			require.NoError(t, err)
			if inHeader && !strings.Contains(id, "\n") {
				req.Header.Set("Last-Event-ID", id)
			} else {
				req.URL.RawQuery += "&lastEventId=" + url.QueryEscape(id)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "/watch with a %s last event id", what)
		}
	}
}

func TestUnavailableAlwaysCarriesRetryAfter(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "secrets: {store: none}\n")))
	rec := &recorder{}
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")),
		computeclient.WithHTTPClient(&http.Client{Transport: rec}))
	for name, call := range map[string]func() error{
		"secrets.put": func() error {
			_, err := c.SecretsPut(t.Context(), &client.SecretsPutInput{TenantId: "acme", Name: "db", Value: "v", IdempotencyKey: "k"})
			return err
		},
		"secrets.delete": func() error {
			_, err := c.SecretsDelete(t.Context(), &client.SecretsDeleteInput{TenantId: "acme", Name: "db"})
			return err
		},
	} {
		e := testenv.APIError(t, call(), name)
		assert.Equal(t, "UNAVAILABLE", e.Code, name)
		assert.Equal(t, http.StatusServiceUnavailable, e.Status, name)
		require.NotNil(t, e.RetryAfterMs, name)
		assert.Positive(t, *e.RetryAfterMs, name)
		assert.Equal(t, "1", rec.header("Retry-After"), name)
	}
}
