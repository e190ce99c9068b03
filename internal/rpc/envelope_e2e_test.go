package rpc_test

// One test per rule of the specification's "Conventions for every RPC
// method" table, each through the generated client over HTTP against the
// real host and a real PostgreSQL. Requests the client would never send
// (a GET, a missing header, an oversized body) are made by editing the
// client's request just before it leaves.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/host"
	"computeplane/internal/reqmeta"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
)

// recorder keeps the last response's headers, which the generated client
// does not expose.
type recorder struct {
	last atomic.Pointer[http.Response]
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		r.last.Store(resp)
	}
	return resp, err
}

func (r *recorder) header(name string) string { return r.last.Load().Header.Get(name) }

func setBody(r *http.Request, body string) {
	r.Body = io.NopCloser(strings.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = nil
}

func version(t *testing.T, c *computeclient.Client) (*client.SystemVersionResult, error) {
	t.Helper()
	return c.SystemVersion(t.Context(), &client.SystemVersionInput{})
}

func TestRouteServesMethodsUnderBasePath(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	res, err := version(t, env.Client(t))
	require.NoError(t, err)
	assert.Equal(t, "/api/compute", res.Data.BasePath)
	assert.NotEmpty(t, res.Data.Name)
	assert.NotEmpty(t, res.Data.Version)
	assert.Equal(t, int64(1), res.Data.AgentProtocol.Min)
}

func TestConfiguredBasePath(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "basePath: /compute/v\n")))
	require.Equal(t, env.URL+"/compute/v", env.APIURL)
	res, err := version(t, env.Client(t))
	require.NoError(t, err)
	assert.Equal(t, "/compute/v", res.Data.BasePath)
}

func TestOtherHTTPMethodsAreMethodNotAllowed(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		rec := &recorder{}
		c := env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec}),
			computeclient.WithRequestEditor(func(r *http.Request) { r.Method = method }))
		_, err := version(t, c)
		e := testenv.APIError(t, err)
		assert.Equal(t, "METHOD_NOT_ALLOWED", e.Code, method)
		assert.Equal(t, http.StatusMethodNotAllowed, e.Status, method)
		assert.Equal(t, "POST", rec.header("Allow"), method)
	}
}

func TestUnknownMethodIsNotFoundInTheEnvelope(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for _, path := range []string{"/system/nope", "/nogroup/version", "/system", "/system/version/extra"} {
		c := env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { r.URL.Path = "/api/compute" + path }))
		_, err := version(t, c)
		e := testenv.APIError(t, err)
		assert.Equal(t, "NOT_FOUND", e.Code, path)
		assert.Equal(t, http.StatusNotFound, e.Status, path)
	}
}

func TestMissingServiceHeaderIsCSRFRejected(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for name, edit := range map[string]func(*http.Request){
		"absent":  func(r *http.Request) { r.Header.Del("X-Service") },
		"wrong":   func(r *http.Request) { r.Header.Set("X-Service", "2") },
		"empty":   func(r *http.Request) { r.Header.Set("X-Service", "") },
		"no type": func(r *http.Request) { r.Header.Del("Content-Type") },
		"form":    func(r *http.Request) { r.Header.Set("Content-Type", "application/x-www-form-urlencoded") },
		"text":    func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") },
	} {
		_, err := version(t, env.Client(t, computeclient.WithRequestEditor(edit)))
		e := testenv.APIError(t, err)
		assert.Equal(t, "CSRF_REJECTED", e.Code, name)
		assert.Equal(t, http.StatusForbidden, e.Status, name)
	}
}

func TestJSONContentTypeWithCharsetIsAccepted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) {
		r.Header.Set("Content-Type", "application/json; charset=utf-8")
	}))
	_, err := version(t, c)
	require.NoError(t, err)
}

func TestBodyIsAtMost64KiB(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	// Whitespace after the object keeps the JSON valid at any size.
	exact := "{}" + strings.Repeat(" ", rpc.MaxBody-2)
	_, err := version(t, env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, exact) })))
	require.NoError(t, err, "a body of exactly 64 KiB is accepted")

	over := exact + " "
	_, err = version(t, env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, over) })))
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Message, "65536")
}

func TestEmptyBodyIsAnEmptyObject(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	_, err := version(t, env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, "") })))
	require.NoError(t, err)
}

func TestBodyMustBeOneJSONObject(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for body, want := range map[string]string{
		"[]":         "must be a JSON object, got array",
		`"x"`:        "must be a JSON object, got string",
		"null":       "must be a JSON object, got null",
		"{":          "not valid JSON",
		"{} {}":      "data after the JSON object",
		`{}x`:        "data after the JSON object",
		"\xff\xfe{}": "not valid UTF-8",
	} {
		_, err := version(t, env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, body) })))
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, body)
		assert.Contains(t, e.Message, want, body)
	}
}

func TestUnknownFieldAndWrongTypeNameThePath(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	_, err := version(t, env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, `{"extra":1}`) })))
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Equal(t, "extra: unknown field", e.Message)
	assert.Equal(t, []computeclient.Issue{{Message: "unknown field", Path: "extra"}}, e.Issues())

	c := env.Client(t, computeclient.WithToken("any"), computeclient.WithRequestEditor(func(r *http.Request) {
		setBody(r, `{"tenantId":5,"kind":"custom","region":"eu-west","idempotencyKey":"k1"}`)
	}))
	_, err = c.SitesCreate(t.Context(), &client.SitesCreateInput{})
	e = testenv.APIError(t, err)
	assert.Equal(t, "tenantId: must be a string, got number", e.Message)
}

func TestValidationReportsFirstProblemAndEveryIssue(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithToken("any"), computeclient.WithRequestEditor(func(r *http.Request) {
		setBody(r, `{"kind":"other","region":"Not-A-Region","iamRegion":7,"bogus":true}`)
	}))
	_, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Equal(t, http.StatusBadRequest, e.Status)
	assert.Equal(t, "bogus: unknown field", e.Message)
	assert.Equal(t, []computeclient.Issue{
		{Message: "unknown field", Path: "bogus"},
		{Message: "is required", Path: "tenantId"},
		{Message: "must be one of shared, dedicated, custom", Path: "kind"},
		{Message: "must be a region: a lowercase letter, then up to 62 lowercase letters, digits or hyphens (pattern ^[a-z][a-z0-9-]{0,62}$)", Path: "region"},
		{Message: "is required", Path: "idempotencyKey"},
		{Message: "must be a string, got number", Path: "iamRegion"},
	}, e.Issues())
}

func TestNestedIssuePaths(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithToken("any"), computeclient.WithRequestEditor(func(r *http.Request) {
		setBody(r, `{"tenantId":"t1","name":"tpl","poolId":"pool_0123456789abcdefghjkmnpqrs","flavor":"small",`+
			`"imageId":"ubuntu","warm":{"min":65},"env":{"lower":"x"},"volumes":[{"name":"v","mountPath":"/data"},{"mountPath":"rel"}]}`)
	}))
	_, err := c.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{})
	e := testenv.APIError(t, err)
	var paths []string
	for _, i := range e.Issues() {
		paths = append(paths, i.Path)
	}
	assert.Equal(t, []string{"warm.min", "env.lower", "volumes[1].mountPath", "volumes[1]"}, paths)
	assert.True(t, strings.HasPrefix(e.Message, "warm.min: "), e.Message)
}

func TestPlannedMethodsAnswerNotImplementedNamingTheirPhase(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := env.Client(t, computeclient.WithToken("any"))
	// Every method of the catalog is served today; the answer a planned
	// one gets (TestEveryPlannedMethodIsNotImplemented calls each through
	// the envelope) names the method and its phase.
	m := *api.Lookup("/sites/list")
	m.Status, m.Phase = "planned", "v9.9"
	e := api.NotImplemented(&m)
	assert.Equal(t, api.CodeNotImplemented, e.Code)
	assert.Contains(t, e.Message, "sites.list")
	assert.Contains(t, e.Message, "v9.9")

	// The message of a planned method without a phase says so.
	assert.Contains(t, api.NotImplemented(&api.Method{FullName: "x.y", Phase: "none"}).Message, "without a phase")

	// Input is validated first.
	_, err := c.UsageList(t.Context(), &client.UsageListInput{TenantId: "acme", Limit: client.NewOptInt64(0)})
	e2 := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e2.Code)
	assert.Equal(t, "limit: must be at least 1", e2.Message)
}

func TestEveryPlannedMethodIsNotImplemented(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for _, m := range api.Methods {
		if m.Registered() {
			continue
		}
		// A planned method refuses any body as INVALID_INPUT or answers
		// NOT_IMPLEMENTED; none pretends to work.
		c := env.Client(t, computeclient.WithToken("any"),
			computeclient.WithRequestEditor(func(r *http.Request) { r.URL.Path = "/api/compute" + m.Route }))
		_, err := version(t, c)
		e := testenv.APIError(t, err)
		assert.Contains(t, []string{"INVALID_INPUT", "NOT_IMPLEMENTED"}, e.Code, m.FullName)
	}
}

func TestSuccessIsDataEnvelope(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	rec := &recorder{}
	c := env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec}))
	res, err := c.SystemWhoami(t.Context(), &client.SystemWhoamiInput{})
	require.NoError(t, err)
	assert.False(t, res.Data.Authenticated)
	assert.Equal(t, "application/json", rec.header("Content-Type"))
}

// systemDouble replaces the system service to make the envelope face
// answers no real method gives yet.
type systemDouble struct {
	api.UnimplementedSystemService
	version   func(ctx context.Context) (*api.ServerDocument, error)
	selfCheck func(ctx context.Context) (*api.SelfCheck, error)
}

func (s *systemDouble) Version(ctx context.Context, _ *api.SystemVersionInput) (*api.ServerDocument, error) {
	return s.version(ctx)
}

func (s *systemDouble) SelfCheck(ctx context.Context, _ *api.SystemSelfCheckInput) (*api.SelfCheck, error) {
	return s.selfCheck(ctx)
}

func withSystem(d *systemDouble) testenv.Option {
	return testenv.WithOverrides(host.Overrides{Services: func(s *api.Services) { s.System = d }})
}

func TestRetryAfterMovesToTopLevelAndHeader(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, withSystem(&systemDouble{version: func(context.Context) (*api.ServerDocument, error) {
		return nil, api.Errorf(api.CodeUnavailable, "store busy").WithDetails(map[string]any{"retryAfterMs": 1500, "reason": "busy"})
	}}))
	rec := &recorder{}
	_, err := version(t, env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec})))
	e := testenv.APIError(t, err)
	assert.Equal(t, "UNAVAILABLE", e.Code)
	assert.Equal(t, http.StatusServiceUnavailable, e.Status)
	require.NotNil(t, e.RetryAfterMs)
	assert.Equal(t, int64(1500), *e.RetryAfterMs)
	assert.Equal(t, map[string]any{"reason": "busy"}, e.Details, "retryAfterMs leaves details")
	assert.Equal(t, "2", rec.header("Retry-After"), "whole seconds, rounded up")
}

func TestNonServiceErrorsBecomeInternalError(t *testing.T) {
	t.Parallel()
	secret := "password=hunter2 at db.internal:5432"
	for name, fail := range map[string]error{
		"plain error":    errors.New(secret),
		"internal error": api.Errorf(api.CodeInternalError, "%s", secret).WithDetails(map[string]any{"dsn": secret}),
	} {
		env := testenv.Start(t, withSystem(&systemDouble{version: func(context.Context) (*api.ServerDocument, error) {
			return nil, fail
		}}))
		rec := &recorder{}
		c := env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec}),
			computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Set("X-Request-Id", "req-internal-1") }))
		_, err := version(t, c)
		e := testenv.APIError(t, err)
		assert.Equal(t, "INTERNAL_ERROR", e.Code, name)
		assert.Equal(t, http.StatusInternalServerError, e.Status, name)
		assert.Equal(t, "Internal server error", e.Message, name)
		assert.Nil(t, e.Details, name)
		// The cause is logged with the request id, never answered.
		lines := env.LogLines("req-internal-1")
		require.NotEmpty(t, lines, name)
		assert.Contains(t, strings.Join(lines, "\n"), "hunter2", name)
		if name == "plain error" {
			// Wrapped at the group boundary with what was being done.
			assert.Contains(t, strings.Join(lines, "\n"), "system.version: "+secret, name)
		}
	}
}

func TestRequestIDIsKeptOrGenerated(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	cases := map[string]bool{
		"abc.DEF_123:-x":          true,
		strings.Repeat("a", 128):  true,
		strings.Repeat("a", 129):  false,
		"has space":               false,
		"semi;colon":              false,
		"":                        false,
		"unicode-\u00e9":          false,
		"req_client_supplied.123": true,
	}
	for id, kept := range cases {
		rec := &recorder{}
		c := env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec}),
			computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Set("X-Request-Id", id) }))
		_, err := version(t, c)
		require.NoError(t, err)
		got := rec.header("X-Request-Id")
		if kept {
			assert.Equal(t, id, got)
		} else {
			assert.Regexp(t, `^req_[0-9a-hjkmnp-tv-z]{26}$`, got, id)
		}
	}
	// Errors carry it too.
	rec := &recorder{}
	c := env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec}),
		computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Del("X-Service") }))
	_, err := version(t, c)
	require.Error(t, err)
	assert.Regexp(t, `^req_`, rec.header("X-Request-Id"))
}

func TestTraceparentKeptWhenValidDroppedWhenNot(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, withSystem(&systemDouble{version: func(ctx context.Context) (*api.ServerDocument, error) {
		return &api.ServerDocument{Name: "tp=" + reqmeta.FromContext(ctx).Traceparent}, nil
	}}))
	valid := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for header, want := range map[string]string{
		valid: valid,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01": "",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": "",
		"garbage": "",
	} {
		c := env.Client(t, computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Set("traceparent", header) }))
		res, err := version(t, c)
		require.NoError(t, err, "an invalid traceparent is dropped, not refused")
		assert.Equal(t, "tp="+want, res.Data.Name, header)
	}
}

// gateSpy counts identity calls and admits everything.
type gateSpy struct{ calls atomic.Int32 }

func (g *gateSpy) Admit(ctx context.Context, _ *rpc.Call) (context.Context, error) {
	g.calls.Add(1)
	return ctx, nil
}

func TestValidationRunsBeforeAuthentication(t *testing.T) {
	t.Parallel()
	spy := &gateSpy{}
	env := testenv.Start(t, testenv.WithOverrides(host.Overrides{Gate: spy}))
	c := env.Client(t, computeclient.WithToken("t"), computeclient.WithRequestEditor(func(r *http.Request) { setBody(r, `{"unexpected":1}`) }))
	_, err := c.SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Zero(t, spy.calls.Load(), "a malformed request costs no identity call")

	_, err = c.SystemVersion(t.Context(), &client.SystemVersionInput{})
	require.Error(t, err)
	assert.Zero(t, spy.calls.Load())
}

func TestNonPublicMethodWithoutCredentialIsUnauthenticated(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	// The generated client refuses to call a secured method without a token,
	// so the token is dropped on the way out.
	c := env.Client(t, computeclient.WithToken("dropped"),
		computeclient.WithRequestEditor(func(r *http.Request) { r.Header.Del("Authorization") }))
	_, err := c.SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
	e := testenv.APIError(t, err)
	assert.Equal(t, "UNAUTHENTICATED", e.Code)
	assert.Equal(t, http.StatusUnauthorized, e.Status)
	assert.Contains(t, e.Message, "credential is required")

	// A credential nobody can authenticate yet is refused as well.
	_, err = env.Client(t, computeclient.WithToken("unknown")).SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
	assert.Equal(t, "UNAUTHENTICATED", testenv.APIError(t, err).Code)
}

func TestPublicMethodsRunWithoutCredential(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	for _, c := range []*computeclient.Client{env.Client(t), env.Client(t, computeclient.WithToken("some-presented-credential"))} {
		_, err := version(t, c)
		require.NoError(t, err)
		res, err := c.SystemWhoami(t.Context(), &client.SystemWhoamiInput{})
		require.NoError(t, err)
		assert.False(t, res.Data.Authenticated, "no identity port yet: nobody is authenticated")
	}
}

func TestReadMethodsRunInReadOnlyTransaction(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t,
		testenv.WithOverrides(host.Overrides{Gate: &gateSpy{}, Services: func(s *api.Services) {
			s.System = &systemDouble{selfCheck: func(ctx context.Context) (*api.SelfCheck, error) {
				tx, ok := store.TxFromContext(ctx)
				if !ok {
					return nil, errors.New("no transaction")
				}
				_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ('written-by-a-read', 'x')")
				return nil, err
			}}
		}}))
	_, err := env.Client(t, computeclient.WithToken("t")).SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INTERNAL_ERROR", e.Code, "a read that writes fails")
	assert.NotEmpty(t, env.LogLines("read-only transaction"))
	var n int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta WHERE key = 'written-by-a-read'").Scan(&n))
	assert.Zero(t, n)
}

func TestSelfCheckFindingsWhenAdmitted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithOverrides(host.Overrides{Gate: &gateSpy{}}))
	res, err := env.Client(t, computeclient.WithToken("t")).SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
	require.NoError(t, err)
	assert.True(t, res.Data.Ok)
	checks := map[string]string{}
	for _, f := range res.Data.Findings {
		checks[f.Check] = string(f.Severity)
	}
	for _, name := range []string{"catalog", "migrations", "btree_gist", "clock"} {
		assert.Equal(t, "info", checks[name], name)
	}
}
