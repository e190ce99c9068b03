package server_test

// End-to-end tests of the host routes beside the RPC envelope (interface
// specification, "Non-RPC routes", Authentication rule 12, the Limits rows
// on metrics; docs/protocol.md, "Host routes"): the real api role on a fresh
// database through testenv, spoken to over HTTP.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"computeplane"
	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/buildinfo"
	"computeplane/internal/config"
	"computeplane/internal/metrics"
	"computeplane/internal/testenv"
)

// metricsToken is a valid metrics token: at least 16 characters.
const metricsToken = "metrics-token-0123456789"

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoErrorf(t, json.Unmarshal(a.body, &m), "body: %s", a.body)
	return m
}

// do sends one request; header values are set as given.
func do(t *testing.T, method, url string, header map[string]string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: body}
}

func get(t *testing.T, url string) answer { return do(t, http.MethodGet, url, nil) }

func TestHealthz(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	a := get(t, env.URL+"/healthz")
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, "application/json", a.header.Get("Content-Type"))
	assert.Equal(t, map[string]any{"ok": true}, a.json(t))
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	a := get(t, env.URL+"/readyz")
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, "application/json", a.header.Get("Content-Type"))
	assert.Equal(t, map[string]any{"ok": true}, a.json(t))
}

// Closing the env's store makes every store query fail. The store's own
// cleanup (dbtest) closes it again, which a pgx pool allows, and then drops
// the database.
func TestReadyzAndHealthWhenStoreFails(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	require.Equal(t, http.StatusOK, get(t, env.URL+"/readyz").status)
	env.Store.Close()

	a := get(t, env.URL+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	assert.Equal(t, map[string]any{"ok": false}, a.json(t))
	assert.NotEmpty(t, env.LogLines("readiness probe failed"))

	h := get(t, env.APIURL+"/health")
	assert.Equal(t, http.StatusServiceUnavailable, h.status)
	body := h.json(t)
	assert.Equal(t, "degraded", body["status"])
	assert.Equal(t, "unreachable", body["database"])
	assertHealthTime(t, body["time"])

	// The process still runs.
	assert.Equal(t, http.StatusOK, get(t, env.URL+"/healthz").status)
}

var healthTime = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`)

func assertHealthTime(t *testing.T, v any) {
	t.Helper()
	s, ok := v.(string)
	require.Truef(t, ok, "time is %T, not a string", v)
	assert.Regexp(t, healthTime, s, "RFC 3339 UTC with milliseconds")
	ts, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), ts, time.Minute)
}

func TestHealth(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	a := get(t, env.APIURL+"/health")
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	assert.Equal(t, "application/json", a.header.Get("Content-Type"))
	body := a.json(t)
	keys := make([]string, 0, len(body))
	for k := range body {
		keys = append(keys, k)
	}
	assert.ElementsMatch(t, []string{"status", "database", "latencyMs", "time"}, keys)
	assert.Equal(t, "ok", body["status"])
	assert.Equal(t, "ok", body["database"])
	latency, ok := body["latencyMs"].(float64)
	require.Truef(t, ok, "latencyMs is %T, not a number", body["latencyMs"])
	assert.GreaterOrEqual(t, latency, 0.0)
	assertHealthTime(t, body["time"])
}

func TestWellKnownDocument(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	root := get(t, env.URL+"/.well-known/service")
	under := get(t, env.APIURL+"/.well-known/service")
	for _, a := range []answer{root, under} {
		require.Equal(t, http.StatusOK, a.status)
		assert.Equal(t, "application/json", a.header.Get("Content-Type"))
		assert.Equal(t, "public, max-age=300", a.header.Get("Cache-Control"))
	}
	assert.JSONEq(t, string(root.body), string(under.body), "the same document under the base path")

	doc := root.json(t)
	assert.Equal(t, map[string]any{
		"name":          buildinfo.Name,
		"version":       buildinfo.Version(),
		"basePath":      "/api/compute",
		"agentProtocol": map[string]any{"min": float64(buildinfo.AgentProtocolMin), "max": float64(buildinfo.AgentProtocolMax)},
	}, doc, "no gateway is configured")

	// system.version states the same document.
	res, err := env.Client(t).SystemVersion(t.Context(), &client.SystemVersionInput{})
	require.NoError(t, err)
	assert.Equal(t, doc["name"], res.Data.Name)
	assert.Equal(t, doc["version"], res.Data.Version)
	assert.Equal(t, doc["basePath"], res.Data.BasePath)
}

func TestWellKnownDocumentWithGateway(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t,
		testenv.WithEnv("SERVICE_GATEWAY_URL", "https://gw.example.com"),
		testenv.WithEnv("SERVICE_GATEWAY_SERVER_NAME", "gw.internal.example.com"),
		// The document only: this process does not run the gateway role.
		testenv.WithEnv("SERVICE_ROLES", "api"),
	)
	for _, url := range []string{env.URL + "/.well-known/service", env.APIURL + "/.well-known/service"} {
		a := get(t, url)
		require.Equal(t, http.StatusOK, a.status)
		assert.Equal(t, "public, max-age=300", a.header.Get("Cache-Control"))
		doc := a.json(t)
		assert.Equal(t, map[string]any{"url": "https://gw.example.com", "serverName": "gw.internal.example.com"}, doc["gateway"], url)
		assert.Equal(t, buildinfo.Name, doc["name"])
		assert.Equal(t, "/api/compute", doc["basePath"])
	}
}

// A configured base path moves the routes under it; the root routes stay.
func TestRoutesFollowConfiguredBasePath(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "basePath: /compute/v\n")))
	require.Equal(t, env.URL+"/compute/v", env.APIURL)

	doc := get(t, env.URL+"/.well-known/service")
	require.Equal(t, http.StatusOK, doc.status)
	assert.Equal(t, "/compute/v", doc.json(t)["basePath"])
	for _, p := range []string{"/.well-known/service", "/health", "/openapi.yaml", "/docs"} {
		assert.Equal(t, http.StatusOK, get(t, env.APIURL+p).status, p)
		assert.Equal(t, http.StatusNotFound, get(t, env.URL+"/api/compute"+p).status, "/api/compute"+p)
	}
	assert.Equal(t, http.StatusOK, get(t, env.URL+"/healthz").status)
	assert.Equal(t, http.StatusOK, get(t, env.URL+"/readyz").status)
}

// Every host route but /metrics answers 405 METHOD_NOT_ALLOWED to anything
// but GET and HEAD.
func TestHostRoutesRefuseOtherMethods(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	paths := []string{
		"/healthz", "/readyz", "/.well-known/service",
		"/api/compute/.well-known/service", "/api/compute/health",
		"/api/compute/openapi.yaml", "/api/compute/docs",
	}
	for _, p := range paths {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			a := do(t, m, env.URL+p, map[string]string{"Content-Type": "application/json", "X-Service": "1"})
			assert.Equalf(t, http.StatusMethodNotAllowed, a.status, "%s %s", m, p)
			assert.Containsf(t, a.header.Get("Allow"), "GET", "%s %s", m, p)
			var body struct {
				Error struct{ Code string } `json:"error"`
			}
			if assert.NoErrorf(t, json.Unmarshal(a.body, &body), "%s %s: %s", m, p, a.body) {
				assert.Equalf(t, "METHOD_NOT_ALLOWED", body.Error.Code, "%s %s", m, p)
			}
		}
	}
}

func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	a := get(t, env.APIURL+"/openapi.yaml")
	require.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, "application/yaml", a.header.Get("Content-Type"))
	assert.Equal(t, computeplane.OpenAPI, a.body, "the document embedded in the binary")

	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(a.body)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(t.Context()))
	assert.True(t, strings.HasPrefix(doc.OpenAPI, "3."), "OpenAPI 3, got %q", doc.OpenAPI)

	require.NotNil(t, doc.Paths)
	assert.Equal(t, len(api.Methods), doc.Paths.Len(), "one path per method")
	for _, m := range api.Methods {
		item := doc.Paths.Value(m.Route)
		if !assert.NotNilf(t, item, "no path %s for %s", m.Route, m.FullName) {
			continue
		}
		assert.NotNilf(t, item.Post, "%s: no POST operation", m.FullName)
		assert.Lenf(t, item.Operations(), 1, "%s: only POST", m.FullName)
	}
}

func TestDocsPage(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	a := get(t, env.APIURL+"/docs")
	require.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, "text/html; charset=utf-8", a.header.Get("Content-Type"))
	assert.NotEmpty(t, a.header.Get("Content-Security-Policy"))

	// The tokenizer reaches the end without an error.
	z := html.NewTokenizer(bytes.NewReader(a.body))
	for z.Next() != html.ErrorToken {
	}
	require.ErrorIs(t, z.Err(), io.EOF)

	root, err := html.Parse(bytes.NewReader(a.body))
	require.NoError(t, err)
	var text strings.Builder
	var title string
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			text.WriteString(n.Data)
			text.WriteString("\n")
			if n.Parent != nil && n.Parent.Type == html.ElementNode && n.Parent.Data == "title" {
				title = n.Data
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(root)
	assert.NotEmpty(t, strings.TrimSpace(title), "the page has a title")
	assert.Contains(t, string(a.body), "</html>")
	for _, m := range api.Methods {
		assert.Containsf(t, text.String(), m.FullName, "the page text names %s", m.FullName)
	}

	// The same page with a trailing slash.
	b := get(t, env.APIURL+"/docs/")
	assert.Equal(t, http.StatusOK, b.status)
	assert.Equal(t, a.body, b.body)
}

func TestMetricsAbsentWithoutToken(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	assert.Equal(t, http.StatusNotFound, get(t, env.URL+"/metrics").status)
	assert.Equal(t, http.StatusNotFound,
		do(t, http.MethodGet, env.URL+"/metrics", map[string]string{"Authorization": "Bearer " + metricsToken}).status)
}

func TestMetricsRequiresBearerToken(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_METRICS_TOKEN", metricsToken))
	url := env.URL + "/metrics"
	for name, auth := range map[string]string{
		"none":          "",
		"wrong token":   "Bearer " + metricsToken + "x",
		"prefix":        "Bearer " + metricsToken[:16],
		"other scheme":  "Basic " + metricsToken,
		"bare token":    metricsToken,
		"empty bearer":  "Bearer ",
		"wrong case id": "Bearer " + strings.ToUpper(metricsToken),
	} {
		h := map[string]string{}
		if auth != "" {
			h["Authorization"] = auth
		}
		a := do(t, http.MethodGet, url, h)
		assert.Equalf(t, http.StatusUnauthorized, a.status, "%s", name)
		assert.Equalf(t, "Bearer", a.header.Get("WWW-Authenticate"), "%s", name)
		assert.NotContainsf(t, string(a.body), "compute_rpc", "%s: no metrics leak", name)
	}
	a := do(t, http.MethodGet, url, map[string]string{"Authorization": "Bearer " + metricsToken})
	assert.Equal(t, http.StatusOK, a.status)
	// The scheme is case-insensitive (RFC 9110).
	a = do(t, http.MethodGet, url, map[string]string{"Authorization": "bearer " + metricsToken})
	assert.Equal(t, http.StatusOK, a.status)
}

func TestMetricsRefusesOtherMethods(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_METRICS_TOKEN", metricsToken))
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead} {
		for _, auth := range []string{"", "Bearer " + metricsToken} {
			h := map[string]string{}
			if auth != "" {
				h["Authorization"] = auth
			}
			a := do(t, m, env.URL+"/metrics", h)
			assert.Equalf(t, http.StatusMethodNotAllowed, a.status, "%s (auth %q)", m, auth)
			assert.Equalf(t, "GET", a.header.Get("Allow"), "%s", m)
		}
	}
}

// family returns the parsed metric families of a /metrics answer.
func families(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	return fams
}

// sample finds the series of fam with exactly the given labels.
func sample(fam *dto.MetricFamily, labels map[string]string) *dto.Metric {
	if fam == nil {
		return nil
	}
	for _, m := range fam.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		match := true
		for _, lp := range m.GetLabel() {
			if labels[lp.GetName()] != lp.GetValue() {
				match = false
			}
		}
		if match {
			return m
		}
	}
	return nil
}

func TestMetricsExposeRPCCalls(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_METRICS_TOKEN", metricsToken))

	_, err := env.Client(t).SystemVersion(t.Context(), &client.SystemVersionInput{})
	require.NoError(t, err)
	// selfCheck is not public and this build authenticates nobody: 401.
	_, err = env.Client(t, computeclient.WithToken("some-credential")).SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
	e, ok := computeclient.AsError(err)
	require.Truef(t, ok, "not an API error: %v", err)
	require.Equal(t, "UNAUTHENTICATED", e.Code)
	require.Equal(t, http.StatusUnauthorized, e.Status)

	a := do(t, http.MethodGet, env.URL+"/metrics", map[string]string{"Authorization": "Bearer " + metricsToken})
	require.Equal(t, http.StatusOK, a.status)
	assert.True(t, strings.HasPrefix(a.header.Get("Content-Type"), "text/plain"), "text exposition, got %q", a.header.Get("Content-Type"))
	assert.Equal(t, "no-store", a.header.Get("Cache-Control"))
	body := string(a.body)
	assert.Contains(t, body, "compute_rpc_requests_total{")
	assert.Contains(t, body, "compute_rpc_denied_total{")

	fams := families(t, a.body)
	requests := fams["compute_rpc_requests_total"]
	require.NotNil(t, requests, "compute_rpc_requests_total is exposed")
	assert.Equal(t, dto.MetricType_COUNTER, requests.GetType())
	ok1 := sample(requests, map[string]string{"method": "system.version", "code": "OK"})
	if assert.NotNil(t, ok1, "series method=system.version,code=OK") {
		assert.Equal(t, 1.0, ok1.GetCounter().GetValue())
	}
	refused := sample(requests, map[string]string{"method": "system.selfCheck", "code": "UNAUTHENTICATED"})
	if assert.NotNil(t, refused, "series method=system.selfCheck,code=UNAUTHENTICATED") {
		assert.Equal(t, 1.0, refused.GetCounter().GetValue())
	}

	denied := fams["compute_rpc_denied_total"]
	require.NotNil(t, denied, "compute_rpc_denied_total is exposed")
	d := sample(denied, map[string]string{"method": "system.selfCheck", "code": "UNAUTHENTICATED"})
	if assert.NotNil(t, d, "denied series for the 401") {
		assert.Equal(t, 1.0, d.GetCounter().GetValue())
	}
	assert.Nil(t, sample(denied, map[string]string{"method": "system.version", "code": "OK"}), "a success is not denied")
	assert.Len(t, denied.GetMetric(), 1)

	dur := fams["compute_rpc_duration_seconds"]
	if assert.NotNil(t, dur) {
		h := sample(dur, map[string]string{"method": "system.version"})
		if assert.NotNil(t, h) {
			assert.Equal(t, uint64(1), h.GetHistogram().GetSampleCount())
		}
	}

	// No series carries a tenant, identity or user label.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				l := strings.ToLower(lp.GetName())
				assert.Falsef(t, strings.Contains(l, "tenant") || strings.Contains(l, "identity") || strings.Contains(l, "user"),
					"%s has label %s", name, lp.GetName())
			}
		}
	}
}

// The metrics path is configurable; the route then is absent at /metrics.
func TestMetricsConfiguredPath(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t,
		testenv.WithEnv("SERVICE_METRICS_TOKEN", metricsToken),
		testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "metrics:\n  path: /internal/metrics\n")),
	)
	auth := map[string]string{"Authorization": "Bearer " + metricsToken}
	assert.Equal(t, http.StatusOK, do(t, http.MethodGet, env.URL+"/internal/metrics", auth).status)
	assert.Equal(t, http.StatusUnauthorized, get(t, env.URL+"/internal/metrics").status)
	assert.Equal(t, http.StatusNotFound, do(t, http.MethodGet, env.URL+"/metrics", auth).status)
}

// The rule the code implements for a short token: the configuration refuses
// it (INVALID_CONFIG naming metrics.token) rather than leaving the route
// unmounted. Lengths count characters, not bytes.
func TestMetricsTokenLength(t *testing.T) {
	t.Parallel()
	load := func(token string) (*config.Config, error) {
		env := map[string]string{
			"SERVICE_DATABASE_URL":  "postgres://nobody@127.0.0.1:1/x",
			"SERVICE_SECRET":        testenv.TestSecret,
			"SERVICE_METRICS_TOKEN": token,
		}
		return config.Load(func(k string) string { return env[k] })
	}
	for _, short := range []string{"x", "0123456789abcde", strings.Repeat("é", 15)} {
		_, err := load(short)
		require.Errorf(t, err, "%d chars", len([]rune(short)))
		var ce *config.Error
		require.True(t, errors.As(err, &ce))
		assert.Equal(t, "metrics.token", ce.Option)
		assert.True(t, strings.HasPrefix(err.Error(), "INVALID_CONFIG: metrics.token"), err.Error())
		assert.NotContains(t, err.Error(), short, "the token is not echoed")
	}
	for _, ok := range []string{"0123456789abcdef", strings.Repeat("é", 16)} {
		c, err := load(ok)
		require.NoError(t, err)
		assert.Equal(t, ok, c.Metrics.Token)
	}

	// At exactly 16 characters the route is mounted.
	env := testenv.Start(t, testenv.WithEnv("SERVICE_METRICS_TOKEN", strings.Repeat("é", 16)))
	assert.Equal(t, http.StatusOK,
		do(t, http.MethodGet, env.URL+"/metrics", map[string]string{"Authorization": "Bearer " + strings.Repeat("é", 16)}).status)
	assert.Equal(t, http.StatusUnauthorized, get(t, env.URL+"/metrics").status)
}

// TestRoundTripsPerCallAreMeasured: compute_rpc_db_round_trips counts the
// database round trips of each call. A read of one row with a cached
// decision is one statement on a read-only connection: one round trip, no
// BEGIN or COMMIT.
func TestRoundTripsPerCallAreMeasured(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_METRICS_TOKEN", metricsToken))
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")))
	site, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "rt-site",
	})
	require.NoError(t, err)
	_, err = c.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: site.Data.SiteId}) // warms the decision cache
	require.NoError(t, err)
	fams := func() map[string]*dto.MetricFamily {
		return families(t, do(t, http.MethodGet, env.URL+"/metrics", map[string]string{"Authorization": "Bearer " + metricsToken}).body)
	}
	histogram := func(method string) *dto.Histogram {
		for _, m := range fams()[metrics.RPCDBRoundTrips].GetMetric() {
			if m.GetLabel()[0].GetValue() == method {
				return m.GetHistogram()
			}
		}
		return nil
	}
	before := histogram("sites.get")
	require.NotNil(t, before)
	const gets = 5
	for range gets {
		_, err = c.SitesGet(t.Context(), &client.SitesGetInput{TenantId: "acme", SiteId: site.Data.SiteId})
		require.NoError(t, err)
	}
	after := histogram("sites.get")
	assert.Equal(t, before.GetSampleCount()+gets, after.GetSampleCount())
	assert.InDelta(t, float64(gets), after.GetSampleSum()-before.GetSampleSum(), 0.5, "one round trip per cached read")
	create := histogram("sites.create")
	require.NotNil(t, create)
	assert.Positive(t, create.GetSampleSum(), "a mutation's statements are counted too")
}
