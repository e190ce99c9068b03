package main

// Tests of run, the process without the process: configuration errors come
// before any connection (interface specification, "Configuration
// options"), serve starts in the specification's order and shuts down on
// cancel ("Host startup and shutdown"), migrate applies the embedded
// migrations, and a database a newer build migrated is refused, naming the
// unknown migrations (Versioning, rule 7).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/buildinfo"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/gctarget"
	"computeplane/internal/host"
	"computeplane/internal/pki"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
	"computeplane/migrations"
)

type syncBuffer = testenv.SyncBuffer

func getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// fakeDatabase listens where a database URL points and counts the
// connections made to it; each is closed at once.
type fakeDatabase struct {
	url      string
	accepted atomic.Int64
}

func newFakeDatabase(t *testing.T) *fakeDatabase {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	f := &fakeDatabase{url: "postgres://nobody@" + ln.Addr().String() + "/x?sslmode=disable&connect_timeout=5"}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			_ = c.Close()
		}
	}()
	return f
}

func TestInvalidConfigBeforeAnyConnection(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		env    map[string]string
		file   string // SERVICE_CONFIG content, when set
		option string
	}{
		{name: "secret too short", env: map[string]string{"SERVICE_SECRET": "too-short"}, option: "secret"},
		{name: "secret missing", env: map[string]string{"SERVICE_SECRET": ""}, option: "secret"},
		{name: "baseURL with query", env: map[string]string{"SERVICE_BASE_URL": "https://compute.example.com/?x=1"}, option: "baseURL"},
		{name: "baseURL with credentials", env: map[string]string{"SERVICE_BASE_URL": "https://u:p@compute.example.com"}, option: "baseURL"},
		{name: "unknown key in file", file: "database: postgres://x@127.0.0.1:1/x\nbogusOption: 1\n", option: "bogusOption"},
		{name: "basePath trailing slash", file: "basePath: /api/compute/\n", option: "basePath"},
		{name: "trustedProxies bad entry", file: "trustedProxies:\n  - 10.0.0.0/8\n  - not-an-address\n", option: "trustedProxies[1]"},
		{name: "capacity.maxBatch 65", file: "capacity:\n  maxBatch: 65\n", option: "capacity.maxBatch"},
		{name: "metrics token too short", env: map[string]string{"SERVICE_METRICS_TOKEN": "fifteen-chars.."}, option: "metrics.token"},
		{name: "gateway url not https", env: map[string]string{"SERVICE_GATEWAY_URL": "http://gw.example.com"}, option: "gateway.url"},
		{name: "unknown role", env: map[string]string{"SERVICE_ROLES": "api,web"}, option: "roles"},
		{name: "port not a number", env: map[string]string{"PORT": "http"}, option: "port"},
		{name: "config file missing", env: map[string]string{"SERVICE_CONFIG": "/nonexistent/computed.yaml"}, option: "SERVICE_CONFIG"},
	}
	// Options this build parses but does not implement are refused, never
	// accepted and ignored; so is a driver it does not have (serve only).
	serveOnly := []struct {
		name, file, option string
	}{
		{"downloads from a blob store not built", "downloads: {blob: \"s3://releases/downloads\"}\n", "downloads.blob"},
		{"downloads directory missing", "downloads: {dir: /nonexistent/downloads}\n", "downloads.dir"},
		{"plugin executable missing", "plugins: [{id: example, path: /nonexistent/example, sha256: '" + strings.Repeat("0", 64) + "'}]\n", "plugins[0].path"},
		{"plugin not built in", "plugins: [{id: billing, path: /nonexistent/billing, sha256: '" + strings.Repeat("0", 64) + "'}]\n", "plugins[0].id"},
		{"attestor not built in", "attestors: [aws-iid]\n", "attestors[0]"},
		{"tpm attestor without enrolled keys", "attestors: [tpm]\n", "tpm.endorsementKeys"},
		{"driver not built in", "drivers: [redfish, ipmi]\n", "drivers[1]"},
	}
	for _, tc := range serveOnly {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := newFakeDatabase(t)
			env := map[string]string{
				"SERVICE_DATABASE_URL": db.url, "SERVICE_SECRET": testenv.TestSecret, "HOST": "127.0.0.1",
				"PORT": strconv.Itoa(testenv.FreePort(t)), "SERVICE_CONFIG": testenv.ConfigFile(t, tc.file),
			}
			var stdout, stderr syncBuffer
			assert.Equal(t, 2, run(t.Context(), []string{"serve"}, getenv(env), &stdout, &stderr))
			assert.Contains(t, stderr.String(), "INVALID_CONFIG: "+tc.option+": ")
			assert.Zero(t, db.accepted.Load(), "no connection is opened")
		})
	}
	for _, tc := range cases {
		for _, cmd := range []string{"serve", "migrate"} {
			t.Run(tc.name+"/"+cmd, func(t *testing.T) {
				t.Parallel()
				db := newFakeDatabase(t)
				env := map[string]string{
					"SERVICE_DATABASE_URL": db.url,
					"SERVICE_SECRET":       testenv.TestSecret,
					"HOST":                 "127.0.0.1",
					"PORT":                 strconv.Itoa(testenv.FreePort(t)),
				}
				if tc.file != "" {
					env["SERVICE_CONFIG"] = testenv.ConfigFile(t, tc.file)
				}
				for k, v := range tc.env {
					env[k] = v
				}
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				var stdout, stderr syncBuffer
				code := run(ctx, []string{cmd}, getenv(env), &stdout, &stderr)
				assert.Equal(t, 2, code)
				assert.Empty(t, stdout.String())
				assert.Contains(t, stderr.String(), "INVALID_CONFIG: "+tc.option+": ")
				assert.NotContains(t, stderr.String(), "connect")
				assert.Zero(t, db.accepted.Load(), "no connection is opened")
			})
		}
	}
}

// The probe above sees a connection when there is one.
func TestValidConfigConnects(t *testing.T) {
	t.Parallel()
	db := newFakeDatabase(t)
	env := map[string]string{
		"SERVICE_DATABASE_URL": db.url,
		"SERVICE_SECRET":       testenv.TestSecret,
		"HOST":                 "127.0.0.1",
		"PORT":                 strconv.Itoa(testenv.FreePort(t)),
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var stdout, stderr syncBuffer
	assert.Equal(t, 1, run(ctx, nil, getenv(env), &stdout, &stderr), stderr.String())
	assert.Positive(t, db.accepted.Load())
	assert.NotContains(t, stderr.String(), "INVALID_CONFIG")
	assert.Contains(t, stderr.String(), "startup failed")
	assert.NotContains(t, stderr.String(), db.url, "the database URL is not logged")
}

// computed config check lists every problem of a file, each with its
// option path, offline; serve refuses the same file with the same list.
func TestConfigCheckListsEveryProblem(t *testing.T) {
	t.Parallel()
	db := newFakeDatabase(t)
	env := map[string]string{"SERVICE_DATABASE_URL": db.url, "SERVICE_SECRET": testenv.TestSecret,
		"HOST": "127.0.0.1", "PORT": strconv.Itoa(testenv.FreePort(t))}
	file := testenv.ConfigFile(t, `
bogusOption: 1
basePath: /api/compute/
capacity: {maxBatch: 65, placer: fastest}
trustedProxies: [10.0.0.0/8, not-an-address, 192.168.0.300]
sinks:
  events:
    - {id: ok, kind: http, url: "https://sink.example.com/e"}
    - {id: bad, kind: carrier-pigeon}
workers: {batchSize: 0, concurrency: "four"}
downloads: {dir: /nonexistent/downloads}
drivers: [redfish, ipmi]
metrics: {token: short}
`)
	want := []string{
		"INVALID_CONFIG: bogusOption: unknown option",
		"INVALID_CONFIG: workers.concurrency: must be an integer",
		"INVALID_CONFIG: basePath: must not end with /",
		"INVALID_CONFIG: drivers[1]: driver \"ipmi\" is not built into this binary",
		"INVALID_CONFIG: sinks.events[1].kind: must be http or file",
		"INVALID_CONFIG: trustedProxies[1]: must be an IPv4 or IPv6 address",
		"INVALID_CONFIG: trustedProxies[2]: must be an IPv4 or IPv6 address",
		"INVALID_CONFIG: capacity.placer: must be inline or pool-lease",
		"INVALID_CONFIG: capacity.maxBatch: must be from 1 to 64",
		"INVALID_CONFIG: workers.batchSize: must be from 1 to 1000",
		"INVALID_CONFIG: metrics.token: must be at least 16 characters",
		"INVALID_CONFIG: downloads.dir: stat /nonexistent/downloads: no such file or directory",
	}
	var stdout, stderr syncBuffer
	assert.Equal(t, 1, run(t.Context(), []string{"config", "check", file}, getenv(env), &stdout, &stderr), stderr.String())
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	for _, w := range want {
		assert.True(t, slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }), "missing %q in\n%s", w, stdout.String())
	}
	assert.Len(t, lines, len(want), "one line a problem:\n%s", stdout.String())
	assert.Contains(t, stderr.String(), fmt.Sprintf("%s: %d problem(s)", file, len(want)))

	// serve refuses the same file with the same problems, before any
	// connection.
	env["SERVICE_CONFIG"] = file
	var serveOut, serveErr syncBuffer
	assert.Equal(t, 2, run(t.Context(), []string{"serve"}, getenv(env), &serveOut, &serveErr))
	assert.Equal(t, strings.TrimSpace(stdout.String()), strings.TrimSpace(serveErr.String()))
	assert.Zero(t, db.accepted.Load(), "no connection is opened")

	// A good file is ok; without the environment it lacks database and
	// secret.
	good := testenv.ConfigFile(t, "capacity: {maxBatch: 8}\n")
	stdout, stderr = syncBuffer{}, syncBuffer{}
	assert.Equal(t, 0, run(t.Context(), []string{"config", "check", good}, getenv(env), &stdout, &stderr), stdout.String()+stderr.String())
	assert.Equal(t, good+": ok\n", stdout.String())
	stdout, stderr = syncBuffer{}, syncBuffer{}
	assert.Equal(t, 1, run(t.Context(), []string{"config", "check", "--no-env", good}, getenv(env), &stdout, &stderr))
	assert.Contains(t, stdout.String(), "INVALID_CONFIG: database: is required")
	assert.Contains(t, stdout.String(), "INVALID_CONFIG: secret: is required")
	assert.Zero(t, db.accepted.Load())

	assert.Equal(t, 2, run(t.Context(), []string{"config", "check"}, getenv(env), &stdout, &stderr), "usage")
}

func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	db := newFakeDatabase(t)
	env := map[string]string{"SERVICE_DATABASE_URL": db.url, "SERVICE_SECRET": testenv.TestSecret}
	var stdout, stderr syncBuffer
	assert.Equal(t, 2, run(t.Context(), []string{"bogus"}, getenv(env), &stdout, &stderr))
	assert.Contains(t, stderr.String(), "usage: computed")
	assert.Zero(t, db.accepted.Load())
}

func TestVersion(t *testing.T) {
	t.Parallel()
	var stdout, stderr syncBuffer
	// No configuration is needed to print the version.
	code := run(t.Context(), []string{"version"}, getenv(nil), &stdout, &stderr)
	assert.Equal(t, 0, code)
	assert.Equal(t, buildinfo.Version()+"\n", stdout.String())
	assert.NotEmpty(t, strings.TrimSpace(stdout.String()))
	assert.Empty(t, stderr.String())
}

type process struct {
	addr   string
	cancel context.CancelFunc
	done   chan int
	stdout *syncBuffer
	stderr *syncBuffer
}

// start runs `computed serve` (no args) on a free port until the test ends.
func start(t *testing.T, env map[string]string) *process {
	t.Helper()
	port := testenv.FreePort(t)
	env["HOST"] = "127.0.0.1"
	env["PORT"] = strconv.Itoa(port)
	if env["SERVICE_SECRET"] == "" {
		env["SERVICE_SECRET"] = testenv.TestSecret
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &process{
		addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cancel: cancel, done: make(chan int, 1), stdout: &syncBuffer{}, stderr: &syncBuffer{},
	}
	go func() { p.done <- run(ctx, nil, getenv(env), p.stdout, p.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-p.done:
			p.done <- code
		case <-time.After(10 * time.Second):
			t.Error("run did not return after cancel")
		}
	})
	return p
}

func (p *process) get(path string) (int, []byte, error) {
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + p.addr + path)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func (p *process) waitHealthy(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case code := <-p.done:
			p.done <- code
			t.Fatalf("run returned %d before serving: %s", code, p.stderr.String())
		default:
		}
		status, _, err := p.get("/healthz")
		return err == nil && status == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "GET /healthz answers 200")
}

func (p *process) stop(t *testing.T) int {
	t.Helper()
	p.cancel()
	select {
	case code := <-p.done:
		p.done <- code
		return code
	case <-time.After(host.ShutdownGrace + 5*time.Second):
		t.Fatal("run did not return after cancel")
		return -1
	}
}

func TestServeAnswersAndShutsDown(t *testing.T) {
	t.Parallel()
	p := start(t, map[string]string{"SERVICE_DATABASE_URL": dbtest.URL(t)})
	p.waitHealthy(t)

	status, body, err := p.get("/healthz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.JSONEq(t, `{"ok":true}`, string(body))
	status, body, err = p.get("/readyz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.JSONEq(t, `{"ok":true}`, string(body))
	status, body, err = p.get("/.well-known/service")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(body, &doc))
	assert.Equal(t, buildinfo.Version(), doc["version"])

	start := time.Now()
	assert.Equal(t, 0, p.stop(t), p.stderr.String())
	assert.Less(t, time.Since(start), host.ShutdownGrace+time.Second)
	_, err = net.DialTimeout("tcp", p.addr, time.Second)
	assert.Error(t, err, "the listener is closed")
	assert.NotContains(t, p.stderr.String(), `"level":"ERROR"`)
}

// serve migrates an empty database before it listens.
func TestServeMigratesAtStartup(t *testing.T) {
	t.Parallel()
	u := dbtest.EmptyURL(t)
	p := start(t, map[string]string{"SERVICE_DATABASE_URL": u})
	p.waitHealthy(t)
	assert.Equal(t, embeddedVersions(t), applied(t, u))
	assert.Equal(t, 0, p.stop(t), p.stderr.String())
}

// SERVICE_SKIP_MIGRATIONS=1 serves without migrating.
func TestServeSkipsMigrations(t *testing.T) {
	t.Parallel()
	// Migrated by another process: serve starts without migrating.
	p := start(t, map[string]string{"SERVICE_DATABASE_URL": dbtest.URL(t), "SERVICE_SKIP_MIGRATIONS": "1"})
	p.waitHealthy(t)
	assert.Equal(t, 0, p.stop(t), p.stderr.String())

	// An empty database stays empty: startup fails instead of migrating.
	u := dbtest.EmptyURL(t)
	env := map[string]string{"SERVICE_DATABASE_URL": u, "SERVICE_SKIP_MIGRATIONS": "1", "SERVICE_SECRET": testenv.TestSecret,
		"HOST": "127.0.0.1", "PORT": strconv.Itoa(testenv.FreePort(t))}
	var stdout, stderr syncBuffer
	assert.Equal(t, 1, run(t.Context(), nil, getenv(env), &stdout, &stderr))
	assert.Empty(t, applied(t, u))
}

// A fresh install prints one root admin key, once; the key authenticates.
func TestServePrintsRootAdminKeyOnce(t *testing.T) {
	t.Parallel()
	u := dbtest.URL(t)
	p := start(t, map[string]string{"SERVICE_DATABASE_URL": u})
	p.waitHealthy(t)
	out := p.stdout.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	assert.Regexp(t, `^cpk_[0-9a-hjkmnp-tv-z]{16}_[0-9a-hjkmnp-tv-z]{32}$`, token)
	assert.Contains(t, out, "/api/compute/docs", "the banner names the reference")
	_, port, _ := net.SplitHostPort(p.addr)
	assert.Contains(t, out, "export SERVICE_URL=http://localhost:"+port+" SERVICE_TOKEN="+token+" SERVICE_TENANT=root",
		"ready to paste; the URL follows PORT")
	assert.Equal(t, 0, p.stop(t), p.stderr.String())

	again := start(t, map[string]string{"SERVICE_DATABASE_URL": u})
	again.waitHealthy(t)
	assert.NotContains(t, again.stdout.String(), "cpk_", "the key is printed only on the first start")
	assert.Contains(t, again.stdout.String(), "/api/compute/docs")
	assert.Equal(t, 0, again.stop(t), again.stderr.String())
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	u := dbtest.EmptyURL(t)
	require.Empty(t, applied(t, u))
	env := map[string]string{"SERVICE_DATABASE_URL": u, "SERVICE_SECRET": testenv.TestSecret}
	var stdout, stderr syncBuffer
	require.Equal(t, 0, run(t.Context(), []string{"migrate"}, getenv(env), &stdout, &stderr), stderr.String())
	assert.Equal(t, embeddedVersions(t), applied(t, u))
	assert.Empty(t, stdout.String())

	// A second run finds nothing to do.
	require.Equal(t, 0, run(t.Context(), []string{"migrate"}, getenv(env), &stdout, &stderr), stderr.String())
	assert.Equal(t, embeddedVersions(t), applied(t, u))
	assert.NotContains(t, stderr.String(), `"level":"ERROR"`)
}

// A database holding a migration this build does not know (a newer build
// migrated it) is refused by serve and migrate, naming the migration.
func TestUnknownAppliedMigrationIsRefused(t *testing.T) {
	t.Parallel()
	u := dbtest.URL(t)
	conn, err := pgx.Connect(t.Context(), u)
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), "INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, true)")
	require.NoError(t, err)
	require.NoError(t, conn.Close(t.Context()))

	port := testenv.FreePort(t)
	env := map[string]string{
		"SERVICE_DATABASE_URL": u,
		"SERVICE_SECRET":       testenv.TestSecret,
		"HOST":                 "127.0.0.1",
		"PORT":                 strconv.Itoa(port),
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var stdout, stderr syncBuffer
	code := run(ctx, nil, getenv(env), &stdout, &stderr)
	require.Equal(t, 1, code, "serve: %s", stderr.String())
	line := errorLine(t, stderr.String(), "startup failed")
	assert.Contains(t, line, "99999")
	_, err = net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	assert.Error(t, err, "nothing listens")

	var migrateErr syncBuffer
	code = run(ctx, []string{"migrate"}, getenv(env), &stdout, &migrateErr)
	require.Equal(t, 1, code, "migrate: %s", migrateErr.String())
	assert.Contains(t, errorLine(t, migrateErr.String(), "migrate failed"), "99999")

	// Nothing was applied or removed.
	assert.Equal(t, append(embeddedVersions(t), 99999), applied(t, u))
}

// errorLine returns the JSON log line at level ERROR whose msg is msg.
func errorLine(t *testing.T, logs, msg string) string {
	t.Helper()
	for _, l := range strings.Split(logs, "\n") {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Level == "ERROR" && rec.Msg == msg {
			return l
		}
	}
	t.Fatalf("no ERROR line %q in:\n%s", msg, logs)
	return ""
}

// embeddedVersions lists the versions of the embedded migrations, ascending.
func embeddedVersions(t *testing.T) []int64 {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	out := make([]int64, 0, len(names))
	for _, n := range names {
		num, _, ok := strings.Cut(n, "_")
		require.True(t, ok, n)
		v, err := strconv.ParseInt(num, 10, 64)
		require.NoError(t, err, n)
		out = append(out, v)
	}
	return out
}

func applied(t *testing.T, u string) []int64 {
	t.Helper()
	st, err := store.Open(t.Context(), u)
	require.NoError(t, err)
	defer st.Close()
	v, err := st.AppliedMigrations(t.Context())
	require.NoError(t, err)
	return v
}

// computed nodes register enters a node with a declared capacity in a pool
// and prints it; a missing pool is refused with exit code 1.
func TestNodesRegister(t *testing.T) {
	t.Parallel()
	u := dbtest.URL(t)
	env := map[string]string{"SERVICE_DATABASE_URL": u, "SERVICE_SECRET": testenv.TestSecret}
	conn, err := pgx.Connect(t.Context(), u)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), `insert into sites (site_id, tenant_id, kind, region, created_by, idem_request)
		values ('site_0000000000000000000000000a', 'acme', 'custom', 'eu-west', 'ops', '{}');
		insert into pools (pool_id, tenant_id, site_id, name, class, hosting, runtime, agent, created_by, idem_request)
		values ('pool_0000000000000000000000000a', 'acme', 'site_0000000000000000000000000a', 'p', 'vps-host', 'hosted', 'qemu', 'node-daemon', 'ops', '{}')`)
	require.NoError(t, err)

	var stdout, stderr syncBuffer
	code := run(t.Context(), []string{"nodes", "register", "--pool", "pool_0000000000000000000000000a", "--hostname", "h1",
		"--vcpu", "8", "--memory-mib", "16384", "--gpu", "L4:1", "--label", "rack=r1"}, getenv(env), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var printed map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout.String()), &printed))
	assert.Equal(t, "ready", printed["state"])
	assert.Equal(t, "acme", printed["tenantId"])
	assert.Equal(t, true, printed["declared"])
	var owner string
	require.NoError(t, conn.QueryRow(t.Context(), `select tenant_id from iam.resources where id = $1`, printed["nodeId"]).Scan(&owner))
	assert.Equal(t, "acme", owner, "the node is in the authorization projection, owned by the pool's tenant")

	var refusal syncBuffer
	assert.Equal(t, 1, run(t.Context(), []string{"nodes", "register", "--pool", "pool_0000000000000000000000000z", "--hostname", "h2"},
		getenv(env), &stdout, &refusal))
	assert.Contains(t, refusal.String(), "not found")
	assert.Equal(t, 2, run(t.Context(), []string{"nodes", "bogus"}, getenv(env), &stdout, &stderr))
}

func TestPKIInit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pki.json")
	env := map[string]string{"SERVICE_DATABASE_URL": "postgres://unused", "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": path}
	var stdout, stderr syncBuffer
	require.Equal(t, 0, run(t.Context(), []string{"pki", "init", "--trust-domain", "example.org"}, getenv(env), &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), "wrote a new PKI bundle to "+path+" (trust domain example.org, version 1")
	var again syncBuffer
	require.Equal(t, 0, run(t.Context(), []string{"pki", "init"}, getenv(env), &again, &stderr), stderr.String())
	assert.Contains(t, again.String(), "kept the PKI bundle in "+path+" (trust domain example.org")
	env["SERVICE_SECRET"] = testenv.TestSecret + "-other"
	assert.Equal(t, 1, run(t.Context(), []string{"pki", "init"}, getenv(env), &again, &stderr), "another secret does not open it")
	assert.Equal(t, 2, run(t.Context(), []string{"pki", "rotate"}, getenv(env), &again, &stderr))
}

// A busy port stops the process before it prints anything, naming what
// moves the listener; the root admin key of a first start is made only
// once every listener is bound, so the next start still prints it.
func TestBusyPortNamesItsOption(t *testing.T) {
	t.Parallel()
	pkiFile := filepath.Join(t.TempDir(), "pki.json")
	_, _, err := pki.Init(pkiFile, testenv.TestSecret, "test.local")
	require.NoError(t, err)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	_, busyPort, _ := net.SplitHostPort(busy.Addr().String())
	dbURL := dbtest.URL(t)
	gwPort := strconv.Itoa(testenv.FreePort(t))
	gwConfig := testenv.ConfigFile(t, "gateway: {url: 'https://localhost:"+gwPort+"', region: local}\n")

	serve := func(env map[string]string) (int, string, string) {
		env["SERVICE_DATABASE_URL"] = dbURL
		env["SERVICE_SECRET"] = testenv.TestSecret
		env["SERVICE_PKI"] = pkiFile
		env["HOST"] = "127.0.0.1"
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var stdout, stderr syncBuffer
		return run(ctx, nil, getenv(env), &stdout, &stderr), stdout.String(), stderr.String()
	}

	code, stdout, stderr := serve(map[string]string{"PORT": busyPort})
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout, "no banner and no key before every listener is bound")
	assert.Contains(t, stderr, "address already in use")
	assert.Contains(t, stderr, "PORT and HOST move it")

	code, stdout, stderr = serve(map[string]string{
		"PORT":                   strconv.Itoa(testenv.FreePort(t)),
		"SERVICE_CONFIG":         gwConfig,
		"SERVICE_GATEWAY_LISTEN": "127.0.0.1:" + busyPort,
	})
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "gateway.listen or SERVICE_GATEWAY_LISTEN moves it")

	// Moved by the environment, the gateway serves there, and the key of
	// this first successful start is printed.
	port := strconv.Itoa(testenv.FreePort(t))
	ctx, cancel := context.WithCancel(t.Context())
	var out, errs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, nil, getenv(map[string]string{
			"SERVICE_DATABASE_URL": dbURL, "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": pkiFile,
			"HOST": "127.0.0.1", "PORT": port,
			"SERVICE_CONFIG": gwConfig, "SERVICE_GATEWAY_LISTEN": "127.0.0.1:" + gwPort,
		}), &out, &errs)
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "Root admin API key") }, 30*time.Second, 20*time.Millisecond, errs.String())
	for _, addr := range []string{"127.0.0.1:" + port, "127.0.0.1:" + gwPort} {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		require.NoError(t, err, "%s is bound when the banner is printed", addr)
		_ = c.Close()
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errs.String())
	case <-time.After(host.ShutdownGrace + 10*time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// The collector's target follows the roles: lowered on a gateway-only
// process, raised on an api process without the gateway, left alone on
// the rest and whenever GOGC is set. Only the gateway-only process runs
// the storm policy.
func TestProcessGCFollowsRoles(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		roles []config.Role
		gogc  string
		want  int
		storm bool
	}{
		{[]config.Role{config.RoleAPI}, "", APIGCPercent, false},
		{[]config.Role{config.RoleAPI, config.RoleIAM}, "", APIGCPercent, false},
		{[]config.Role{config.RoleGateway}, "", GatewayGCPercent, true},
		{[]config.Role{config.RoleAPI, config.RoleGateway}, "", 100, false},
		{[]config.Role{config.RoleControllers}, "", 100, false},
		{[]config.Role{config.RoleAPI}, "150", 100, false},
		{[]config.Role{config.RoleGateway}, "150", 100, false},
	} {
		debug.SetGCPercent(100)
		ctx, cancel := context.WithCancel(context.Background())
		storm := processGC(ctx, &config.Config{Roles: tc.roles}, gogcEnv(tc.gogc), func() int64 { return 0 }, quiet)
		assert.Equal(t, tc.want, gcPercent(), "roles %v, GOGC %q", tc.roles, tc.gogc)
		assert.Equal(t, tc.storm, storm, "roles %v, GOGC %q: the storm policy", tc.roles, tc.gogc)
		cancel()
	}
}

// A gateway-only process raises its collector target while handshakes
// come at a storm's rate and lowers it again after.
func TestGatewayOnlyProcessRaisesItsTargetInAHandshakeStorm(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handshakes atomic.Int64
	require.True(t, processGC(ctx, &config.Config{Roles: []config.Role{config.RoleGateway}}, gogcEnv(""), handshakes.Load, quiet))
	require.Equal(t, GatewayGCPercent, gcPercent())
	require.Eventually(t, func() bool {
		handshakes.Add(100) // 10,000 a second
		return gcPercent() == gctarget.StormPercent
	}, 10*time.Second, 10*time.Millisecond, "the storm's target")
	require.Eventually(t, func() bool { return gcPercent() == GatewayGCPercent },
		gctarget.QuietFor+5*time.Second, 50*time.Millisecond, "the idle target back after the storm")
}

func gogcEnv(gogc string) func(string) string {
	return func(k string) string {
		if k == "GOGC" {
			return gogc
		}
		return ""
	}
}

// gcPercent reads the collector's target without setting it.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
