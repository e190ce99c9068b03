package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/buildinfo"
	"computeplane/internal/cli"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/whsig"
)

func TestMain(m *testing.M) {
	// Profiles of the tests never touch the user's own.
	dir, err := os.MkdirTemp("", "computectl-test-")
	if err != nil {
		panic(err)
	}
	cli.ConfigPath = func() (string, error) { return filepath.Join(dir, "config.json"), nil }
	code := qemutest.Run(m) // fails when a VM a test booted outlives the tests
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func TestVersionFlag(t *testing.T) {
	r := cmd(t, nil, "", "--version")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "computectl "+buildinfo.Version()+"\n", r.stdout)
}

func TestDidYouMean(t *testing.T) {
	r := cmd(t, nil, "", "sitse", "list")
	assert.Equal(t, cli.ExitUsage, r.code)
	assert.Contains(t, r.stderr, "did you mean sites?")
	r = cmd(t, nil, "", "sites", "lsit")
	assert.Equal(t, cli.ExitUsage, r.code)
	assert.Contains(t, r.stderr, "did you mean sites list?")
	r = cmd(t, nil, "", "zzzzzzzzzz")
	assert.NotContains(t, r.stderr, "did you mean")
}

// The tenant comes from the key when neither --tenant-id nor
// SERVICE_TENANT names it; a create that needs an idempotency key and got
// none gets one, printed so the call can be retried.
func TestTenantFromTheKeyAndGeneratedIdempotencyKey(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"))
	r := cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	var site map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &site))
	assert.Equal(t, "acme", site["tenantId"])
	m := regexp.MustCompile(`idempotency key: (cli-[0-9a-f]{24}) \(pass --idempotency-key `).FindStringSubmatch(r.stderr)
	require.NotNil(t, m, r.stderr)
	again := cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", m[1], "--output", "json")
	require.Equal(t, 0, again.code, again.stderr)
	assert.Contains(t, again.stdout, site["siteId"].(string), "the printed key retries the same create")
	assert.NotContains(t, again.stderr, "idempotency key:")
}

func TestErrorsAsJSONWithTheRequestID(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "viewer"), cli.EnvTenant, "acme")
	r := cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", "k", "--output", "json")
	assert.Equal(t, cli.ExitAccess, r.code)
	var out struct {
		Error     map[string]any `json:"error"`
		RequestID string         `json:"requestId"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stderr), &out), r.stderr)
	assert.Equal(t, "ACCESS_DENIED", out.Error["code"])
	assert.Regexp(t, `^req_`, out.RequestID)
	r = cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", "k")
	assert.Contains(t, r.stderr, "requestId: req_", "the table output names it too")
}

func TestQuietPrintsIDs(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"), cli.EnvTenant, "acme")
	for _, k := range []string{"a", "b"} {
		r := cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", k)
		require.Equal(t, 0, r.code, r.stderr)
	}
	r := cmd(t, env, "", "-q", "sites", "list")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2)
	for _, l := range lines {
		assert.Regexp(t, `^site_[0-9a-hjkmnp-tv-z]{26}$`, l)
	}
}

// --cp-url is the service's URL whatever the command: webhooks create has
// a --url of its own.
func TestGlobalFlagsCannotBeShadowed(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"), cli.EnvTenant, "acme", cli.EnvURL, "http://127.0.0.1:1")
	r := cmd(t, env, "", "webhooks", "create", "--url", "https://hooks.example.com/x", "--events", `["site.created"]`, "--cp-url", e.URL)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "https://hooks.example.com/x", "the webhook's --url went to the webhook")
}

func TestLoginProfiles(t *testing.T) {
	e, env := server(t)
	token := e.Key(t, "acme", "ann", "owner")
	// A profiles file of this test's own: the other tests run beside it.
	path := filepath.Join(t.TempDir(), "config.json")
	own := map[string]string{cli.EnvConfig: path}
	r := cmd(t, own, "", "login", "--cp-url", e.URL, "--token", token, "--profile", "dev")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "as tenant acme")
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "it holds tokens")

	// No other environment: the current profile's URL, token and tenant.
	r = cmd(t, own, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", "p", "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"tenantId": "acme"`)
	// The environment still wins over the profile.
	r = cmd(t, with(env, cli.EnvToken, "not-a-key", cli.EnvConfig, path), "", "system", "whoami")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "false", rows(t, r.stdout)["authenticated"])
	r = cmd(t, own, "", "--profile", "nope", "system", "version")
	assert.Equal(t, cli.ExitUsage, r.code)
	assert.Contains(t, r.stderr, `no profile "nope"`)
	r = cmd(t, own, "", "login", "--cp-url", e.URL, "--token", "cpk_0123456789abcdef_0123456789abcdefghjkmnpqrstvwxyz", "--profile", "bad")
	assert.NotEqual(t, 0, r.code, "a key the service does not know is not saved")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var saved map[string]any
	require.NoError(t, json.Unmarshal(raw, &saved))
	assert.Len(t, saved["profiles"], 1)
}

func TestEventsTail(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"), cli.EnvTenant, "acme")
	for _, k := range []string{"a", "b"} {
		require.Equal(t, 0, cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", k).code)
	}
	r := cmd(t, env, "", "events", "tail", "--types", "site.*", "--max", "2")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2)
	for _, l := range lines {
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &ev), l)
		assert.Equal(t, "site.created", ev["type"])
		assert.Equal(t, "acme", ev["tenantid"])
	}
	r = cmd(t, env, "", "events", "tial")
	assert.Contains(t, r.stderr, "did you mean events tail?")
}

// webhooks listen relays the tenant's events to a local receiver, signed
// as webhook deliveries are: the receiver verifies them with the secret.
func TestWebhooksListen(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"), cli.EnvTenant, "acme")
	require.Equal(t, 0, cmd(t, env, "", "sites", "create", "--kind", "custom", "--region", "eu-west", "--idempotency-key", "a").code)
	secret, key, err := whsig.NewSecret()
	require.NoError(t, err)
	var mu sync.Mutex
	var got []string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := whsig.Verify(key, r.Header, body, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		mu.Lock()
		got = append(got, r.Header.Get("X-Service-Delivery"))
		mu.Unlock()
	}))
	defer recv.Close()
	r := cmd(t, env, "", "webhooks", "listen", "--forward-to", recv.URL, "--secret", secret, "--max", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "site.created evt_")
	assert.Contains(t, r.stdout, "-> 200")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	assert.Regexp(t, `^evt_`, got[0])

	// Without --secret a new one is made and printed.
	r = cmd(t, env, "", "webhooks", "listen", "--forward-to", recv.URL, "--max", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stderr, "signed with whsec_")
	assert.Contains(t, r.stdout, "-> 401", "signed with another secret than the receiver's")
}

// login is in the help, has its own, and a bare login without a terminal
// saves nothing (not the environment's token).
func TestLoginHelpAndBareLogin(t *testing.T) {
	e, env := server(t)
	r := cmd(t, env, "", "--help")
	assert.Regexp(t, `(?m)^  login\s+check an API key`, r.stdout)
	r = cmd(t, env, "", "login", "--help")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "computectl login --url URL --token TOKEN [--profile NAME]")
	path := filepath.Join(t.TempDir(), "config.json")
	r = cmd(t, with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"), cli.EnvConfig, path), "", "login")
	assert.Equal(t, cli.ExitUsage, r.code)
	assert.Contains(t, r.stderr, "login needs --token TOKEN")
	_, err := os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing saved")
}

// --wait takes a duration, nothing (30 s) or the JSON object; past 30 s is
// a usage error and nothing is sent.
func TestWaitForms(t *testing.T) {
	e, env := server(t)
	env = with(env, cli.EnvToken, e.Key(t, "acme", "ann", "owner"), cli.EnvTenant, "acme")
	r := cmd(t, env, "", "instances", "start", "--instance-id", "inst_0000000000000000000000000a", "--wait", "45s")
	assert.Equal(t, cli.ExitUsage, r.code)
	assert.Contains(t, r.stderr, "--wait 45s: the service waits at most 30s")
	for _, args := range [][]string{
		{"--wait"}, {"--wait", "2s"}, {"--wait", `{"timeoutMs": 100}`}, {"--wait=1s"},
	} {
		// Sent and answered (the instance does not exist): the flag parsed.
		r = cmd(t, env, "", append([]string{"instances", "start", "--instance-id", "inst_0000000000000000000000000a"}, args...)...)
		assert.Equal(t, cli.ExitNotFound, r.code, "%v: %s", args, r.stderr)
	}
	r = cmd(t, env, "", "instances", "start", "--wait", "--instance-id", "inst_0000000000000000000000000a")
	assert.Equal(t, cli.ExitNotFound, r.code, "--wait alone before another flag: %s", r.stderr)
	r = cmd(t, env, "", "instances", "start", "--instance-id", "inst_0000000000000000000000000a", "--wait", "soon")
	assert.Equal(t, cli.ExitUsage, r.code, "an argument that is not a wait is not taken as one")
}
