package config

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testSecret = "0123456789abcdef0123456789abcdef"
	testDB     = "postgres://app:hunter2@db.internal:5432/compute?sslmode=require"
)

// run loads with a minimal valid environment (database and secret), the
// given overrides, and file as the SERVICE_CONFIG file when non-empty.
func run(file string, env map[string]string) (*Config, error) {
	vars := map[string]string{EnvDatabaseURL: testDB, EnvSecret: testSecret}
	for k, v := range env {
		vars[k] = v
	}
	if file != "" && vars[EnvConfig] == "" {
		vars[EnvConfig] = "service.yaml"
	}
	read := func(name string) ([]byte, error) {
		if name != "service.yaml" {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		return []byte(file), nil
	}
	return load(func(k string) string { return vars[k] }, read)
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	err := error(&Error{Option: "capacity.maxBatch", Message: "must be from 1 to 64"})
	require.EqualError(t, err, "INVALID_CONFIG: capacity.maxBatch: must be from 1 to 64")
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := run("", nil)
	require.NoError(t, err)
	want := &Config{
		Database:     testDB,
		Secret:       testSecret,
		BaseURL:      "http://localhost:3000",
		IAM:          IAM{Kind: IAMEmbedded},
		RootTenantID: "root",
		BasePath:     "/api/compute",
		TypePrefix:   "compute-",
		PKI:          PKI{TrustVersion: 1},
		PKIFile:      ".service/pki.json",
		Secrets:      Secrets{Store: SecretStoreDatabase},
		Webhooks:     Webhooks{MaxPerTenant: 20},
		Capacity: Capacity{
			Placer: PlacerInline, MaxBatch: 64, MaxAttempts: 3,
			RollupEvery: 5 * time.Minute, UsageEvery: 5 * time.Minute, SpotNoticeMs: 120000,
		},
		Admission: Admission{MaxInFlight: AutoInFlight, MinInFlight: AutoInFlight, AcquireTarget: 5 * time.Millisecond, MaxConnections: DefaultMaxConnections},
		Scheduler: Scheduler{TopN: 5},
		Clock:     ClockDatabase,
		Log:       Log{Level: "warn"},
		Workers:   Workers{BatchSize: 32, Concurrency: 4, PollMs: 1000, ClaimTTLMs: 60000, ResyncMs: 300000},
		Metrics:   Metrics{Path: "/metrics"},
		Host:      "0.0.0.0",
		Port:      3000,
		Roles:     []Role{RoleAPI, RoleControllers, RoleScheduler, RoleSinks, RoleIAM},
	}
	require.Equal(t, want, c)
	require.True(t, c.HasRole(RoleAPI))
	require.False(t, c.HasRole(RoleGateway))
}

const fullYAML = `
database: postgres://file@db/compute
secret: file-secret-file-secret-file-secret-00
baseURL: https://compute.example.com/
iam:
  kind: embedded
  rootTenantId: platform
  events:
    path: /hooks/iam
    secret: iam-events-secret-iam-events-secret-0
rootTenantId: platform
basePath: /compute
typePrefix: cp-
modules: [billing-export]
plugins:
  - {id: gpuburn, path: /opt/plugins/gpuburn, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}
  - {id: firmware, path: /opt/plugins/firmware, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, dataDir: /var/lib/firmware}
drivers: [ipmi, redfish]
providers: [hetzner]
attestors: [tpm]
tpm:
  endorsementKeys: [AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA]
tunnels:
  issuer: https://compute.example.com
  ssh: true
  sshRequiresMfa: false
  sshAccounts: [root, ops]
  previewDomain: '*.preview.example.com'
  limits: {tunnelsPerMinute: 30, sshCertificatesPerHour: 5, openPerNode: 8, openPerGateway: 100, idleTimeoutMs: 60000}
pki:
  nodeCa: {certFile: /etc/cp/node-ca.pem, keyFile: /etc/cp/node-ca.key}
  servingCa:
    cert: |
      -----BEGIN CERTIFICATE-----
      MIIB
      -----END CERTIFICATE-----
    keyFile: /etc/cp/serving.key
  join: {keyFile: /etc/cp/join.key}
  commandSigning: {keyFile: /etc/cp/cmd.key}
  commandSigningRoots:
    - file: /etc/cp/cmd-root.pem
  trustVersion: 3
notifier: {kind: postgres}
sinks:
  events:
    - {id: siem, kind: http, url: "https://siem.example.com/ingest?src=cp"}
  audit:
    - {id: siem, kind: file, path: /var/log/cp/audit.jsonl}
acceptIamCookie: true
trustedProxies: [10.0.0.0/8, 192.168.1.7, "2001:db8::/32", "::1", 10.1.2.3/8]
gateway:
  url: https://gw.example.com:8443
  serverName: gw.example.com
  region: eu-west
downloads: {dir: /srv/downloads, blob: "s3://bucket/downloads"}
supportBundles: {blob: "s3://bucket/bundles", maxBytes: 1048576}
secrets: {store: none}
webhooks: {allowPrivateTargets: true, maxPerTenant: 50, acceptAnyPattern: true}
capacity:
  placer: pool-lease
  maxBatch: 16
  maxAttempts: 5
  rollupEvery: 1m
  usageEvery: 10m
  spotNoticeMs: 30000
shutdown: {unreadyMs: 3000}
admission: {maxInFlight: 48, adaptive: true, minInFlight: 12, acquireTargetMs: 3, slotWaitMs: 20, maxQueueMs: 80, queueTargetMs: 5, queueIntervalMs: 200, tenantRate: 200, tenantBurst: 400, tenants: {bigco: {rate: 1000}, tiny: {rate: 1, burst: 1}}, globalRate: 5000, maxConnections: 500}
scheduler:
  plugins: [gpu-affinity]
  weights: {pack: 1, spread: 0.5}
  topN: 3
clock: system
log: {level: debug}
workers:
  id: worker-1.eu:a
  batchSize: 100
  concurrency: 8
  pollMs: 500
  claimTtlMs: 30000
  resyncMs: 60000
metrics: {token: metrics-token-0123456789, path: /internal/metrics}
host: 127.0.0.1
port: 8080
roles: [sinks, api, gateway]
`

func TestFullFile(t *testing.T) {
	t.Parallel()
	// Only the file: clear what run sets in the environment.
	c, err := run(fullYAML, map[string]string{EnvDatabaseURL: "", EnvSecret: ""})
	require.NoError(t, err)
	want := &Config{
		Database: "postgres://file@db/compute",
		Secret:   "file-secret-file-secret-file-secret-00",
		BaseURL:  "https://compute.example.com",
		IAM: IAM{Kind: IAMEmbedded, RootTenantID: "platform", Events: &IAMEvents{
			Path: "/hooks/iam", Secret: "iam-events-secret-iam-events-secret-0",
		}},
		RootTenantID: "platform",
		BasePath:     "/compute",
		TypePrefix:   "cp-",
		Modules:      []string{"billing-export"},
		Plugins: []Plugin{
			{ID: "gpuburn", Path: "/opt/plugins/gpuburn", SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", DataDir: ".service/plugins/gpuburn"},
			{ID: "firmware", Path: "/opt/plugins/firmware", SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", DataDir: "/var/lib/firmware"},
		},
		Drivers:   []string{"ipmi", "redfish"},
		Providers: []string{"hetzner"},
		Attestors: []string{"tpm"},
		TPM:       &TPM{EndorsementKeys: []string{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}},
		Tunnels: &Tunnels{
			Issuer: "https://compute.example.com", SSH: true, SSHRequiresMFA: false,
			SSHAccounts: []string{"root", "ops"}, PreviewDomain: "preview.example.com",
			Limits: TunnelLimits{TunnelsPerMinute: 30, SSHCertificatesPerHour: 5, OpenPerNode: 8, OpenPerGateway: 100,
				IdleTimeout: time.Minute},
		},
		PKI: PKI{
			NodeCA: &KeyPair{Cert: PEM{File: "/etc/cp/node-ca.pem"}, Key: PEM{File: "/etc/cp/node-ca.key"}},
			ServingCA: &KeyPair{
				Cert: PEM{Inline: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"},
				Key:  PEM{File: "/etc/cp/serving.key"},
			},
			Join:                &KeyPair{Key: PEM{File: "/etc/cp/join.key"}},
			CommandSigning:      &KeyPair{Key: PEM{File: "/etc/cp/cmd.key"}},
			CommandSigningRoots: []PEM{{File: "/etc/cp/cmd-root.pem"}},
			TrustVersion:        3,
		},
		PKIFile:  ".service/pki.json",
		Notifier: &Notifier{Kind: NotifierPostgres},
		Sinks: Sinks{
			Events: []Sink{{ID: "siem", Kind: SinkHTTP, URL: "https://siem.example.com/ingest?src=cp"}},
			Audit:  []Sink{{ID: "siem", Kind: SinkFile, Path: "/var/log/cp/audit.jsonl"}},
		},
		AcceptIAMCookie: true,
		TrustedProxies: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("192.168.1.7/32"),
			netip.MustParsePrefix("2001:db8::/32"),
			netip.MustParsePrefix("::1/128"),
			netip.MustParsePrefix("10.0.0.0/8"),
		},
		Gateway:        &Gateway{URL: "https://gw.example.com:8443", ServerName: "gw.example.com", Region: "eu-west", Listen: ":8443", MaxStreams: DefaultGatewayMaxStreams, DrainDelay: DefaultGatewayDrainDelay, DownAfter: DefaultGatewayDownAfter},
		Downloads:      &Downloads{Dir: "/srv/downloads", Blob: "s3://bucket/downloads"},
		SupportBundles: &SupportBundles{Blob: "s3://bucket/bundles", MaxBytes: 1048576},
		Secrets:        Secrets{Store: SecretStoreNone},
		Webhooks:       Webhooks{AllowPrivateTargets: true, MaxPerTenant: 50, AcceptAnyPattern: true},
		Capacity: Capacity{
			Placer: PlacerPoolLease, MaxBatch: 16, MaxAttempts: 5,
			RollupEvery: time.Minute, UsageEvery: 10 * time.Minute, SpotNoticeMs: 30000,
		},
		Admission: Admission{MaxInFlight: 48, Adaptive: true, MinInFlight: 12, AcquireTarget: 3 * time.Millisecond, SlotWait: 20 * time.Millisecond, MaxQueue: 80 * time.Millisecond,
			QueueTarget: 5 * time.Millisecond, QueueInterval: 200 * time.Millisecond,
			TenantRate: 200, TenantBurst: 400, Tenants: map[string]AdmissionBucket{"bigco": {Rate: 1000, Burst: 2000}, "tiny": {Rate: 1, Burst: 1}},
			GlobalRate: 5000, GlobalBurst: 10000, MaxConnections: 500},
		Shutdown:  Shutdown{Unready: 3 * time.Second},
		Scheduler: Scheduler{Plugins: []string{"gpu-affinity"}, Weights: map[string]float64{"pack": 1, "spread": 0.5}, TopN: 3},
		Clock:     ClockSystem,
		Log:       Log{Level: "debug"},
		Workers:   Workers{ID: "worker-1.eu:a", BatchSize: 100, Concurrency: 8, PollMs: 500, ClaimTTLMs: 30000, ResyncMs: 60000},
		Metrics:   Metrics{Token: "metrics-token-0123456789", Path: "/internal/metrics"},
		Host:      "127.0.0.1",
		Port:      8080,
		Roles:     []Role{RoleAPI, RoleSinks, RoleGateway},
	}
	require.Equal(t, want, c)
}

func TestJSONFile(t *testing.T) {
	t.Parallel()
	c, err := run(`{"basePath": "/c", "capacity": {"maxBatch": 8}, "trustedProxies": ["::/0"]}`, nil)
	require.NoError(t, err)
	require.Equal(t, "/c", c.BasePath)
	require.Equal(t, 8, c.Capacity.MaxBatch)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("::/0")}, c.TrustedProxies)
}

func TestEmptyFile(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"# nothing\n", "---\n", "null\n"} {
		c, err := run(file, nil)
		require.NoError(t, err, file)
		require.Equal(t, "/api/compute", c.BasePath)
	}
}

func TestEnvironmentOverridesFile(t *testing.T) {
	t.Parallel()
	file := `
database: postgres://file@db/x
secret: file-secret-file-secret-file-secret-00
baseURL: https://file.example.com
host: 10.0.0.1
port: 1
roles: [api]
metrics: {token: file-token-0123456789, path: /m}
gateway: {url: "https://file-gw.example.com", region: eu}
downloads: {blob: "s3://bkt/d"}
`
	env := map[string]string{
		EnvDatabaseURL:       "postgres://env@db/x",
		EnvSecret:            "env-secret-env-secret-env-secret-0000",
		EnvBaseURL:           "https://env.example.com",
		EnvHost:              "::",
		EnvPort:              "0",
		EnvRoles:             " sinks , gateway ",
		EnvMetricsToken:      "env-token-0123456789",
		EnvGatewayURL:        "https://env-gw.example.com",
		EnvGatewayServerName: "gw.env.example.com",
		EnvGatewayListen:     "127.0.0.1:7444",
		EnvDownloadsDir:      "/env/downloads",
		EnvPKI:               "/env/pki.json",
	}
	c, err := run(file, env)
	require.NoError(t, err)
	require.Equal(t, "postgres://env@db/x", c.Database)
	require.Equal(t, env[EnvSecret], c.Secret)
	require.Equal(t, "https://env.example.com", c.BaseURL)
	require.Equal(t, "::", c.Host)
	require.Equal(t, 0, c.Port)
	require.Equal(t, []Role{RoleSinks, RoleGateway}, c.Roles)
	require.Equal(t, Metrics{Token: "env-token-0123456789", Path: "/m"}, c.Metrics)
	require.Equal(t, &Gateway{URL: "https://env-gw.example.com", ServerName: "gw.env.example.com", Region: "eu", Listen: "127.0.0.1:7444", MaxStreams: DefaultGatewayMaxStreams, DrainDelay: DefaultGatewayDrainDelay, DownAfter: DefaultGatewayDownAfter}, c.Gateway)
	require.Equal(t, &Downloads{Dir: "/env/downloads", Blob: "s3://bkt/d"}, c.Downloads)
	require.Equal(t, "/env/pki.json", c.PKIFile)
}

func TestGatewayFromEnvironmentOnly(t *testing.T) {
	t.Parallel()
	c, err := run("", map[string]string{EnvGatewayURL: "https://gw.example.com"})
	require.NoError(t, err)
	require.Equal(t, &Gateway{URL: "https://gw.example.com", Listen: ":443", MaxStreams: DefaultGatewayMaxStreams, DrainDelay: DefaultGatewayDrainDelay, DownAfter: DefaultGatewayDownAfter}, c.Gateway)
	require.True(t, c.HasRole(RoleGateway), "all includes the gateway once one is configured")
}

func TestRoles(t *testing.T) {
	t.Parallel()
	workers := []Role{RoleControllers, RoleScheduler, RoleSinks, RoleIAM}
	tests := []struct {
		name    string
		roles   string
		gateway bool
		want    []Role
	}{
		{"default is all without a gateway", "", false, append([]Role{RoleAPI}, workers...)},
		{"all without a gateway", "all", false, append([]Role{RoleAPI}, workers...)},
		{"all with a gateway", "all", true, append(append([]Role{RoleAPI}, workers...), RoleGateway)},
		{"one role", "api", false, []Role{RoleAPI}},
		{"kept in canonical order", "iam,api", false, []Role{RoleAPI, RoleIAM}},
		{"duplicates collapse", "sinks,sinks", false, []Role{RoleSinks}},
		{"all plus a role", "all,api", false, append([]Role{RoleAPI}, workers...)},
		{"gateway alone", "gateway", true, []Role{RoleGateway}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{EnvRoles: tc.roles}
			if tc.gateway {
				env[EnvGatewayURL] = "https://gw.example.com"
			}
			c, err := run("", env)
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Roles)
		})
	}
}

func TestRootTenant(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file, want string
	}{
		{"default", "", "root"},
		{"named by the port", "iam: {rootTenantId: platform}", "platform"},
		{"named by the option", "rootTenantId: platform", "platform"},
		{"both agree", "rootTenantId: p\niam: {rootTenantId: p}", "p"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := run(tc.file, nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, c.RootTenantID)
		})
	}
}

func TestSecretStore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file string
		want       SecretStore
	}{
		{"default", "", SecretStoreDatabase},
		{"empty group", "secrets: {}", SecretStoreDatabase},
		{"database", "secrets: {store: database}", SecretStoreDatabase},
		{"none", "secrets: {store: none}", SecretStoreNone},
		{"JSON", `{"secrets": {"store": "none"}}`, SecretStoreNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := run(tc.file, nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Secrets.Store)
		})
	}
}

func TestWebhooks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file string
		want       Webhooks
	}{
		{"default", "", Webhooks{MaxPerTenant: 20}},
		{"empty group", "webhooks: {}", Webhooks{MaxPerTenant: 20}},
		{"private targets", "webhooks: {allowPrivateTargets: true}", Webhooks{AllowPrivateTargets: true, MaxPerTenant: 20}},
		{"any pattern", "webhooks: {acceptAnyPattern: true}", Webhooks{AcceptAnyPattern: true, MaxPerTenant: 20}},
		{"limit", "webhooks: {maxPerTenant: 1}", Webhooks{MaxPerTenant: 1}},
		{"largest limit", "webhooks: {maxPerTenant: 1000}", Webhooks{MaxPerTenant: 1000}},
		{"JSON", `{"webhooks": {"allowPrivateTargets": false, "maxPerTenant": 5}}`, Webhooks{MaxPerTenant: 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := run(tc.file, nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Webhooks)
		})
	}
}

func TestDatabaseIsNeverEchoed(t *testing.T) {
	t.Parallel()
	_, err := run("", map[string]string{EnvDatabaseURL: "mysql://u:hunter2@h/db"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}

func TestSecretIsNeverEchoed(t *testing.T) {
	t.Parallel()
	_, err := run("", map[string]string{EnvSecret: "tooshort-hunter2"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}

func TestLoadReadsTheFileNamedBySERVICE_CONFIG(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "service.yaml")
	require.NoError(t, os.WriteFile(path, []byte("basePath: /x\n"), 0o600))
	env := map[string]string{EnvConfig: path, EnvDatabaseURL: testDB, EnvSecret: testSecret}
	c, err := Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, "/x", c.BasePath)

	env[EnvConfig] = filepath.Join(t.TempDir(), "missing.yaml")
	_, err = Load(func(k string) string { return env[k] })
	var cerr *Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, EnvConfig, cerr.Option)
	require.Contains(t, cerr.Message, "no such file")
}

// TestInvalid holds one row per rule: the file and environment that break
// it, the option the error must name and a part of its message.
func TestInvalid(t *testing.T) {
	t.Parallel()
	type row struct {
		name   string
		file   string
		env    map[string]string
		option string
		msg    string
	}
	env := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	const (
		pem = "\"-----BEGIN CERTIFICATE-----\\nx\\n-----END CERTIFICATE-----\""
	)
	tests := []row{
		// The file itself.
		{"unreadable file", "", env(EnvConfig, "missing.yaml"), "SERVICE_CONFIG", "cannot read missing.yaml"},
		{"not YAML", "basePath: [", nil, "SERVICE_CONFIG", "not valid YAML or JSON"},
		{"not JSON", `{"basePath": "/x"`, nil, "SERVICE_CONFIG", "not valid YAML or JSON"},
		{"two documents", "basePath: /a\n---\nbasePath: /b\n", nil, "SERVICE_CONFIG", "more than one document"},
		{"not an object", "- a\n- b\n", nil, "SERVICE_CONFIG", "must hold an object"},
		{"unknown option", "basepath: /x", nil, "basepath", "unknown option"},
		{"unknown nested option", "capacity: {maxbatch: 3}", nil, "capacity.maxbatch", "unknown option"},
		{"unknown option in a list item", "sinks: {events: [{id: a, kind: file, path: p, extra: 1}]}", nil, "sinks.events[0].extra", "unknown option"},
		{"unknown JSON option", `{"capacity": {"placr": "inline"}}`, nil, "capacity.placr", "unknown option"},
		{"option given twice", "basePath: /a\nbasePath: /b\n", nil, "basePath", "given more than once"},
		{"wrong type: string for integer", "capacity: {maxBatch: many}", nil, "capacity.maxBatch", "must be an integer"},
		{"wrong type: quoted integer", `capacity: {maxBatch: "8"}`, nil, "capacity.maxBatch", "must be an integer"},
		{"wrong type: integer for string", "basePath: 12", nil, "basePath", "must be a string"},
		{"wrong type: string for bool", "acceptIamCookie: sure", nil, "acceptIamCookie", "must be true or false"},
		{"wrong type: scalar for object", "capacity: 3", nil, "capacity", "must be an object"},
		{"wrong type: scalar for list", "plugins: gpu", nil, "plugins", "must be a list"},
		{"wrong type: object for string", "basePath: {a: b}", nil, "basePath", "must be a string"},
		{"integer out of range", "port: 99999999999999999999", nil, "port", "must be an integer"},

		// database, secret, baseURL, basePath, typePrefix.
		{"database required", "", env(EnvDatabaseURL, ""), "database", "is required"},
		{"database not postgres", "", env(EnvDatabaseURL, "mysql://h/db"), "database", "postgres:// URL"},
		{"secret required", "", env(EnvSecret, ""), "secret", "is required"},
		{"secret at least 32 characters", "", env(EnvSecret, strings.Repeat("s", 31)), "secret", "at least 32 characters, got 31 (set by SERVICE_SECRET)"},
		{"baseURL http or https", "baseURL: ftp://h", nil, "baseURL", "http or https"},
		{"baseURL absolute", "baseURL: /relative", nil, "baseURL", "absolute URL"},
		{"baseURL without credentials", "baseURL: https://u:p@h", nil, "baseURL", "credentials"},
		{"baseURL without query", "baseURL: https://h?a=b", nil, "baseURL", "query"},
		{"baseURL without fragment", "baseURL: https://h#f", nil, "baseURL", "fragment"},
		{"baseURL is an origin", "baseURL: https://h/api", nil, "baseURL", "without a path"},
		{"baseURL port", "baseURL: https://h:99999", nil, "baseURL", "port"},
		{"baseURL from the environment", "", env(EnvBaseURL, "h:3000"), "baseURL", "(set by SERVICE_BASE_URL)"},
		{"basePath absolute", "basePath: api", nil, "basePath", "absolute path"},
		{"basePath without trailing slash", "basePath: /api/", nil, "basePath", "must not end with /"},
		{"basePath not root", "basePath: /", nil, "basePath", "must not be /"},
		{"basePath plain", "basePath: /a?b", nil, "basePath", "plain path"},
		{"basePath without dot segments", "basePath: /a/../b", nil, "basePath", ". or .."},
		{"typePrefix shape", "typePrefix: Compute_", nil, "typePrefix", "a-z, 0-9 and -"},

		// iam and rootTenantId.
		{"iam kind", "iam: {kind: openfga}", nil, "iam.kind", "must be embedded"},
		{"spicedb endpoint", "iam: {decisions: {spicedb: {endpoint: nope}}}", nil, "iam.decisions.spicedb.endpoint", "host:port"},
		{"spicedb plaintext off loopback", "iam: {decisions: {spicedb: {endpoint: 'spicedb.example:50051', plaintext: true}}}", nil, "iam.decisions.spicedb.plaintext", "loopback"},
		{"spicedb key required", "iam: {decisions: {spicedb: {endpoint: '127.0.0.1:50051', plaintext: true}}}", nil, "iam.decisions.spicedb.presharedKeyEnv", "not set"},
		{"spicedb timeout", "iam: {decisions: {spicedb: {endpoint: '127.0.0.1:1', timeoutMs: 5}}}", env("SERVICE_SPICEDB_PRESHARED_KEY", "k"), "iam.decisions.spicedb.timeoutMs", "100 to 10000"},
		{"decisions names a service", "iam: {decisions: {}}", nil, "iam.decisions", "spicedb"},
		{"oidc issuer", "iam: {authentication: {oidc: {issuer: 'http://idp.example', audience: a}}}", nil, "iam.authentication.oidc.issuer", "https"},
		{"oidc audience", "iam: {authentication: {oidc: {issuer: 'https://idp.example'}}}", nil, "iam.authentication.oidc.audience", "required"},
		{"oidc claim", "iam: {authentication: {oidc: {issuer: 'https://idp.example', audience: a, tenantClaim: 'a b'}}}", nil, "iam.authentication.oidc.tenantClaim", "claim name"},
		{"iam rootTenantId shape", "iam: {rootTenantId: 'a b'}", nil, "iam.rootTenantId", "TenantId"},
		{"iam events secret required", "iam: {events: {path: /e}}", nil, "iam.events.secret", "is required"},
		{"iam events secret length", "iam: {events: {secret: short}}", nil, "iam.events.secret", "at least 32"},
		{"iam events path absolute", "iam: {events: {path: e, secret: " + testSecret + "}}", nil, "iam.events.path", "absolute path"},
		{"rootTenantId shape", "rootTenantId: 'a/b'", nil, "rootTenantId", "TenantId"},
		{"rootTenantId length", "rootTenantId: " + strings.Repeat("a", 129), nil, "rootTenantId", "TenantId"},
		{"rootTenantId agrees with the port", "rootTenantId: a\niam: {rootTenantId: b}", nil, "rootTenantId", "must agree with iam.rootTenantId"},

		// modules, plugins, drivers, providers, attestors.
		{"modules shape", "modules: [Billing]", nil, "modules[0]", "1 to 64 characters"},
		{"plugins entries are objects", "plugins: [gpu]", nil, "plugins[0]", "must be an object"},
		{"plugins id required", "plugins: [{path: /p, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}]", nil, "plugins[0].id", "is required"},
		{"plugins id shape", "plugins: [{id: gpu-burn, path: /p, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}]", nil, "plugins[0].id", "a-z and 0-9"},
		{"plugins unique", "plugins: [{id: gpu, path: /p, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}, {id: gpu, path: /q, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}]", nil, "plugins[1].id", "duplicates"},
		{"plugins path required", "plugins: [{id: gpu, sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}]", nil, "plugins[0].path", "is required"},
		{"plugins sha256 shape", "plugins: [{id: gpu, path: /p, sha256: ABC}]", nil, "plugins[0].sha256", "64 lowercase hex"},
		{"drivers shape", "drivers: [ipmi_v2]", nil, "drivers[0]", "1 to 64 characters"},
		{"providers shape", "providers: ['']", nil, "providers[0]", "1 to 64 characters"},
		{"attestors shape", "attestors: [" + strings.Repeat("a", 65) + "]", nil, "attestors[0]", "1 to 64 characters"},
		{"attestors built in", "attestors: [tpm, aws-iid]", nil, "attestors[1]", "not built into this version (built in: tpm, cloud)"},
		{"tpm needs its enrollment", "attestors: [tpm]", nil, "tpm.endorsementKeys", "is required when attestors names tpm"},
		{"tpm enrollment needs the attestor", "tpm: {endorsementKeys: [" + strings.Repeat("a", 64) + "]}", nil, "tpm", "attestors does not name tpm"},
		{"tpm endorsement key shape", "attestors: [tpm]\ntpm: {endorsementKeys: [" + strings.Repeat("a", 63) + "]}", nil, "tpm.endorsementKeys[0]", "64 hexadecimal digits"},
		{"cloud needs its issuers", "attestors: [cloud]", nil, "cloud.issuers", "is required when attestors names cloud"},
		{"cloud settings need the attestor", "cloud: {issuers: [{issuer: x, jwksUrl: 'https://x/jwks', provider: localqemu}]}", nil, "cloud", "attestors does not name cloud"},
		{"cloud issuer required", "attestors: [cloud]\ncloud: {issuers: [{jwksUrl: 'https://x/jwks', provider: localqemu}]}", nil, "cloud.issuers[0].issuer", "is required"},
		{"cloud issuer twice", "attestors: [cloud]\ncloud: {issuers: [{issuer: x, jwksUrl: 'https://x/jwks', provider: a}, {issuer: x, jwksUrl: 'https://x/jwks', provider: b}]}", nil, "cloud.issuers[1].issuer", "listed twice"},
		{"cloud jwks over http off loopback", "attestors: [cloud]\ncloud: {issuers: [{issuer: x, jwksUrl: 'http://md.example/jwks', provider: localqemu}]}", nil, "cloud.issuers[0].jwksUrl", "http only to a loopback host"},
		{"cloud jwks required", "attestors: [cloud]\ncloud: {issuers: [{issuer: x, provider: localqemu}]}", nil, "cloud.issuers[0].jwksUrl", "is required"},
		{"cloud provider shape", "attestors: [cloud]\ncloud: {issuers: [{issuer: x, jwksUrl: 'https://x/jwks', provider: 'Not A Name'}]}", nil, "cloud.issuers[0].provider", "must name the provider"},
		{"cloud provider registered", "providers: [localqemu]\nattestors: [cloud]\ncloud: {issuers: [{issuer: x, jwksUrl: 'https://x/jwks', provider: ec2}]}", nil, "cloud.issuers[0].provider", "providers does not register"},
		{"cloud maxAge bound", "attestors: [cloud]\ncloud: {maxAge: 2h, issuers: [{issuer: x, jwksUrl: 'https://x/jwks', provider: localqemu}]}", nil, "cloud.maxAge", "from 1s to 1h"},
		{"cloud audience shape", "attestors: [cloud]\ncloud: {audience: 'ftp://x', issuers: [{issuer: x, jwksUrl: 'https://x/jwks', provider: localqemu}]}", nil, "cloud.audience", "absolute http or https URL"},
		{"tpm endorsement key twice", "attestors: [tpm]\ntpm: {endorsementKeys: [" + strings.Repeat("a", 64) + ", " + strings.Repeat("A", 64) + "]}", nil, "tpm.endorsementKeys[1]", "listed twice"},

		// tunnels.
		{"tunnels issuer required", "tunnels: {ssh: true}", nil, "tunnels.issuer", "is required"},
		{"tunnels issuer is the origin of baseURL", "tunnels: {issuer: 'https://other.example.com'}", nil, "tunnels.issuer", "origin of baseURL (http://localhost:3000)"},
		{"tunnels issuer is a URL", "tunnels: {issuer: issuer}", nil, "tunnels.issuer", "absolute URL"},
		{"tunnels previewDomain a DNS name", "tunnels: {issuer: 'http://localhost:3000', previewDomain: 'Preview_Example'}", nil, "tunnels.previewDomain", "lowercase DNS name"},
		{"tunnels previewDomain two labels", "tunnels: {issuer: 'http://localhost:3000', previewDomain: '*.localhost'}", nil, "tunnels.previewDomain", "lowercase DNS name"},
		{"tunnels sshAccounts not empty", "tunnels: {issuer: 'http://localhost:3000', sshAccounts: []}", nil, "tunnels.sshAccounts", "at least one"},
		{"tunnels sshAccounts shape", "tunnels: {issuer: 'http://localhost:3000', sshAccounts: [Root]}", nil, "tunnels.sshAccounts[0]", "user name"},
		{"tunnels tunnelsPerMinute", "tunnels: {issuer: 'http://localhost:3000', limits: {tunnelsPerMinute: 0}}", nil, "tunnels.limits.tunnelsPerMinute", "at least 1"},
		{"tunnels sshCertificatesPerHour", "tunnels: {issuer: 'http://localhost:3000', limits: {sshCertificatesPerHour: -1}}", nil, "tunnels.limits.sshCertificatesPerHour", "at least 1"},
		{"tunnels openPerNode", "tunnels: {issuer: 'http://localhost:3000', limits: {openPerNode: 0}}", nil, "tunnels.limits.openPerNode", "at least 1"},
		{"tunnels openPerGateway", "tunnels: {issuer: 'http://localhost:3000', limits: {openPerGateway: 0}}", nil, "tunnels.limits.openPerGateway", "at least 1"},
		{"tunnels idleTimeoutMs", "tunnels: {issuer: 'http://localhost:3000', limits: {idleTimeoutMs: 999}}", nil, "tunnels.limits.idleTimeoutMs", "at least 1000"},

		// pki.
		{"pki trustVersion at least 1", "pki: {trustVersion: 0}", nil, "pki.trustVersion", "at least 1"},
		{"pki CA needs a key", "pki: {nodeCa: {certFile: a}}", nil, "pki.nodeCa.key", "is required"},
		{"pki CA needs a cert", "pki: {servingCa: {keyFile: a}}", nil, "pki.servingCa.cert", "is required"},
		{"pki inline or file, not both", "pki: {nodeCa: {cert: " + pem + ", certFile: a, keyFile: b}}", nil, "pki.nodeCa.cert", "not both"},
		{"pki inline is PEM", "pki: {join: {key: notpem}}", nil, "pki.join.key", "PEM text"},
		{"pki commandSigning needs a key", "pki: {commandSigning: {}}", nil, "pki.commandSigning.key", "is required"},
		{"pki commandSigningRoots entries", "pki: {commandSigningRoots: [{}]}", nil, "pki.commandSigningRoots[0]", "needs pem or file"},

		// notifier.
		{"notifier kind required", "notifier: {}", nil, "notifier.kind", "is required"},
		{"notifier kind", "notifier: {kind: redis}", nil, "notifier.kind", "postgres or none"},

		// sinks.
		{"sinks usage invalid", "sinks: {usage: [{id: a, kind: file, path: p}]}", nil, "sinks.usage", "usage goes to billing through the identity bridge"},
		{"sinks id required", "sinks: {events: [{kind: file, path: p}]}", nil, "sinks.events[0].id", "is required"},
		{"sinks id shape", "sinks: {audit: [{id: A!, kind: file, path: p}]}", nil, "sinks.audit[0].id", "1 to 63 characters"},
		{"sinks id unique per kind", "sinks: {events: [{id: a, kind: file, path: p}, {id: a, kind: file, path: q}]}", nil, "sinks.events[1].id", "unique among their kind"},
		{"sinks kind required", "sinks: {events: [{id: a}]}", nil, "sinks.events[0].kind", "is required"},
		{"sinks kind", "sinks: {events: [{id: a, kind: kafka}]}", nil, "sinks.events[0].kind", "http or file"},
		{"sinks http needs url", "sinks: {events: [{id: a, kind: http}]}", nil, "sinks.events[0].url", "is required"},
		{"sinks http url scheme", "sinks: {events: [{id: a, kind: http, url: 'ftp://h'}]}", nil, "sinks.events[0].url", "http or https"},
		{"sinks http url credentials", "sinks: {events: [{id: a, kind: http, url: 'https://u:p@h'}]}", nil, "sinks.events[0].url", "credentials"},
		{"sinks http takes no path", "sinks: {events: [{id: a, kind: http, url: 'https://h', path: p}]}", nil, "sinks.events[0].path", "file sinks"},
		{"sinks file needs path", "sinks: {audit: [{id: a, kind: file}]}", nil, "sinks.audit[0].path", "is required"},
		{"sinks file takes no url", "sinks: {audit: [{id: a, kind: file, path: p, url: 'https://h'}]}", nil, "sinks.audit[0].url", "http sinks"},

		// trustedProxies.
		{"trustedProxies name", "trustedProxies: [proxy.local]", nil, "trustedProxies[0]", "IPv4 or IPv6"},
		{"trustedProxies prefix length", "trustedProxies: [10.0.0.0/8, 10.0.0.1/33]", nil, "trustedProxies[1]", "IPv4 or IPv6"},
		{"trustedProxies zone", "trustedProxies: ['fe80::1%eth0']", nil, "trustedProxies[0]", "IPv4 or IPv6"},

		// gateway.
		{"gateway url required", "gateway: {serverName: gw}", nil, "gateway.url", "is required"},
		{"gateway url required (environment)", "", env(EnvGatewayServerName, "gw"), "gateway.url", "is required"},
		{"gateway url https", "gateway: {url: 'http://gw'}", nil, "gateway.url", "https"},
		{"gateway url credentials", "gateway: {url: 'https://u@gw'}", nil, "gateway.url", "credentials"},
		{"gateway url query", "gateway: {url: 'https://gw?a=1'}", nil, "gateway.url", "query"},
		{"gateway url fragment", "gateway: {url: 'https://gw#x'}", nil, "gateway.url", "fragment"},
		{"gateway url from the environment", "", env(EnvGatewayURL, "gw:443"), "gateway.url", "(set by SERVICE_GATEWAY_URL)"},
		{"gateway serverName DNS name", "gateway: {url: 'https://gw', serverName: 'gw_1.example.com'}", nil, "gateway.serverName", "DNS name"},
		{"gateway serverName IP", "gateway: {url: 'https://gw', serverName: '10.0.0.1'}", nil, "gateway.serverName", "not an IP address"},
		{"gateway listen from the environment", "gateway: {url: 'https://gw'}", env(EnvGatewayListen, "7443"), "gateway.listen", "(set by SERVICE_GATEWAY_LISTEN)"},
		{"gateway region shape", "gateway: {url: 'https://gw', region: EU}", nil, "gateway.region", "Region"},

		// downloads and supportBundles.
		{"downloads needs dir or blob", "downloads: {}", nil, "downloads", "dir or blob"},
		{"downloads blob URL", "downloads: {blob: bucket}", nil, "downloads.blob", "s3://"},
		{"images needs dir or url", "images: {}", nil, "images", "dir or url"},
		{"log level from the environment", "", env(EnvLogLevel, "verbose"), "log.level", "(set by SERVICE_LOG_LEVEL)"},
		{"images not both", "images: {dir: /srv/images, url: 'https://i/index.json'}", nil, "images", "dir or url"},
		{"images url scheme", "images: {url: 'ftp://i/index.json'}", nil, "images.url", "http or https"},
		{"images url credentials", "images: {url: 'https://u:p@i/index.json'}", nil, "images.url", "without credentials"},
		{"supportBundles blob required", "supportBundles: {maxBytes: 10}", nil, "supportBundles.blob", "is required"},
		{"supportBundles blob credentials", "supportBundles: {blob: 's3://k:s@bucket'}", nil, "supportBundles.blob", "credentials"},
		{"supportBundles maxBytes positive", "supportBundles: {blob: 's3://bkt', maxBytes: 0}", nil, "supportBundles.maxBytes", "positive"},
		{"downloads blob s3 only", "downloads: {blob: 'gs://bkt/x'}", nil, "downloads.blob", "s3://"},
		{"downloads blob credentials", "downloads: {blob: 's3://k:s@bucket'}", nil, "downloads.blob", "credentials"},
		{"supportBundles blob s3 only", "supportBundles: {blob: 'gs://bkt/x'}", nil, "supportBundles.blob", "s3://"},
		{"supportBundles blob parameters", "supportBundles: {blob: 's3://bkt/x?acl=public'}", nil, "supportBundles.blob", "unknown parameter"},
		{"supportBundles blob endpoint", "supportBundles: {blob: 's3://bkt/x?endpoint=ftp://h'}", nil, "supportBundles.blob", "endpoint"},

		// secrets.
		{"secrets store", "secrets: {store: vault}", nil, "secrets.store", "database or none"},
		{"secrets store empty", "secrets: {store: ''}", nil, "secrets.store", "database or none"},
		{"secrets store type", "secrets: {store: 1}", nil, "secrets.store", "must be a string"},
		{"secrets unknown option", "secrets: {kind: database}", nil, "secrets.kind", "unknown option"},

		// webhooks.
		{"webhooks maxPerTenant at least 1", "webhooks: {maxPerTenant: 0}", nil, "webhooks.maxPerTenant", "from 1 to 1000"},
		{"webhooks maxPerTenant at most 1000", "webhooks: {maxPerTenant: 1001}", nil, "webhooks.maxPerTenant", "from 1 to 1000"},
		{"webhooks maxPerTenant integer", "webhooks: {maxPerTenant: many}", nil, "webhooks.maxPerTenant", "must be an integer"},
		{"webhooks allowPrivateTargets boolean", "webhooks: {allowPrivateTargets: yes please}", nil, "webhooks.allowPrivateTargets", "must be true or false"},
		{"webhooks acceptAnyPattern boolean", "webhooks: {acceptAnyPattern: 1}", nil, "webhooks.acceptAnyPattern", "must be true or false"},
		{"webhooks unknown option", "webhooks: {allowPrivate: true}", nil, "webhooks.allowPrivate", "unknown option"},
		{"webhooks object", "webhooks: true", nil, "webhooks", "must be an object"},

		// capacity.
		{"capacity placer", "capacity: {placer: batch}", nil, "capacity.placer", "inline or pool-lease"},
		{"capacity maxBatch at least 1", "capacity: {maxBatch: 0}", nil, "capacity.maxBatch", "from 1 to 64"},
		{"capacity maxBatch at most 64", "capacity: {maxBatch: 65}", nil, "capacity.maxBatch", "from 1 to 64"},
		{"admission maxInFlight negative", "admission: {maxInFlight: -1}", nil, "admission.maxInFlight", "at least 0"},
		{"admission tenantRate negative", "admission: {tenantRate: -2}", nil, "admission.tenantRate", "at least 0"},
		{"admission tenantBurst without a rate", "admission: {tenantBurst: 5}", nil, "admission.tenantBurst", "needs admission.tenantRate"},
		{"admission tenantBurst zero", "admission: {tenantRate: 5, tenantBurst: 0}", nil, "admission.tenantBurst", "at least 1"},
		{"admission minInFlight without adaptive", "admission: {adaptive: false, minInFlight: 4}", nil, "admission.minInFlight", "needs an adaptive"},
		{"admission acquireTargetMs without a limit", "admission: {maxInFlight: 0, acquireTargetMs: 2}", nil, "admission.acquireTargetMs", "needs an adaptive"},
		{"admission minInFlight above the ceiling", "admission: {adaptive: true, maxInFlight: 8, minInFlight: 9}", nil, "admission.minInFlight", "at most admission.maxInFlight"},
		{"admission minInFlight zero", "admission: {adaptive: true, minInFlight: 0}", nil, "admission.minInFlight", "at least 1"},
		{"admission acquireTargetMs zero", "admission: {adaptive: true, acquireTargetMs: 0}", nil, "admission.acquireTargetMs", "from 1 to 50"},
		{"admission acquireTargetMs too long", "admission: {adaptive: true, acquireTargetMs: 51}", nil, "admission.acquireTargetMs", "from 1 to 50"},
		{"admission latencyTolerance, the old limit's", "admission: {adaptive: true, latencyTolerance: 2}", nil, "admission.latencyTolerance", "no longer an option"},
		{"admission maxQueueMs negative", "admission: {maxQueueMs: -1}", nil, "admission.maxQueueMs", "from 0 to 1999"},
		{"admission maxQueueMs the store's wait", "admission: {maxQueueMs: 2000}", nil, "admission.maxQueueMs", "from 0 to 1999"},
		{"admission slotWaitMs negative", "admission: {slotWaitMs: -1}", nil, "admission.slotWaitMs", "from 0 to 1000"},
		{"admission slotWaitMs too long", "admission: {slotWaitMs: 1001}", nil, "admission.slotWaitMs", "from 0 to 1000"},
		{"admission slotWaitMs without a limit", "admission: {maxInFlight: 0, slotWaitMs: 20}", nil, "admission.slotWaitMs", "needs an in-flight limit"},
		{"admission queueTargetMs negative", "admission: {queueTargetMs: -1}", nil, "admission.queueTargetMs", "from 0 to 1000"},
		{"admission queueTargetMs not below the interval", "admission: {queueTargetMs: 100}", nil, "admission.queueTargetMs", "below admission.queueIntervalMs"},
		{"admission queueIntervalMs without a target", "admission: {queueIntervalMs: 100}", nil, "admission.queueIntervalMs", "needs admission.queueTargetMs"},
		{"admission queueIntervalMs not above the target", "admission: {queueTargetMs: 10, queueIntervalMs: 10}", nil, "admission.queueIntervalMs", "above admission.queueTargetMs"},
		{"admission maxConnections negative", "admission: {maxConnections: -1}", nil, "admission.maxConnections", "from 0 to 1000000"},
		{"admission maxConnections too many", "admission: {maxConnections: 1000001}", nil, "admission.maxConnections", "from 0 to 1000000"},
		{"admission globalRate negative", "admission: {globalRate: -1}", nil, "admission.globalRate", "at least 0"},
		{"admission globalBurst without a rate", "admission: {globalBurst: 3}", nil, "admission.globalBurst", "needs admission.globalRate"},
		{"admission tenant without a rate", "admission: {tenants: {acme: {burst: 3}}}", nil, "admission.tenants.acme.rate", "is required"},
		{"admission tenant rate zero", "admission: {tenants: {acme: {rate: 0}}}", nil, "admission.tenants.acme.rate", "above 0"},
		{"admission tenant burst zero", "admission: {tenants: {acme: {rate: 3, burst: 0}}}", nil, "admission.tenants.acme.burst", "at least 1"},
		{"shutdown unreadyMs negative", "shutdown: {unreadyMs: -1}", nil, "shutdown.unreadyMs", "from 0 to 60000"},
		{"shutdown unreadyMs too long", "shutdown: {unreadyMs: 60001}", nil, "shutdown.unreadyMs", "from 0 to 60000"},
		{"admission tenant unknown option", "admission: {tenants: {acme: {rate: 3, size: 4}}}", nil, "admission.tenants.acme.size", "unknown option"},
		{"capacity maxAttempts", "capacity: {maxAttempts: 0}", nil, "capacity.maxAttempts", "at least 1"},
		{"capacity rollupEvery duration", "capacity: {rollupEvery: 5}", nil, "capacity.rollupEvery", "must be a string"},
		{"capacity rollupEvery syntax", "capacity: {rollupEvery: five}", nil, "capacity.rollupEvery", "duration"},
		{"capacity usageEvery positive", "capacity: {usageEvery: 0s}", nil, "capacity.usageEvery", "at least 1s"},
		{"capacity spotNoticeMs", "capacity: {spotNoticeMs: -1}", nil, "capacity.spotNoticeMs", "at least 0"},

		// scheduler.
		{"scheduler plugins shape", "scheduler: {plugins: [Pack]}", nil, "scheduler.plugins[0]", "1 to 64 characters"},
		{"scheduler weights key", "scheduler: {weights: {Pack: 1}}", nil, "scheduler.weights.Pack", "scorer"},
		{"scheduler weights value", "scheduler: {weights: {pack: -1}}", nil, "scheduler.weights.pack", "at least 0"},
		{"scheduler weights number", "scheduler: {weights: {pack: high}}", nil, "scheduler.weights.pack", "must be a number"},
		{"scheduler weights finite", "scheduler: {weights: {pack: .inf}}", nil, "scheduler.weights.pack", "at least 0"},
		{"scheduler topN", "scheduler: {topN: 0}", nil, "scheduler.topN", "at least 1"},

		// clock, log.
		{"clock", "clock: ntp", nil, "clock", "database or system"},
		{"log level", "log: {level: trace}", nil, "log.level", "debug, info, warn or error"},

		// workers.
		{"workers id shape", "workers: {id: 'a b'}", nil, "workers.id", "1 to 128 characters"},
		{"workers id length", "workers: {id: ''}", nil, "workers.id", "1 to 128 characters"},
		{"workers batchSize min", "workers: {batchSize: 0}", nil, "workers.batchSize", "from 1 to 1000"},
		{"workers batchSize max", "workers: {batchSize: 1001}", nil, "workers.batchSize", "from 1 to 1000"},
		{"workers concurrency min", "workers: {concurrency: 0}", nil, "workers.concurrency", "from 1 to 64"},
		{"workers concurrency max", "workers: {concurrency: 65}", nil, "workers.concurrency", "from 1 to 64"},
		{"workers pollMs min", "workers: {pollMs: 9}", nil, "workers.pollMs", "from 10 to 60000"},
		{"workers pollMs max", "workers: {pollMs: 60001}", nil, "workers.pollMs", "from 10 to 60000"},
		{"workers claimTtlMs min", "workers: {claimTtlMs: 999}", nil, "workers.claimTtlMs", "from 1000 to 3600000"},
		{"workers claimTtlMs max", "workers: {claimTtlMs: 3600001}", nil, "workers.claimTtlMs", "from 1000 to 3600000"},
		{"workers resyncMs min", "workers: {resyncMs: 999}", nil, "workers.resyncMs", "from 1000 to 86400000"},
		{"workers resyncMs max", "workers: {resyncMs: 86400001}", nil, "workers.resyncMs", "from 1000 to 86400000"},

		// metrics.
		{"metrics token at least 16", "metrics: {token: short}", nil, "metrics.token", "at least 16"},
		{"metrics token from the environment", "", env(EnvMetricsToken, "short"), "metrics.token", "(set by SERVICE_METRICS_TOKEN)"},
		{"metrics path absolute", "metrics: {path: metrics}", nil, "metrics.path", "absolute path"},
		{"metrics path not root", "metrics: {path: /}", nil, "metrics.path", "must not be /"},
		{"metrics path outside the base path", "metrics: {path: /api/compute/metrics}", nil, "metrics.path", "outside the base path"},
		{"metrics path not the base path", "metrics: {path: /api/compute}", nil, "metrics.path", "outside the base path"},
		{"metrics path not a built-in route", "metrics: {path: /healthz}", nil, "metrics.path", "built-in route /healthz"},
		{"metrics path not the well-known route", "metrics: {path: /.well-known/service}", nil, "metrics.path", "built-in route"},
		{"iam events path outside the base path", "iam: {events: {path: /api/compute/iam, secret: 0123456789abcdef0123456789abcdef}}", nil, "iam.events.path", "outside the base path"},
		{"metrics and iam events paths differ", "iam: {events: {path: /hooks, secret: 0123456789abcdef0123456789abcdef}}\nmetrics: {path: /hooks}", nil, "metrics.path", "must differ"},

		// host, port.
		{"host", "host: 'not a host'", nil, "host", "IP address or a host name"},
		{"port range", "port: 65536", nil, "port", "from 0 to 65535"},
		{"port integer (environment)", "", env(EnvPort, "http"), "port", "(set by PORT)"},

		// roles.
		{"roles unknown (environment)", "", env(EnvRoles, "api,web"), "roles", `unknown role "web"`},
		{"roles unknown (file)", "roles: [api, web]", nil, "roles[1]", `unknown role "web"`},
		{"roles empty name", "", env(EnvRoles, "api,,iam"), "roles", "empty role name"},
		{"roles gateway needs a gateway", "", env(EnvRoles, "gateway"), "roles", "needs the gateway option"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := run(tc.file, tc.env)
			var cerr *Error
			require.True(t, errors.As(err, &cerr), "want *Error, got %v", err)
			require.Equal(t, tc.option, cerr.Option, cerr.Error())
			require.Contains(t, cerr.Message, tc.msg)
			require.True(t, strings.HasPrefix(err.Error(), "INVALID_CONFIG: "+tc.option+": "))
		})
	}
}

func TestLogLevelFromTheEnvironment(t *testing.T) {
	t.Parallel()
	c, err := Load(func(k string) string {
		return map[string]string{EnvDatabaseURL: "postgres://h/db", EnvSecret: strings.Repeat("s", 32), EnvLogLevel: "info"}[k]
	})
	require.NoError(t, err)
	require.Equal(t, "info", c.Log.Level)
}

func TestBaseURLFollowsThePort(t *testing.T) {
	t.Parallel()
	base := map[string]string{EnvDatabaseURL: "postgres://h/db", EnvSecret: strings.Repeat("s", 32)}
	load := func(extra map[string]string) *Config {
		t.Helper()
		c, err := Load(func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		})
		require.NoError(t, err)
		return c
	}
	require.Equal(t, "http://localhost:3000", load(nil).BaseURL)
	require.Equal(t, "http://localhost:3001", load(map[string]string{EnvPort: "3001"}).BaseURL)
	require.Equal(t, "https://api.example.com", load(map[string]string{EnvPort: "3001", EnvBaseURL: "https://api.example.com"}).BaseURL, "set wins")
}

// Every problem of a file is reported at once, each with its option path,
// and an option once: a value of the wrong type is not also "required".
func TestEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := run(`
secret: 12345
unknownThing: true
gateway: {url: "http://gw.example.com", maxStreams: 0}
sinks: {audit: [{id: a, kind: file}, {id: a, kind: file, path: /x}]}
scheduler: {topN: 0}
roles: [api, gateway, web]
`, map[string]string{EnvSecret: ""})
	problems := Problems(err)
	var got []string
	for _, p := range problems {
		got = append(got, p.Option)
	}
	assert.Equal(t, []string{
		"secret", "unknownThing", // the file's own problems first, then in the order of the checks
		"sinks.audit[0].path", "sinks.audit[1].id",
		"gateway.maxStreams",
		"scheduler.topN",
		"roles[2]",
	}, got, "%v", err)
	assert.Equal(t, "must be a string", problems[0].Message, "not also: is required")
	var first *Error
	require.ErrorAs(t, err, &first)
	assert.Equal(t, "secret", first.Option)
	assert.Len(t, strings.Split(err.Error(), "\n"), len(problems), "one line a problem")

	// One problem is a plain *Error, as before.
	_, err = run("capacity: {maxBatch: 65}", nil)
	require.IsType(t, &Error{}, err)
}

// gateway.sessionTicketDays is 0 (no resumption, the default) to 7
// (crypto/tls's cap on a ticket's life).
func TestGatewaySessionTicketDays(t *testing.T) {
	t.Parallel()
	c, err := run(`gateway: {url: "https://gw.example.com", region: eu, sessionTicketDays: 7}`, nil)
	require.NoError(t, err)
	assert.Equal(t, 7, c.Gateway.SessionTicketDays)
	c, err = run(`gateway: {url: "https://gw.example.com", region: eu}`, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, c.Gateway.SessionTicketDays, "off by default")
	for _, v := range []string{"-1", "8"} {
		_, err = run(`gateway: {url: "https://gw.example.com", region: eu, sessionTicketDays: `+v+`}`, nil)
		var ce *Error
		require.ErrorAs(t, err, &ce, v)
		assert.Equal(t, "gateway.sessionTicketDays", ce.Option)
	}
}
