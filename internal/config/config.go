// Package config loads and validates the configuration of a process: an
// optional file named by SERVICE_CONFIG (YAML or JSON, unknown keys
// refused), then the environment variables of the interface
// specification, which override the file. Every option of the
// specification's Configuration options table is parsed and validated here,
// including those of features that come later, so that a deployment learns
// of a mistake at startup and before any connection is opened: Load reads
// the file and the environment and nothing else.
//
// A problem is an *Error naming the option by its dotted path in the file
// (capacity.maxBatch, sinks.events[1].url); its text starts with
// INVALID_CONFIG.
package config

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"computeplane/internal/configerr"
)

// Environment variables read by Load. SERVICE_TOKEN, SERVICE_URL and
// SERVICE_TENANT belong to the CLI and are not read here.
const (
	EnvConfig            = "SERVICE_CONFIG"
	EnvDatabaseURL       = "SERVICE_DATABASE_URL"
	EnvSecret            = "SERVICE_SECRET"
	EnvBaseURL           = "SERVICE_BASE_URL"
	EnvPKI               = "SERVICE_PKI"
	EnvRoles             = "SERVICE_ROLES"
	EnvPort              = "PORT"
	EnvHost              = "HOST"
	EnvMetricsToken      = "SERVICE_METRICS_TOKEN"
	EnvGatewayURL        = "SERVICE_GATEWAY_URL"
	EnvGatewayServerName = "SERVICE_GATEWAY_SERVER_NAME"
	EnvGatewayListen     = "SERVICE_GATEWAY_LISTEN"
	EnvDownloadsDir      = "SERVICE_DOWNLOADS_DIR"
	// EnvLogLevel sets log.level: debug, info, warn or error.
	EnvLogLevel = "SERVICE_LOG_LEVEL"
)

// Defaults of the specification.
const (
	DefaultBaseURL       = "http://localhost:3000"
	DefaultBasePath      = "/api/compute"
	DefaultTypePrefix    = "compute-"
	DefaultRootTenantID  = "root"
	DefaultPKIFile       = ".service/pki.json"
	DefaultHost          = "0.0.0.0"
	DefaultPort          = 3000
	DefaultMetricsPath   = "/metrics"
	DefaultIAMEventsPath = "/iam/events"
	MinSecretLength      = 32
	MinMetricsToken      = 16
)

// Config is the validated configuration of a process. Every default is
// filled in; optional features that are not configured are nil.
type Config struct {
	// Database is the connection string of the store. It holds a password
	// at times: never log it.
	Database string
	// Secret seals secrets at rest, the PKI bundle and webhook signing
	// secrets; at least 32 characters. Never log it.
	Secret string
	// BaseURL is the public origin of the API (scheme://host[:port], no
	// trailing slash).
	BaseURL string
	IAM     IAM
	// RootTenantID is the tenant owning platform resources.
	RootTenantID string
	// BasePath prefixes every API route: absolute, no trailing slash.
	BasePath string
	// TypePrefix prefixes identity-service resource types (compute-node).
	TypePrefix string
	Modules    []string
	// Plugins are out-of-process plugins (docs/plugins.md), mounted under
	// {basePath}/plugins/{pluginId}, with actions compute:<pluginId>:*.
	Plugins   []Plugin
	Drivers   []string
	Providers []string
	Attestors []string
	// TPM is the TPM attestor's enrollment; set exactly when Attestors
	// names tpm.
	TPM *TPM
	// Cloud is the cloud instance-identity attestor's settings; set
	// exactly when Attestors names cloud.
	Cloud *Cloud
	// Tunnels is nil when tunnels are not configured (the group is absent).
	Tunnels *Tunnels
	PKI     PKI
	// PKIFile is where the sealed PKI bundle is kept (SERVICE_PKI).
	PKIFile string
	// Notifier is nil when none is configured.
	Notifier *Notifier
	Sinks    Sinks
	// AcceptIAMCookie accepts the identity-service session cookie on
	// same-origin requests.
	AcceptIAMCookie bool
	// TrustedProxies holds the proxies whose forwarding headers are
	// believed; a single address is a /32 or /128 prefix.
	TrustedProxies []netip.Prefix
	// Gateway is nil when no gateway is configured.
	Gateway *Gateway
	// Downloads is nil when daemon downloads are not served.
	Downloads *Downloads
	// Images is nil when no image source is configured: whatever needs an
	// image answers INVALID_CONFIG.
	Images *Images
	// SupportBundles is nil when support bundles are not configured.
	SupportBundles *SupportBundles
	// ProviderDir is where providers that run machines on this host keep
	// them; "" is .service/providers.
	ProviderDir string
	// Bootstrap is nil when provider bootstraps are not configured:
	// providerAccounts.bootstrap answers INVALID_CONFIG.
	Bootstrap *Bootstrap
	Secrets   Secrets // the secret store (default database)
	Webhooks  Webhooks
	Capacity  Capacity
	Admission Admission
	Shutdown  Shutdown
	Scheduler Scheduler
	Clock     Clock
	Log       Log
	Workers   Workers
	Metrics   Metrics
	// Host and Port are where the api role listens.
	Host string
	Port int
	// Roles are the roles this process runs, expanded (all is never
	// present) and in the order of AllRoles.
	Roles []Role
}

// HasRole reports whether the process runs role r.
func (c *Config) HasRole(r Role) bool {
	return slices.Contains(c.Roles, r)
}

// IAM selects the port to the identity service.
type IAM struct {
	// Kind is the adapter; embedded (the identity service in the same
	// PostgreSQL) is the only one of this build.
	Kind IAMKind
	// RootTenantID is the root tenant the port names, if it names one.
	RootTenantID string
	// Events is nil unless the signed identity-event webhook is configured.
	Events *IAMEvents
	// Decisions, when set, moves require and authorize to an external
	// relationship-based authorization server; the embedded service keeps
	// tenants, identities, keys and role bindings (docs/identity.md).
	Decisions *IAMDecisions
	// Authentication, when set, adds an external OIDC provider whose
	// access tokens are accepted besides the embedded API keys.
	Authentication *IAMAuthentication
}

// IAMDecisions selects the external decision service.
type IAMDecisions struct {
	SpiceDB *SpiceDB
}

// SpiceDB is a SpiceDB server deciding by relationships.
type SpiceDB struct {
	// Endpoint is host:port of its gRPC API.
	Endpoint string
	// PresharedKeyEnv names the environment variable holding the preshared
	// key; PresharedKey is its value, read at start.
	PresharedKeyEnv string
	PresharedKey    string
	// Plaintext speaks gRPC without TLS, allowed only to a loopback host.
	Plaintext bool
	// CAFile is the PEM bundle TLS trusts (the system roots when empty).
	CAFile string
	// Timeout bounds every call to SpiceDB.
	Timeout time.Duration
}

// Defaults of SpiceDB.
const (
	DefaultSpiceDBKeyEnv  = "SERVICE_SPICEDB_PRESHARED_KEY"
	DefaultSpiceDBTimeout = 2 * time.Second
)

// IAMAuthentication selects the external authentication service.
type IAMAuthentication struct {
	OIDC *OIDC
}

// OIDC is an OpenID Connect provider whose JWT access tokens are accepted.
type OIDC struct {
	// Issuer is the provider's issuer URL (https, or http to a loopback
	// host); discovery is read from Issuer/.well-known/openid-configuration.
	Issuer string
	// Audience must be one of the token's aud values.
	Audience string
	// TenantClaim names the claim carrying the caller's tenant (default
	// compute_tenant): the token's subject is an identity of the embedded
	// service, and the claim must name its home tenant; its role bindings
	// decide.
	TenantClaim string
	// CAFile is the PEM bundle TLS trusts (the system roots when empty).
	CAFile string
	// Timeout bounds every call to the provider.
	Timeout time.Duration
}

// Defaults of OIDC.
const (
	DefaultOIDCTenantClaim = "compute_tenant"
	DefaultOIDCTimeout     = 2 * time.Second
)

// IAMKind names an identity-service adapter.
type IAMKind string

// IAMEmbedded is the identity service kept in the same PostgreSQL.
const IAMEmbedded IAMKind = "embedded"

// IAMEvents configures the signed identity-service event webhook.
type IAMEvents struct {
	Path   string // default /iam/events
	Secret string // signing secret, at least 32 characters
}

// Tunnels configures interactive access through gateway and daemon.
type Tunnels struct {
	// Issuer signs tunnel tickets; it is the origin of baseURL.
	Issuer         string
	SSH            bool
	SSHRequiresMFA bool     // default true
	SSHAccounts    []string // default [root]; principal <account>@<nodeId>
	// PreviewDomain serves host-based preview URLs
	// <port>-<id>.<PreviewDomain> ("" path-based only).
	PreviewDomain string
	Limits        TunnelLimits
}

// TunnelLimits: the rates are per identity and per api replica; the open
// tunnels are bounded at the gateway (per node session and in all), and
// the api replica relaying a tunnel closes it when idle.
type TunnelLimits struct {
	TunnelsPerMinute       int // default 10
	SSHCertificatesPerHour int // default 20
	OpenPerNode            int // default 256
	OpenPerGateway         int // default 10000
	// IdleTimeout closes a tunnel through which nothing passed for so
	// long; default an hour.
	IdleTimeout time.Duration
}

// PKI configures the certificate authorities and signing keys. Each
// material is nil when not configured; the service then keeps its own in
// the sealed bundle at PKIFile.
type PKI struct {
	NodeCA              *KeyPair
	ServingCA           *KeyPair
	Join                *KeyPair
	CommandSigning      *KeyPair
	CommandSigningRoots []PEM
	// TrustVersion is the lowest trust bundle version; default 1.
	TrustVersion int
}

// KeyPair is a certificate and its private key. Each half is either inline
// PEM or a file path (re-read every 60 s by the gateway), never both.
type KeyPair struct {
	Cert PEM
	Key  PEM
}

// PEM is PEM text given inline or as a path to a file holding it.
type PEM struct {
	Inline string
	File   string
}

// IsZero reports whether neither form is given.
func (p PEM) IsZero() bool { return p.Inline == "" && p.File == "" }

// Notifier carries best-effort wake-ups after commit.
type Notifier struct {
	Kind NotifierKind
}

// NotifierKind names a notifier.
type NotifierKind string

// Notifier kinds.
const (
	NotifierPostgres NotifierKind = "postgres" // LISTEN/NOTIFY on the store
	NotifierNone     NotifierKind = "none"
)

// Sinks receive every committed outbox row, per kind.
type Sinks struct {
	Events []Sink
	Audit  []Sink
}

// Sink is one destination; its id keys its durable cursor.
type Sink struct {
	ID   string
	Kind SinkKind
	URL  string // http sinks
	Path string // file sinks
}

// SinkKind names a sink transport.
type SinkKind string

// Sink kinds.
const (
	SinkHTTP SinkKind = "http"
	SinkFile SinkKind = "file"
)

// Gateway is the mutual-TLS endpoint daemons dial, published in the
// well-known document.
type Gateway struct {
	URL        string // https, no credentials, query or fragment
	ServerName string // DNS name for TLS; empty when the URL's host serves
	Region     string // region of this gateway (Region shape); the gateway role needs one
	// Listen is the mutual-TLS listener's address; default all interfaces
	// on the URL's port (443 when it names none).
	Listen string
	// InternalListen is the address of the internal control API (mutual
	// TLS with the internal CA); empty serves none.
	InternalListen string
	// TLS is the serving certificate from the gateway serving CA; nil
	// issues one from the PKI bundle's serving CA at start.
	TLS *KeyPair
	// MaxStreams bounds the daemon sessions of this gateway; default 5,000.
	MaxStreams int
	// DrainDelay is the longest random delay a draining gateway gives
	// daemons before they reconnect elsewhere; default 60 s.
	DrainDelay time.Duration
	// DownAfter is how long a node's daemon may be out of session before
	// the node goes down; default 20 s (the gateway lease).
	DownAfter time.Duration
	// SessionTicketDays is how many days a TLS session ticket lets a
	// daemon resume its session, on any gateway of the deployment
	// (docs/gateway.md, "Session resumption"); 0, the default, gives no
	// tickets: every session is a full handshake.
	SessionTicketDays int
}

// MaxSessionTicketDays is crypto/tls's own cap on a ticket's life.
const MaxSessionTicketDays = 7

// Gateway defaults.
const (
	DefaultGatewayMaxStreams = 5000
	DefaultGatewayDrainDelay = 60 * time.Second
	DefaultGatewayDownAfter  = 20 * time.Second
)

// Plugin is one out-of-process plugin the api role starts and serves.
type Plugin struct {
	// ID is the plugin's id: its catalog's directory (plugins/<id>), its
	// route segment and the middle part of its actions.
	ID string
	// Path is the plugin's executable; SHA256 its expected checksum
	// (lowercase hex), checked at start and before every (re)start.
	Path   string
	SHA256 string
	// DataDir is the directory the plugin keeps its state in (made 0700
	// at start); default .service/plugins/<id>.
	DataDir string
}

// Downloads serves daemon binaries and a plugin archive.
type Downloads struct {
	Dir  string
	Blob string
}

// Images names the image source: a directory of image manifests, or the
// URL of an HTTP index of them (not both).
type Images struct {
	Dir string
	URL string
}

// Bootstrap configures how providerAccounts.bootstrap delivers the node
// daemon to a provider's machine.
type Bootstrap struct {
	// Agent is the compute-agent binary delivered to machines.
	Agent string
	// JoinURL is where machines reach the join endpoint; "" is baseURL.
	JoinURL string
}

// SupportBundles receives log bundles through presigned PUTs.
type SupportBundles struct {
	Blob     string
	MaxBytes int64 // default 256 MiB
}

// Secrets configures the secret store (an option of this build, not of the
// specification's table): the store secrets.put and secrets.delete use and
// secret:// references resolve through.
type Secrets struct {
	Store SecretStore // default database
}

// SecretStore names a secret store.
type SecretStore string

// Secret stores. With none the secrets methods and the resolver answer
// UNAVAILABLE.
const (
	// SecretStoreDatabase seals values with AES-256-GCM under a key derived
	// from the service secret and keeps them in the service's database.
	SecretStoreDatabase SecretStore = "database"
	SecretStoreNone     SecretStore = "none"
)

// Webhooks tunes the webhooks group (an option of this build; the
// specification names the switches, not their names).
type Webhooks struct {
	// AllowPrivateTargets lets webhook URLs and connections reach private,
	// loopback and other non-public addresses (tests, on-premises installs).
	AllowPrivateTargets bool
	// MaxPerTenant is the number of webhooks one tenant may hold; 1..1000,
	// default 20.
	MaxPerTenant int
	// AcceptAnyPattern accepts event patterns that match nothing in the
	// event catalog.
	AcceptAnyPattern bool
}

// Capacity tunes admission and placement.
type Capacity struct {
	Placer       Placer        // default inline
	MaxBatch     int           // 1..64, default 64
	MaxAttempts  int           // >= 1, default 3
	RollupEvery  time.Duration // default 5m
	UsageEvery   time.Duration // default 5m
	SpotNoticeMs int64         // default 120000
}

// Placer names where placement runs.
type Placer string

// Placers.
const (
	PlacerInline    Placer = "inline"
	PlacerPoolLease Placer = "pool-lease"
)

// Scheduler tunes scoring.
type Scheduler struct {
	Plugins []string
	Weights map[string]float64
	TopN    int // default 5
}

// Clock names the source of business time.
type Clock string

// Clocks.
const (
	ClockDatabase Clock = "database"
	ClockSystem   Clock = "system"
)

// Log configures the process logger.
type Log struct {
	Level string // debug, info, warn or error; default warn
}

// Workers tunes the worker roles.
type Workers struct {
	ID          string // empty: derived at startup
	BatchSize   int    // 1..1000, default 32
	Concurrency int    // 1..64, default 4
	PollMs      int    // 10..60000, default 1000
	ClaimTTLMs  int    // 1000..3600000, default 60000
	ResyncMs    int    // 1000..86400000, default 300000
}

// Metrics configures GET {path}; it is served only when Token is set.
type Metrics struct {
	Token string
	Path  string
}

// Role is a process role.
type Role string

// Roles of the specification. RoleAll is accepted in SERVICE_ROLES and
// the roles option and expanded by Load.
const (
	RoleAPI         Role = "api"
	RoleControllers Role = "controllers"
	RoleScheduler   Role = "scheduler"
	RoleSinks       Role = "sinks"
	RoleIAM         Role = "iam"
	RoleGateway     Role = "gateway"
	RoleAll         Role = "all"
)

// AllRoles lists the roles in the order Config.Roles keeps.
var AllRoles = []Role{RoleAPI, RoleControllers, RoleScheduler, RoleSinks, RoleIAM, RoleGateway}

// Error is an invalid configuration: INVALID_CONFIG, naming the option
// (internal/configerr, shared with the node daemon's settings).
type Error = configerr.Error

// TPM is the TPM join attestor's settings.
type TPM struct {
	// EndorsementKeys are the enrolled TPMs: the SHA-256 (lowercase hex)
	// of each endorsement key's public key in PKIX DER form.
	EndorsementKeys []string
}

// Cloud is the cloud instance-identity join attestor's settings: the
// providers whose machines present signed identity documents, and how old
// and for whom a document may be.
type Cloud struct {
	// Audience is the audience a document must name; "" is the join
	// endpoint, (bootstrap.joinUrl or baseURL) + /v1/join.
	Audience string
	// MaxAge bounds the age of a document (its iat): 1s to 1h, default 5m.
	MaxAge  time.Duration
	Issuers []CloudIssuer
}

// CloudIssuer is one provider's metadata service: the issuer its
// documents name, where its signing keys are published (JWKS), and the
// provider (as in providerAccounts) whose machines it vouches for.
type CloudIssuer struct {
	Issuer, JWKSURL, Provider string
}

// Cloud attestor bounds.
const (
	DefaultCloudMaxAge = 5 * time.Minute
	MaxCloudMaxAge     = time.Hour
	MaxCloudIssuers    = 16
)

// Attestors built into this version; an attestors entry naming another
// is refused.
var BuiltAttestors = []string{"tpm", "cloud"}

// MaxEnrolledTPMs bounds tpm.endorsementKeys.
const MaxEnrolledTPMs = 10000

// Errors is every problem of a configuration, in the order of the
// options. Load answers a single *Error when there is one problem and
// Errors when there are more; errors.As finds the first *Error of either.
type Errors = configerr.Errors

// Problems lists the problems of err: every one of an Errors, the one of
// an *Error, none otherwise.
func Problems(err error) []*Error { return configerr.Problems(err) }

// Join is nil for no problem, the problem for one, Errors for more.
func Join(list []*Error) error { return configerr.Join(list) }

// problems collects the problems of one load. An option is reported
// once: a problem within an option already reported (or around it) is a
// consequence of the first (a value of the wrong type, then missing).
type problems struct{ list Errors }

func (p *problems) add(err error) {
	for _, e := range Problems(err) {
		if !slices.ContainsFunc(p.list, func(have *Error) bool { return related(have.Option, e.Option) }) {
			p.list = append(p.list, e)
		}
	}
}

// related reports whether one option path is the other or within it.
func related(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	return a == b || (strings.HasPrefix(b, a) && (b[len(a)] == '.' || b[len(a)] == '['))
}

// err is nil, the one problem, or Errors.
func (p *problems) err() error { return configerr.Join(p.list) }
