package cli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
)

// testGroups: webhooks create has a url field, which shadows --url after
// the command name.
var testGroups = []Group{
	{Name: "system", Methods: []Method{{Name: "version", Kind: "public"}}},
	{Name: "webhooks", Methods: []Method{{Name: "create", Flags: []Flag{
		{Name: "tenant-id", Field: "tenantId", Type: String},
		{Name: "url", Field: "url", Type: String},
		{Name: "active", Field: "active", Type: Bool},
	}}}},
}

func TestParse(t *testing.T) {
	t.Parallel()
	inv, err := parse(testGroups, []string{"--url", "http://a", "webhooks", "--output=json", "create",
		"--tenant-id", "acme", "-url=http://hook", "--active", "--timeout", "5s", "--active=false"})
	require.NoError(t, err)
	assert.Equal(t, "webhooks", inv.group.Name)
	assert.Equal(t, "create", inv.method.Name)
	assert.Equal(t, map[string]string{"url": "http://a", "output": "json", "timeout": "5s"}, inv.global)
	assert.Equal(t, []FlagValue{
		{"tenant-id", "acme"}, {"url", "http://hook"}, {"active", "true"}, {"active", "false"},
	}, inv.flags)
	assert.False(t, inv.help)

	for _, tt := range []struct {
		args         []string
		group, metho string
	}{
		{[]string{"help"}, "", ""},
		{[]string{"--output", "json", "help", "webhooks"}, "webhooks", ""},
		{[]string{"help", "webhooks", "create"}, "webhooks", "create"},
		{[]string{"webhooks", "create", "-h"}, "webhooks", "create"},
		{[]string{"--help", "system"}, "system", ""},
	} {
		inv, err := parse(testGroups, tt.args)
		require.NoError(t, err, "%v", tt.args)
		assert.True(t, inv.help, "%v", tt.args)
		if tt.group != "" {
			assert.Equal(t, tt.group, inv.group.Name, "%v", tt.args)
		}
		if tt.metho != "" {
			assert.Equal(t, tt.metho, inv.method.Name, "%v", tt.args)
		}
	}

	for _, tt := range []struct {
		args []string
		msg  string
	}{
		{[]string{"nosuch"}, `unknown group "nosuch"`},
		{[]string{"system", "help"}, `unknown command "help" of group system`},
		{[]string{"system", "version", "x"}, `unexpected argument "x"`},
		{[]string{"webhooks", "--tenant-id", "a", "create"}, "unknown flag --tenant-id (a command's flags come after its name)"},
		{[]string{"--tenant-id", "a"}, "unknown flag --tenant-id"},
		{[]string{"webhooks", "create", "--url"}, "flag --url needs a value"},
		{[]string{"system", "version", "--active"}, "unknown flag --active"},
	} {
		_, err := parse(testGroups, tt.args)
		var ue *UsageError
		require.ErrorAs(t, err, &ue, "%v", tt.args)
		assert.EqualError(t, err, tt.msg, "%v", tt.args)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	for code, exit := range map[string]int{
		"INVALID_INPUT": 3, "UNAUTHENTICATED": 4, "ACCESS_DENIED": 4, "CONFIRMATION_REQUIRED": 4,
		"CSRF_REJECTED": 4, "UNTRUSTED_ORIGIN": 4, "NOT_FOUND": 5, "CONFLICT": 6, "INVALID_STATE": 6,
		"QUOTA_EXCEEDED": 6, "CAPACITY_UNAVAILABLE": 6, "CONFIG_DRIFT": 6, "RATE_LIMITED": 7,
		"UNAVAILABLE": 7, "NOT_IMPLEMENTED": 8, "UNSUPPORTED": 8, "INTERNAL_ERROR": 1,
		"INVALID_CONFIG": 1, "DRIVER_ERROR": 1, "PROVIDER_ERROR": 1, "METHOD_NOT_ALLOWED": 1, "SOMETHING_NEW": 1,
	} {
		assert.Equal(t, exit, ExitCode(code), code)
	}
}

// fakeAPI answers every POST with status and body and records requests.
type fakeAPI struct {
	status int
	body   string
	header http.Header

	mu       sync.Mutex
	path     string
	received string
	auth     string
	service  string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.path, f.received, f.auth, f.service = r.URL.Path, string(b), r.Header.Get("Authorization"), r.Header.Get("X-Service")
	f.mu.Unlock()
	for k, v := range f.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.status)
	_, _ = io.WriteString(w, f.body)
}

// versionGroups call system.version through the generated client, as
// gen/cli does, with flags to send.
var versionGroups = []Group{{Name: "system", Methods: []Method{{
	Name: "version",
	Flags: []Flag{
		{Name: "tenant-id", Field: "tenantId", Type: String},
		{Name: "limit", Field: "limit", Type: Int},
	},
	Call: func(ctx context.Context, c *client.Client) error {
		_, err := c.SystemVersion(ctx, new(client.SystemVersionInput))
		return err
	},
}}}}

const versionBody = `{"data":{"name":"cp","version":"1.2.3","basePath":"/x","agentProtocol":{"min":1,"max":2},"extra":"2026-01-02T03:04:05.678Z"}}`

func runFake(t *testing.T, f *fakeAPI, env map[string]string, stdin string, args ...string) (int, string, string) {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	full := map[string]string{EnvURL: srv.URL}
	for k, v := range env {
		full[k] = v
	}
	var out, errOut strings.Builder
	code := Run(t.Context(), versionGroups, args, func(k string) string { return full[k] },
		Streams{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

func TestRunSendsTheBuiltInputThroughTheGeneratedClient(t *testing.T) {
	t.Parallel()
	f := &fakeAPI{status: 200, body: versionBody}
	code, out, errOut := runFake(t, f, map[string]string{EnvToken: "tok", EnvTenant: "acme", EnvBasePath: "/base/"},
		`{"zzz": [1, 2], "limit": 3}`, "system", "version", "--input", "-", "--limit", "4", "--output", "json")
	require.Equal(t, 0, code, errOut)
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, "/base/system/version", f.path)
	// The body is the built input, not the typed input's encoding (which
	// would be {}): unknown fields reach the server.
	assert.Equal(t, `{"limit":4,"tenantId":"acme","zzz":[1,2]}`, f.received)
	assert.Equal(t, "Bearer tok", f.auth)
	assert.Equal(t, "1", f.service)
	// The data as the server wrote it: fields the client does not know,
	// milliseconds kept.
	assert.Equal(t, `{
  "name": "cp",
  "version": "1.2.3",
  "basePath": "/x",
  "agentProtocol": {
    "min": 1,
    "max": 2
  },
  "extra": "2026-01-02T03:04:05.678Z"
}
`, out)
}

func TestRunTable(t *testing.T) {
	t.Parallel()
	code, out, errOut := runFake(t, &fakeAPI{status: 200, body: versionBody}, nil, "", "system", "version")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, `name               cp
version            1.2.3
basePath           /x
agentProtocol.min  1
agentProtocol.max  2
extra              2026-01-02T03:04:05.678Z
`, out)
}

func TestRunAPIErrors(t *testing.T) {
	t.Parallel()
	f := &fakeAPI{status: 400, body: `{"error":{"code":"INVALID_INPUT","message":"zzz: unknown field","details":{
		"issues":[{"path":"zzz","message":"unknown field"},{"path":"","message":"trailing data"}],"limit":50}}}`}
	code, out, errOut := runFake(t, f, nil, "", "system", "version")
	assert.Equal(t, ExitInvalidInput, code)
	assert.Empty(t, out)
	// The first issue is the message: printed once.
	assert.Equal(t, "error: INVALID_INPUT (400): zzz: unknown field\n  (input): trailing data\n  limit: 50\n", errOut)

	f = &fakeAPI{status: 429, body: `{"error":{"code":"RATE_LIMITED","message":"slow down","retryAfterMs":250,"details":{"scope":{"b":1,"a":"x"}}}}`}
	code, _, errOut = runFake(t, f, nil, "", "system", "version")
	assert.Equal(t, ExitRetryable, code)
	assert.Equal(t, "error: RATE_LIMITED (429): slow down\n  retryAfterMs: 250\n  scope: {\"a\":\"x\",\"b\":1}\n", errOut)

	f = &fakeAPI{status: 501, body: `{"error":{"code":"NOT_IMPLEMENTED","message":"planned for v0.2"}}`}
	code, _, errOut = runFake(t, f, nil, "", "system", "version")
	assert.Equal(t, ExitUnsupported, code)
	assert.Equal(t, "error: NOT_IMPLEMENTED (501): planned for v0.2\n", errOut)

	// Not an envelope at all: exit 1.
	f = &fakeAPI{status: 502, body: `<html>bad gateway</html>`}
	code, _, errOut = runFake(t, f, nil, "", "system", "version")
	assert.Equal(t, ExitError, code)
	assert.True(t, strings.HasPrefix(errOut, "error: "), errOut)

	// A success the client cannot decode: exit 1.
	f = &fakeAPI{status: 200, body: `{"data":{"name":1}}`}
	code, _, errOut = runFake(t, f, nil, "", "system", "version")
	assert.Equal(t, ExitError, code)
	assert.Contains(t, errOut, "decode response")
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(block); srv.Close() })
	var out, errOut strings.Builder
	code := Run(t.Context(), versionGroups, []string{"system", "version", "--timeout", "50ms"},
		func(k string) string { return map[string]string{EnvURL: srv.URL}[k] }, Streams{Stdout: &out, Stderr: &errOut})
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: no answer within --timeout 50ms\n", errOut.String())
}

// docs/cli.md shows the exit code table: each row names its class's codes.
func TestDocsExitCodes(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/cli.md")
	require.NoError(t, err)
	rows := map[string]string{}
	for _, l := range strings.Split(string(doc), "\n") {
		if cells := strings.Split(l, "|"); len(cells) == 5 && len(strings.TrimSpace(cells[1])) == 1 {
			rows[strings.TrimSpace(cells[1])] = cells[3]
		}
	}
	require.Len(t, rows, len(ExitClasses))
	for _, c := range ExitClasses {
		row, ok := rows[strconv.Itoa(c.Exit)]
		require.True(t, ok, "exit %d", c.Exit)
		for _, code := range c.Codes {
			assert.Contains(t, row, code, "exit %d", c.Exit)
		}
	}
}
