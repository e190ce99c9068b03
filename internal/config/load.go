package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"computeplane/internal/blob"
	"computeplane/internal/wire"
)

// Load reads the file named by SERVICE_CONFIG (when set), applies the
// environment on top and validates the result. getenv is os.Getenv in a
// process; tests pass their own. The error is an *Error, or Errors when
// there is more than one problem: every problem is reported at once.
func Load(getenv func(string) string) (*Config, error) {
	return load(getenv, os.ReadFile)
}

// Check is Load for reporting: with problems it returns, besides them,
// the configuration as far as it was built (nil when the file did not
// parse), so that checks of later stages (host.CheckBuilt) report theirs
// too. Never run a process with a configuration Check found problems in.
func Check(getenv func(string) string) (*Config, error) {
	return check(getenv, os.ReadFile)
}

func load(getenv func(string) string, readFile func(string) ([]byte, error)) (*Config, error) {
	c, err := check(getenv, readFile)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func check(getenv func(string) string, readFile func(string) ([]byte, error)) (*Config, error) {
	b := &builder{env: map[string]string{}, getenv: getenv}
	fc := &fileConfig{}
	if path := getenv(EnvConfig); path != "" {
		data, err := readFile(path)
		if err != nil {
			return nil, &Error{Option: EnvConfig, Message: fmt.Sprintf("cannot read %s: %v", path, unwrapPathError(err))}
		}
		if fc = parseFile(data, &b.problems); fc == nil {
			return nil, b.problems.err() // nothing to check further
		}
	}
	b.applyEnv(fc, getenv)
	return b.build(fc)
}

func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// builder validates the file form and builds the Config. env records which
// options the environment set, to say so in errors.
type builder struct {
	env      map[string]string
	getenv   func(string) string
	pkiFile  string
	problems problems
}

// report keeps a problem and goes on.
func (b *builder) report(err error) {
	if err != nil {
		b.problems.add(err)
	}
}

// failed reports whether option (or anything within it) has a problem:
// checks that depend on it say nothing more.
func (b *builder) failed(option string) bool {
	return slices.ContainsFunc(b.problems.list, func(e *Error) bool { return related(e.Option, option) })
}

func (b *builder) errorf(option, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if v, ok := b.env[option]; ok {
		msg += " (set by " + v + ")"
	}
	return &Error{Option: option, Message: msg}
}

// applyEnv lets the environment override the file. An empty variable is
// unset.
func (b *builder) applyEnv(fc *fileConfig, getenv func(string) string) {
	str := func(option, name string, dst **string) {
		if v := getenv(name); v != "" {
			*dst = &v
			b.env[option] = name
		}
	}
	str("database", EnvDatabaseURL, &fc.Database)
	str("secret", EnvSecret, &fc.Secret)
	str("baseURL", EnvBaseURL, &fc.BaseURL)
	str("host", EnvHost, &fc.Host)
	if v := getenv(EnvPort); v != "" {
		b.env["port"] = EnvPort
		p, err := strconv.Atoi(v)
		if err != nil {
			b.report(b.errorf("port", "must be an integer from 0 to 65535"))
			fc.Port = nil
		} else {
			fc.Port = &p
		}
	}
	if v := getenv(EnvRoles); v != "" {
		b.env["roles"] = EnvRoles
		fc.Roles = strings.Split(v, ",")
		for i := range fc.Roles {
			fc.Roles[i] = strings.TrimSpace(fc.Roles[i])
		}
	}
	if v := getenv(EnvMetricsToken); v != "" {
		if fc.Metrics == nil {
			fc.Metrics = &fileMetrics{}
		}
		fc.Metrics.Token = &v
		b.env["metrics.token"] = EnvMetricsToken
	}
	gwURL, gwName, gwListen := getenv(EnvGatewayURL), getenv(EnvGatewayServerName), getenv(EnvGatewayListen)
	if gwURL != "" || gwName != "" || gwListen != "" {
		if fc.Gateway == nil {
			fc.Gateway = &fileGateway{}
		}
		str("gateway.url", EnvGatewayURL, &fc.Gateway.URL)
		str("gateway.serverName", EnvGatewayServerName, &fc.Gateway.ServerName)
		str("gateway.listen", EnvGatewayListen, &fc.Gateway.Listen)
	}
	if v := getenv(EnvDownloadsDir); v != "" {
		if fc.Downloads == nil {
			fc.Downloads = &fileDownloads{}
		}
		fc.Downloads.Dir = &v
		b.env["downloads.dir"] = EnvDownloadsDir
	}
	if v := getenv(EnvLogLevel); v != "" {
		if fc.Log == nil {
			fc.Log = &fileLog{}
		}
		fc.Log.Level = &v
		b.env["log.level"] = EnvLogLevel
	}
	if v := getenv(EnvPKI); v != "" {
		b.env["pkiFile"] = EnvPKI
		b.pkiFile = v
	}
}

// Shapes of the specification.
var (
	tenantIDRe   = wire.MustPattern(`^[A-Za-z0-9._:-]{1,128}$`)
	runtimeRe    = wire.MustPattern(`^[a-z][a-z0-9-]{0,63}$`) // RuntimeName: plugin, module, driver ... ids
	name63Re     = wire.MustPattern(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	regionRe     = wire.MustPattern(`^[a-z][a-z0-9-]{0,62}$`)
	workerIDRe   = wire.MustPattern(`^[A-Za-z0-9._:-]{1,128}$`)
	typePrefixRe = wire.MustPattern(`^[a-z][a-z0-9-]{0,31}$`)
	accountRe    = wire.MustPattern(`^[a-z_][a-z0-9_-]{0,31}$`) // POSIX user name
	// A DNS name of at least two labels, lowercase (tunnels.previewDomain).
	domainRe   = wire.MustPattern(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	dnsLabelRe = wire.MustPattern(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
)

func (b *builder) build(fc *fileConfig) (*Config, error) {
	c := &Config{}
	steps := []func(*fileConfig, *Config) error{
		b.core, b.iam, b.lists, b.plugins, b.tunnels, b.pki, b.notifier, b.sinks,
		b.proxies, b.gateway, b.downloads, b.images, b.bootstrap, b.supportBundles, b.secrets, b.webhooks, b.capacity, b.admission, b.shutdown,
		b.scheduler, b.misc, b.workers, b.metrics, b.listen, b.roles,
	}
	// Every step runs: a problem in one option does not hide another's.
	for _, step := range steps {
		b.report(step(fc, c))
	}
	return c, b.problems.err()
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// core: database, secret, baseURL, basePath, typePrefix; each is
// checked on its own.
func (b *builder) core(fc *fileConfig, c *Config) error {
	c.Database = deref(fc.Database, "")
	if c.Database == "" {
		b.report(b.errorf("database", "is required (set SERVICE_DATABASE_URL)"))
	} else if err := checkDatabase(c.Database); err != "" {
		b.report(b.errorf("database", "%s", err)) // never echo it: it may hold a password
	}

	c.Secret = deref(fc.Secret, "")
	if c.Secret == "" {
		b.report(b.errorf("secret", "is required (set SERVICE_SECRET)"))
	} else if n := utf8.RuneCountInString(c.Secret); n < MinSecretLength {
		b.report(b.errorf("secret", "must be at least %d characters, got %d", MinSecretLength, n))
	}

	// Unset, the public origin follows the listening port: a second local
	// process on PORT=3001 is http://localhost:3001.
	defaultBase := DefaultBaseURL
	if fc.Port != nil && *fc.Port > 0 && *fc.Port <= 65535 && *fc.Port != DefaultPort {
		defaultBase = "http://localhost:" + strconv.Itoa(*fc.Port)
	}
	if base, msg := checkOrigin(deref(fc.BaseURL, defaultBase)); msg != "" {
		b.report(b.errorf("baseURL", "%s", msg))
	} else {
		c.BaseURL = base
	}

	c.BasePath = deref(fc.BasePath, DefaultBasePath)
	if msg := checkAbsPath(c.BasePath); msg != "" {
		b.report(b.errorf("basePath", "%s", msg))
	} else if c.BasePath == "/" {
		b.report(b.errorf("basePath", "must not be / (use a path such as %s)", DefaultBasePath))
	}

	c.TypePrefix = deref(fc.TypePrefix, DefaultTypePrefix)
	if !typePrefixRe.MatchString(c.TypePrefix) {
		b.report(b.errorf("typePrefix", "must be 1 to 32 characters of a-z, 0-9 and -, starting with a letter"))
	}
	return nil
}

func checkDatabase(s string) string {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		if _, err := url.Parse(s); err != nil {
			return "must be a valid postgres:// URL"
		}
		return ""
	}
	if strings.Contains(s, "=") && !strings.Contains(s, "://") {
		return "" // key=value form; the driver checks the keys
	}
	return "must be a postgres:// URL or a key=value connection string"
}

// checkOrigin checks an origin: an absolute http or https URL without
// credentials, query, fragment or path. It returns the
// origin without a trailing slash.
func checkOrigin(s string) (string, string) {
	u, err := url.Parse(s)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return "", "must be an absolute URL such as https://compute.example.com"
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", "must use http or https"
	case u.User != nil:
		return "", "must not hold credentials"
	case u.RawQuery != "" || u.ForceQuery:
		return "", "must not have a query"
	case u.Fragment != "" || strings.Contains(s, "#"):
		return "", "must not have a fragment"
	case u.Path != "" && u.Path != "/":
		return "", "must be an origin, without a path"
	}
	if port := u.Port(); port != "" {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return "", "has an invalid port"
		}
	}
	if u.Hostname() == "" {
		return "", "must name a host"
	}
	return u.Scheme + "://" + u.Host, ""
}

// builtinRoutes are the host routes every deployment serves.
var builtinRoutes = []string{"/healthz", "/readyz", "/.well-known/service", "/watch"}

// checkHostRoute is checkAbsPath plus the rule for configurable host routes:
// outside the base path and not reusing a built-in path.
func checkHostRoute(p, basePath string) string {
	if msg := checkAbsPath(p); msg != "" {
		return msg
	}
	switch {
	case p == "/":
		return "must not be /"
	case p == basePath || strings.HasPrefix(p, basePath+"/"):
		return "must be outside the base path " + basePath
	case slices.Contains(builtinRoutes, p):
		return "must not reuse the built-in route " + p
	}
	return ""
}

func checkAbsPath(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return "must be an absolute path starting with /"
	case p != "/" && strings.HasSuffix(p, "/"):
		return "must not end with /"
	case strings.ContainsAny(p, "?# \t\r\n"), strings.Contains(p, "//"):
		return "must be a plain path without query, fragment, spaces or empty segments"
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "must not contain . or .. segments"
		}
	}
	return ""
}

func (b *builder) iam(fc *fileConfig, c *Config) error {
	fi := deref(fc.IAM, fileIAM{})
	kind := deref(fi.Kind, string(IAMEmbedded))
	if kind != string(IAMEmbedded) {
		return b.errorf("iam.kind", "must be embedded (the keeper of tenants and keys; external services go under iam.decisions and iam.authentication), got %q", kind)
	}
	c.IAM.Kind = IAMKind(kind)
	if err := b.iamDecisions(fi.Decisions, c); err != nil {
		return err
	}
	if err := b.iamAuthentication(fi.Authentication, c); err != nil {
		return err
	}
	if fi.RootTenantID != nil {
		if !tenantIDRe.MatchString(*fi.RootTenantID) {
			return b.errorf("iam.rootTenantId", "must be a TenantId: 1 to 128 characters of A-Z, a-z, 0-9 and . _ : -")
		}
		c.IAM.RootTenantID = *fi.RootTenantID
	}
	if fi.Events != nil {
		ev := &IAMEvents{Path: deref(fi.Events.Path, DefaultIAMEventsPath), Secret: deref(fi.Events.Secret, "")}
		if msg := checkHostRoute(ev.Path, c.BasePath); msg != "" {
			return b.errorf("iam.events.path", "%s", msg)
		}
		if ev.Secret == "" {
			return b.errorf("iam.events.secret", "is required when iam.events is configured")
		}
		if n := utf8.RuneCountInString(ev.Secret); n < MinSecretLength {
			return b.errorf("iam.events.secret", "must be at least %d characters, got %d", MinSecretLength, n)
		}
		c.IAM.Events = ev
	}

	switch {
	case fc.RootTenantID == nil:
		c.RootTenantID = cmpOr(c.IAM.RootTenantID, DefaultRootTenantID)
	case !tenantIDRe.MatchString(*fc.RootTenantID):
		return b.errorf("rootTenantId", "must be a TenantId: 1 to 128 characters of A-Z, a-z, 0-9 and . _ : -")
	case c.IAM.RootTenantID != "" && *fc.RootTenantID != c.IAM.RootTenantID:
		return b.errorf("rootTenantId", "must agree with iam.rootTenantId (%q)", c.IAM.RootTenantID)
	default:
		c.RootTenantID = *fc.RootTenantID
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkNames validates a list of ids: shape, no duplicates. Every bad
// entry is reported; the error is nil (the problems are kept).
func (b *builder) checkNames(option string, names []string, re wire.Pattern, shape string) ([]string, error) {
	seen := map[string]bool{}
	for i, n := range names {
		opt := fmt.Sprintf("%s[%d]", option, i)
		switch {
		case !re.MatchString(n):
			b.report(b.errorf(opt, "must be %s, got %q", shape, n))
		case seen[n]:
			b.report(b.errorf(opt, "duplicates %q", n))
		}
		seen[n] = true
	}
	return slices.Clone(names), nil
}

const runtimeShape = "1 to 64 characters of a-z, 0-9 and -, starting with a letter"

func (b *builder) lists(fc *fileConfig, c *Config) error {
	var err error
	for _, l := range []struct {
		option string
		in     []string
		out    *[]string
	}{
		{"modules", fc.Modules, &c.Modules},
		{"drivers", fc.Drivers, &c.Drivers},
		{"providers", fc.Providers, &c.Providers},
		{"attestors", fc.Attestors, &c.Attestors},
	} {
		if *l.out, err = b.checkNames(l.option, l.in, runtimeRe, runtimeShape); err != nil {
			return err
		}
	}
	return b.attestors(fc, c)
}

// attestors checks the join attestors: each one built in, and the TPM
// attestor's enrolled endorsement keys given exactly when it is named.
func (b *builder) attestors(fc *fileConfig, c *Config) error {
	for i, a := range c.Attestors {
		if !slices.Contains(BuiltAttestors, a) {
			return b.errorf(fmt.Sprintf("attestors[%d]", i), "attestor %q is not built into this version (built in: %s)", a, strings.Join(BuiltAttestors, ", "))
		}
	}
	if err := b.cloud(fc, c); err != nil {
		b.report(err)
	}
	tpm := slices.Contains(c.Attestors, "tpm")
	switch {
	case fc.TPM == nil && !tpm:
		return nil
	case fc.TPM != nil && !tpm:
		return b.errorf("tpm", "is set but attestors does not name tpm")
	case fc.TPM == nil || len(fc.TPM.EndorsementKeys) == 0:
		return b.errorf("tpm.endorsementKeys", "is required when attestors names tpm: the SHA-256 of each enrolled TPM's endorsement public key")
	case len(fc.TPM.EndorsementKeys) > MaxEnrolledTPMs:
		return b.errorf("tpm.endorsementKeys", "has %d entries; at most %d", len(fc.TPM.EndorsementKeys), MaxEnrolledTPMs)
	}
	seen := map[string]bool{}
	out := &TPM{}
	for i, k := range fc.TPM.EndorsementKeys {
		k = strings.ToLower(k)
		if len(k) != 64 || strings.Trim(k, "0123456789abcdef") != "" {
			return b.errorf(fmt.Sprintf("tpm.endorsementKeys[%d]", i), "must be 64 hexadecimal digits (the SHA-256 of the endorsement public key, PKIX DER)")
		}
		if seen[k] {
			return b.errorf(fmt.Sprintf("tpm.endorsementKeys[%d]", i), "is listed twice")
		}
		seen[k] = true
		out.EndorsementKeys = append(out.EndorsementKeys, k)
	}
	c.TPM = out
	return nil
}

// cloud checks the cloud instance-identity attestor's settings, given
// exactly when attestors names cloud: at least one issuer, each with an
// issuer, a JWKS URL (https, or http to a loopback host) and a provider.
func (b *builder) cloud(fc *fileConfig, c *Config) error {
	named := slices.Contains(c.Attestors, "cloud")
	fcl := fc.Cloud
	switch {
	case fcl == nil && !named:
		return nil
	case fcl != nil && !named:
		return b.errorf("cloud", "is set but attestors does not name cloud")
	case fcl == nil || len(fcl.Issuers) == 0:
		return b.errorf("cloud.issuers", "is required when attestors names cloud: the metadata services (issuer, jwksUrl, provider) whose documents are trusted")
	case len(fcl.Issuers) > MaxCloudIssuers:
		return b.errorf("cloud.issuers", "has %d entries; at most %d", len(fcl.Issuers), MaxCloudIssuers)
	}
	out := &Cloud{Audience: deref(fcl.Audience, ""), MaxAge: DefaultCloudMaxAge}
	if fcl.MaxAge != nil {
		d, err := time.ParseDuration(*fcl.MaxAge)
		if err != nil || d < time.Second || d > MaxCloudMaxAge {
			return b.errorf("cloud.maxAge", "must be a duration from 1s to 1h such as 5m, got %q", *fcl.MaxAge)
		}
		out.MaxAge = d
	}
	if out.Audience != "" {
		if u, err := url.Parse(out.Audience); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" || u.RawQuery != "" {
			return b.errorf("cloud.audience", "must be an absolute http or https URL without credentials, query or fragment (the join endpoint)")
		}
	}
	seen := map[string]bool{}
	for i, fi := range fcl.Issuers {
		opt := fmt.Sprintf("cloud.issuers[%d]", i)
		is := CloudIssuer{Issuer: deref(fi.Issuer, ""), JWKSURL: deref(fi.JWKSURL, ""), Provider: deref(fi.Provider, "")}
		if is.Issuer == "" || len(is.Issuer) > 512 {
			return b.errorf(opt+".issuer", "is required: the iss its documents carry (at most 512 characters)")
		}
		if seen[is.Issuer] {
			return b.errorf(opt+".issuer", "is listed twice")
		}
		seen[is.Issuer] = true
		u, err := url.Parse(is.JWKSURL)
		switch {
		case is.JWKSURL == "":
			return b.errorf(opt+".jwksUrl", "is required: where the issuer publishes its signing keys (JWKS)")
		case err != nil || u.Host == "" || u.User != nil || u.Fragment != "" || (u.Scheme != "https" && u.Scheme != "http"):
			return b.errorf(opt+".jwksUrl", "must be an absolute https URL without credentials or fragment, got %q", is.JWKSURL)
		case u.Scheme == "http" && !loopbackHost(u.Hostname()):
			return b.errorf(opt+".jwksUrl", "must be https (http only to a loopback host), got %q", is.JWKSURL)
		}
		if !runtimeRe.MatchString(is.Provider) {
			return b.errorf(opt+".provider", "must name the provider whose machines the issuer vouches for (%s)", runtimeShape)
		}
		if len(c.Providers) > 0 && !slices.Contains(c.Providers, is.Provider) {
			return b.errorf(opt+".provider", "names %q, which providers does not register", is.Provider)
		}
		out.Issuers = append(out.Issuers, is)
	}
	c.Cloud = out
	return nil
}

// pluginIDRe is a plugin id: a route segment, the middle part of the
// plugin's actions and a Go identifier stem of its generated code at once
// (tools/catalogc), hence narrower than RuntimeName.
var pluginIDRe = wire.MustPattern(`^[a-z][a-z0-9]{0,31}$`)

var sha256Re = wire.MustPattern(`^[0-9a-f]{64}$`)

// plugins checks the shape of each plugin entry; whether its binary is
// there and matches its checksum is the host's check (host.CheckBuilt).
func (b *builder) plugins(fc *fileConfig, c *Config) error {
	seen := map[string]bool{}
	for i, fp := range fc.Plugins {
		opt := fmt.Sprintf("plugins[%d]", i)
		p := Plugin{ID: deref(fp.ID, ""), Path: deref(fp.Path, ""), SHA256: deref(fp.SHA256, ""), DataDir: deref(fp.DataDir, "")}
		switch {
		case p.ID == "":
			b.report(b.errorf(opt+".id", "is required"))
		case !pluginIDRe.MatchString(p.ID):
			b.report(b.errorf(opt+".id", "must be 1 to 32 characters of a-z and 0-9, starting with a letter, got %q", p.ID))
		case seen[p.ID]:
			b.report(b.errorf(opt+".id", "duplicates %q", p.ID))
		}
		seen[p.ID] = true
		if p.Path == "" || strings.ContainsRune(p.Path, 0) {
			b.report(b.errorf(opt+".path", "is required: the plugin's executable"))
		}
		if !sha256Re.MatchString(p.SHA256) {
			b.report(b.errorf(opt+".sha256", "must be the SHA-256 of the executable in 64 lowercase hex digits (sha256sum prints it)"))
		}
		if p.DataDir == "" {
			p.DataDir = filepath.Join(".service", "plugins", p.ID)
		} else if strings.ContainsRune(p.DataDir, 0) {
			b.report(b.errorf(opt+".dataDir", "must be a directory path"))
		}
		c.Plugins = append(c.Plugins, p)
	}
	return nil
}

func (b *builder) tunnels(fc *fileConfig, c *Config) error {
	ft := fc.Tunnels
	if ft == nil {
		return nil
	}
	t := &Tunnels{
		SSH:            deref(ft.SSH, false),
		SSHRequiresMFA: deref(ft.SSHRequiresMFA, true),
		SSHAccounts:    []string{"root"},
	}
	issuer := deref(ft.Issuer, "")
	if issuer == "" {
		return b.errorf("tunnels.issuer", "is required when tunnels are configured")
	}
	origin, msg := checkOrigin(issuer)
	if msg != "" {
		return b.errorf("tunnels.issuer", "%s", msg)
	}
	if c.BaseURL != "" && origin != c.BaseURL { // a bad baseURL is reported already
		return b.errorf("tunnels.issuer", "must be the origin of baseURL (%s)", c.BaseURL)
	}
	t.Issuer = origin
	if d := deref(ft.PreviewDomain, ""); d != "" {
		// The wildcard's base: "*.preview.example.com" or
		// "preview.example.com" serve <port>-<id>.preview.example.com.
		d = strings.TrimPrefix(d, "*.")
		if len(d) > 200 || !domainRe.MatchString(d) {
			return b.errorf("tunnels.previewDomain", "must be a lowercase DNS name such as preview.example.com (a wildcard *.preview.example.com points at the api)")
		}
		t.PreviewDomain = d
	}
	if ft.SSHAccounts != nil {
		if len(ft.SSHAccounts) == 0 {
			return b.errorf("tunnels.sshAccounts", "must name at least one account")
		}
		accounts, err := b.checkNames("tunnels.sshAccounts", ft.SSHAccounts, accountRe, "a user name (1 to 32 characters of a-z, 0-9, _ and -)")
		if err != nil {
			return err
		}
		t.SSHAccounts = accounts
	}
	fl := deref(ft.Limits, fileTunnelLimits{})
	t.Limits.TunnelsPerMinute = deref(fl.TunnelsPerMinute, 10)
	if t.Limits.TunnelsPerMinute < 1 {
		return b.errorf("tunnels.limits.tunnelsPerMinute", "must be at least 1")
	}
	t.Limits.SSHCertificatesPerHour = deref(fl.SSHCertificatesPerHour, 20)
	if t.Limits.SSHCertificatesPerHour < 1 {
		return b.errorf("tunnels.limits.sshCertificatesPerHour", "must be at least 1")
	}
	t.Limits.OpenPerNode = deref(fl.OpenPerNode, 256)
	if t.Limits.OpenPerNode < 1 {
		return b.errorf("tunnels.limits.openPerNode", "must be at least 1")
	}
	t.Limits.OpenPerGateway = deref(fl.OpenPerGateway, 10000)
	if t.Limits.OpenPerGateway < 1 {
		return b.errorf("tunnels.limits.openPerGateway", "must be at least 1")
	}
	idle := deref(fl.IdleTimeoutMs, 3600000)
	if idle < 1000 {
		return b.errorf("tunnels.limits.idleTimeoutMs", "must be at least 1000")
	}
	t.Limits.IdleTimeout = time.Duration(idle) * time.Millisecond
	c.Tunnels = t
	return nil
}

func (b *builder) pki(fc *fileConfig, c *Config) error {
	c.PKIFile = cmpOr(b.pkiFile, DefaultPKIFile)
	fp := deref(fc.PKI, filePKI{})
	var err error
	for _, kp := range []struct {
		option   string
		in       *fileKeyPair
		out      **KeyPair
		needCert bool
	}{
		{"pki.nodeCa", fp.NodeCA, &c.PKI.NodeCA, true},
		{"pki.servingCa", fp.ServingCA, &c.PKI.ServingCA, true},
		{"pki.join", fp.Join, &c.PKI.Join, false},
		{"pki.commandSigning", fp.CommandSigning, &c.PKI.CommandSigning, false},
	} {
		if *kp.out, err = b.keyPair(kp.option, kp.in, kp.needCert); err != nil {
			b.report(err)
		}
	}
	for i, r := range fp.CommandSigningRoots {
		opt := fmt.Sprintf("pki.commandSigningRoots[%d]", i)
		p, err := b.pem(opt, "pem", "file", r.PEM, r.File, "CERTIFICATE")
		switch {
		case err != nil:
			b.report(err)
		case p.IsZero():
			b.report(b.errorf(opt, "needs pem or file"))
		default:
			c.PKI.CommandSigningRoots = append(c.PKI.CommandSigningRoots, p)
		}
	}
	c.PKI.TrustVersion = deref(fp.TrustVersion, 1)
	if c.PKI.TrustVersion < 1 {
		return b.errorf("pki.trustVersion", "must be at least 1")
	}
	return nil
}

func (b *builder) keyPair(option string, in *fileKeyPair, needCert bool) (*KeyPair, error) {
	if in == nil {
		return nil, nil
	}
	cert, err := b.pem(option, "cert", "certFile", in.Cert, in.CertFile, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	key, err := b.pem(option, "key", "keyFile", in.Key, in.KeyFile, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	if key.IsZero() {
		return nil, b.errorf(option+".key", "is required: give key (PEM) or keyFile")
	}
	if needCert && cert.IsZero() {
		return nil, b.errorf(option+".cert", "is required: give cert (PEM) or certFile")
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// pem reads one PEM given inline (key inlineKey) or as a file (fileKey).
func (b *builder) pem(option, inlineKey, fileKey string, inline, file *string, kind string) (PEM, error) {
	p := PEM{Inline: deref(inline, ""), File: deref(file, "")}
	switch {
	case p.Inline != "" && p.File != "":
		return PEM{}, b.errorf(join(option, inlineKey), "give %s or %s, not both", inlineKey, fileKey)
	case p.Inline != "" && !(strings.Contains(p.Inline, "-----BEGIN ") && strings.Contains(p.Inline, kind)):
		return PEM{}, b.errorf(join(option, inlineKey), "must be PEM text holding a %s block", kind)
	case strings.ContainsRune(p.File, 0):
		return PEM{}, b.errorf(join(option, fileKey), "must be a file path")
	}
	return p, nil
}

func (b *builder) notifier(fc *fileConfig, c *Config) error {
	if fc.Notifier == nil {
		return nil
	}
	switch k := deref(fc.Notifier.Kind, ""); NotifierKind(k) {
	case NotifierPostgres, NotifierNone:
		c.Notifier = &Notifier{Kind: NotifierKind(k)}
	case "":
		return b.errorf("notifier.kind", "is required: postgres or none")
	default:
		return b.errorf("notifier.kind", "must be postgres or none, got %q", k)
	}
	return nil
}

func (b *builder) sinks(fc *fileConfig, c *Config) error {
	if fc.Sinks == nil {
		return nil
	}
	if fc.Sinks.Usage != nil {
		b.report(b.errorf("sinks.usage", "usage sinks are invalid: usage goes to billing through the identity bridge"))
	}
	c.Sinks.Events = b.sinkList("sinks.events", fc.Sinks.Events)
	c.Sinks.Audit = b.sinkList("sinks.audit", fc.Sinks.Audit)
	return nil
}

func (b *builder) sinkList(option string, in []fileSink) []Sink {
	var out []Sink
	seen := map[string]bool{}
	for i, fs := range in {
		opt := fmt.Sprintf("%s[%d]", option, i)
		s := Sink{ID: deref(fs.ID, ""), Kind: SinkKind(deref(fs.Kind, "")), URL: deref(fs.URL, ""), Path: deref(fs.Path, "")}
		if err := b.sink(opt, s, seen); err != nil {
			b.report(err) // and on to the next sink
			continue
		}
		out = append(out, s)
	}
	return out
}

func (b *builder) sink(opt string, s Sink, seen map[string]bool) error {
	switch {
	case s.ID == "":
		return b.errorf(opt+".id", "is required")
	case !name63Re.MatchString(s.ID):
		return b.errorf(opt+".id", "must be 1 to 63 characters of a-z, 0-9, . _ and -, starting with a letter or digit")
	case seen[s.ID]:
		return b.errorf(opt+".id", "duplicates %q: sink ids are unique among their kind", s.ID)
	}
	seen[s.ID] = true
	switch s.Kind {
	case SinkHTTP:
		if s.Path != "" {
			return b.errorf(opt+".path", "belongs to file sinks; http sinks take url")
		}
		if s.URL == "" {
			return b.errorf(opt+".url", "is required for an http sink")
		}
		if msg := checkEndpoint(s.URL); msg != "" {
			return b.errorf(opt+".url", "%s", msg)
		}
	case SinkFile:
		if s.URL != "" {
			return b.errorf(opt+".url", "belongs to http sinks; file sinks take path")
		}
		if s.Path == "" || strings.ContainsRune(s.Path, 0) {
			return b.errorf(opt+".path", "is required for a file sink")
		}
	case "":
		return b.errorf(opt+".kind", "is required: http or file")
	default:
		return b.errorf(opt+".kind", "must be http or file, got %q", s.Kind)
	}
	return nil
}

// checkEndpoint checks an absolute http(s) URL without credentials or
// fragment; a path and query are allowed.
func checkEndpoint(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil || !u.IsAbs() || u.Hostname() == "":
		return "must be an absolute http or https URL"
	case u.Scheme != "http" && u.Scheme != "https":
		return "must use http or https"
	case u.User != nil:
		return "must not hold credentials"
	case u.Fragment != "" || strings.Contains(s, "#"):
		return "must not have a fragment"
	}
	return ""
}

func (b *builder) proxies(fc *fileConfig, c *Config) error {
	for i, s := range fc.TrustedProxies {
		opt := fmt.Sprintf("trustedProxies[%d]", i)
		var p netip.Prefix
		if strings.Contains(s, "/") {
			pp, err := netip.ParsePrefix(s)
			if err != nil {
				b.report(b.errorf(opt, "must be an IPv4 or IPv6 address or CIDR range, got %q", s))
				continue
			}
			p = pp.Masked()
		} else {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				b.report(b.errorf(opt, "must be an IPv4 or IPv6 address or CIDR range, got %q", s))
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		c.TrustedProxies = append(c.TrustedProxies, p)
	}
	return nil
}

func (b *builder) gateway(fc *fileConfig, c *Config) error {
	fg := fc.Gateway
	if fg == nil {
		return nil
	}
	g := &Gateway{URL: deref(fg.URL, ""), ServerName: deref(fg.ServerName, ""), Region: deref(fg.Region, ""),
		Listen:            deref(fg.Listen, ""),
		InternalListen:    deref(fg.InternalListen, ""),
		MaxStreams:        deref(fg.MaxStreams, DefaultGatewayMaxStreams),
		DrainDelay:        time.Duration(deref(fg.DrainDelayMs, int(DefaultGatewayDrainDelay/time.Millisecond))) * time.Millisecond,
		DownAfter:         time.Duration(deref(fg.DownAfterMs, int(DefaultGatewayDownAfter/time.Millisecond))) * time.Millisecond,
		SessionTicketDays: deref(fg.SessionTicketDays, 0),
	}
	switch {
	case g.MaxStreams < 1 || g.MaxStreams > 1_000_000:
		return b.errorf("gateway.maxStreams", "must be 1 to 1000000")
	case g.DrainDelay < 0 || g.DrainDelay > DefaultGatewayDrainDelay:
		return b.errorf("gateway.drainDelayMs", "must be 0 to 60000")
	case g.DownAfter < time.Second || g.DownAfter > time.Hour:
		return b.errorf("gateway.downAfterMs", "must be 1000 to 3600000")
	case g.SessionTicketDays < 0 || g.SessionTicketDays > MaxSessionTicketDays:
		return b.errorf("gateway.sessionTicketDays", "must be 0 (no session resumption) to 7")
	}
	var err error
	if g.TLS, err = b.keyPair("gateway.tls", fg.TLS, true); err != nil {
		return err
	}
	if g.URL == "" {
		return b.errorf("gateway.url", "is required when a gateway is configured")
	}
	u, err := url.Parse(g.URL)
	switch {
	case err != nil || !u.IsAbs() || u.Hostname() == "":
		return b.errorf("gateway.url", "must be an absolute https URL")
	case u.Scheme != "https":
		return b.errorf("gateway.url", "must use https")
	case u.User != nil:
		return b.errorf("gateway.url", "must not hold credentials")
	case u.RawQuery != "" || u.ForceQuery:
		return b.errorf("gateway.url", "must not have a query")
	case u.Fragment != "" || strings.Contains(g.URL, "#"):
		return b.errorf("gateway.url", "must not have a fragment")
	}
	if g.ServerName != "" {
		if msg := checkDNSName(g.ServerName); msg != "" {
			return b.errorf("gateway.serverName", "%s", msg)
		}
	}
	if g.Region != "" && !regionRe.MatchString(g.Region) {
		return b.errorf("gateway.region", "must be a Region: 1 to 63 characters of a-z, 0-9 and -, starting with a letter")
	}
	if g.Listen == "" {
		g.Listen = ":" + cmpOr(u.Port(), "443")
	} else if _, _, err := net.SplitHostPort(g.Listen); err != nil {
		return b.errorf("gateway.listen", "must be host:port (host may be empty)")
	}
	if g.InternalListen != "" {
		if _, _, err := net.SplitHostPort(g.InternalListen); err != nil {
			return b.errorf("gateway.internalListen", "must be host:port (host may be empty)")
		}
	}
	c.Gateway = g
	return nil
}

func checkDNSName(s string) string {
	if _, err := netip.ParseAddr(s); err == nil {
		return "must be a DNS name, not an IP address"
	}
	name := strings.TrimSuffix(s, ".")
	if name == "" || len(name) > 253 {
		return "must be a DNS name of at most 253 characters"
	}
	for _, label := range strings.Split(name, ".") {
		if !dnsLabelRe.MatchString(label) {
			return fmt.Sprintf("must be a DNS name; label %q is not valid", label)
		}
	}
	return ""
}

func (b *builder) downloads(fc *fileConfig, c *Config) error {
	fd := fc.Downloads
	if fd == nil {
		return nil
	}
	d := &Downloads{Dir: deref(fd.Dir, ""), Blob: deref(fd.Blob, "")}
	if d.Dir == "" && d.Blob == "" {
		return b.errorf("downloads", "needs dir or blob (or both)")
	}
	if strings.ContainsRune(d.Dir, 0) {
		return b.errorf("downloads.dir", "must be a directory path")
	}
	if d.Blob != "" {
		if _, err := blob.ParseURL(d.Blob); err != nil {
			return b.errorf("downloads.blob", "%s", err.Error())
		}
	}
	c.Downloads = d
	return nil
}

func (b *builder) images(fc *fileConfig, c *Config) error {
	fi := fc.Images
	if fi == nil {
		return nil
	}
	im := &Images{Dir: deref(fi.Dir, ""), URL: deref(fi.URL, "")}
	switch {
	case (im.Dir == "") == (im.URL == ""):
		return b.errorf("images", "needs dir or url (one of them)")
	case strings.ContainsRune(im.Dir, 0):
		return b.errorf("images.dir", "must be a directory path")
	case im.URL != "":
		u, err := url.Parse(im.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" {
			return b.errorf("images.url", "must be an absolute http or https URL without credentials or fragment")
		}
	}
	c.Images = im
	return nil
}

func (b *builder) bootstrap(fc *fileConfig, c *Config) error {
	if fc.ProviderDir != nil {
		if *fc.ProviderDir == "" || strings.ContainsRune(*fc.ProviderDir, 0) {
			return b.errorf("providerDir", "must be a directory path")
		}
		c.ProviderDir = *fc.ProviderDir
	}
	fb := fc.Bootstrap
	if fb == nil {
		return nil
	}
	bs := &Bootstrap{Agent: deref(fb.Agent, ""), JoinURL: strings.TrimSuffix(deref(fb.JoinURL, ""), "/")}
	// With downloads served, bootstraps download the daemon from there
	// and agent is not used.
	if (bs.Agent == "" && c.Downloads == nil) || strings.ContainsRune(bs.Agent, 0) {
		return b.errorf("bootstrap.agent", "must be the path of the compute-agent binary delivered to machines (or serve downloads)")
	}
	if bs.JoinURL != "" {
		u, err := url.Parse(bs.JoinURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" || u.RawQuery != "" {
			return b.errorf("bootstrap.joinUrl", "must be an absolute http or https URL without credentials, query or fragment")
		}
	}
	c.Bootstrap = bs
	return nil
}

const defaultSupportBundleBytes = 256 << 20

func (b *builder) supportBundles(fc *fileConfig, c *Config) error {
	fs := fc.SupportBundles
	if fs == nil {
		return nil
	}
	sb := &SupportBundles{Blob: deref(fs.Blob, ""), MaxBytes: deref(fs.MaxBytes, defaultSupportBundleBytes)}
	if sb.Blob == "" {
		return b.errorf("supportBundles.blob", "is required when support bundles are configured")
	}
	if _, err := blob.ParseURL(sb.Blob); err != nil {
		return b.errorf("supportBundles.blob", "%s", err.Error())
	}
	if sb.MaxBytes < 1 {
		return b.errorf("supportBundles.maxBytes", "must be a positive integer")
	}
	c.SupportBundles = sb
	return nil
}

func (b *builder) secrets(fc *fileConfig, c *Config) error {
	fs := deref(fc.Secrets, fileSecrets{})
	switch st := SecretStore(deref(fs.Store, string(SecretStoreDatabase))); st {
	case SecretStoreDatabase, SecretStoreNone:
		c.Secrets.Store = st
	default:
		return b.errorf("secrets.store", "must be database or none, got %q", st)
	}
	return nil
}

func (b *builder) webhooks(fc *fileConfig, c *Config) error {
	fw := deref(fc.Webhooks, fileWebhooks{})
	c.Webhooks.AllowPrivateTargets = deref(fw.AllowPrivateTargets, false)
	c.Webhooks.AcceptAnyPattern = deref(fw.AcceptAnyPattern, false)
	c.Webhooks.MaxPerTenant = deref(fw.MaxPerTenant, 20)
	if c.Webhooks.MaxPerTenant < 1 || c.Webhooks.MaxPerTenant > 1000 {
		return b.errorf("webhooks.maxPerTenant", "must be from 1 to 1000")
	}
	return nil
}

func (b *builder) capacity(fc *fileConfig, c *Config) error {
	fcap := deref(fc.Capacity, fileCapacity{})
	switch p := Placer(deref(fcap.Placer, string(PlacerInline))); p {
	case PlacerInline, PlacerPoolLease:
		c.Capacity.Placer = p
	default:
		b.report(b.errorf("capacity.placer", "must be inline or pool-lease, got %q", p))
	}
	c.Capacity.MaxBatch = deref(fcap.MaxBatch, 64)
	if c.Capacity.MaxBatch < 1 || c.Capacity.MaxBatch > 64 {
		b.report(b.errorf("capacity.maxBatch", "must be from 1 to 64"))
	}
	c.Capacity.MaxAttempts = deref(fcap.MaxAttempts, 3)
	if c.Capacity.MaxAttempts < 1 {
		b.report(b.errorf("capacity.maxAttempts", "must be at least 1"))
	}
	var err error
	if c.Capacity.RollupEvery, err = b.period("capacity.rollupEvery", fcap.RollupEvery); err != nil {
		b.report(err)
	}
	if c.Capacity.UsageEvery, err = b.period("capacity.usageEvery", fcap.UsageEvery); err != nil {
		b.report(err)
	}
	c.Capacity.SpotNoticeMs = deref(fcap.SpotNoticeMs, 120000)
	if c.Capacity.SpotNoticeMs < 0 {
		b.report(b.errorf("capacity.spotNoticeMs", "must be at least 0"))
	}
	return nil
}

func (b *builder) period(option string, s *string) (time.Duration, error) {
	if s == nil {
		return 5 * time.Minute, nil
	}
	d, err := time.ParseDuration(*s)
	if err != nil {
		return 0, b.errorf(option, "must be a duration such as 5m or 30s, got %q", *s)
	}
	if d < time.Second {
		return 0, b.errorf(option, "must be at least 1s")
	}
	return d, nil
}

func (b *builder) scheduler(fc *fileConfig, c *Config) error {
	fs := deref(fc.Scheduler, fileScheduler{})
	var err error
	if c.Scheduler.Plugins, err = b.checkNames("scheduler.plugins", fs.Plugins, runtimeRe, runtimeShape); err != nil {
		return err
	}
	keys := make([]string, 0, len(fs.Weights))
	for k := range fs.Weights {
		keys = append(keys, k)
	}
	slices.Sort(keys) // report the same problem first every time
	for _, k := range keys {
		w := fs.Weights[k]
		opt := "scheduler.weights." + k
		if !runtimeRe.MatchString(k) {
			b.report(b.errorf(opt, "must name a scorer: %s", runtimeShape))
		} else if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			b.report(b.errorf(opt, "must be a number at least 0"))
		}
	}
	if len(fs.Weights) > 0 {
		c.Scheduler.Weights = fs.Weights
	}
	c.Scheduler.TopN = deref(fs.TopN, 5)
	if c.Scheduler.TopN < 1 {
		return b.errorf("scheduler.topN", "must be at least 1")
	}
	return nil
}

// misc: acceptIamCookie, clock, log.
func (b *builder) misc(fc *fileConfig, c *Config) error {
	c.AcceptIAMCookie = deref(fc.AcceptIAMCookie, false)
	switch k := Clock(deref(fc.Clock, string(ClockDatabase))); k {
	case ClockDatabase, ClockSystem:
		c.Clock = k
	default:
		return b.errorf("clock", "must be database or system, got %q", k)
	}
	level := deref(deref(fc.Log, fileLog{}).Level, "warn")
	switch level {
	case "debug", "info", "warn", "error":
		c.Log.Level = level
	default:
		return b.errorf("log.level", "must be debug, info, warn or error, got %q", level)
	}
	return nil
}

func (b *builder) workers(fc *fileConfig, c *Config) error {
	fw := deref(fc.Workers, fileWorkers{})
	c.Workers.ID = deref(fw.ID, "")
	if fw.ID != nil && !workerIDRe.MatchString(c.Workers.ID) {
		return b.errorf("workers.id", "must be 1 to 128 characters of A-Z, a-z, 0-9 and . _ : -")
	}
	for _, r := range []struct {
		option        string
		in            *int
		out           *int
		def, min, max int
	}{
		{"workers.batchSize", fw.BatchSize, &c.Workers.BatchSize, 32, 1, 1000},
		{"workers.concurrency", fw.Concurrency, &c.Workers.Concurrency, 4, 1, 64},
		{"workers.pollMs", fw.PollMs, &c.Workers.PollMs, 1000, 10, 60000},
		{"workers.claimTtlMs", fw.ClaimTTLMs, &c.Workers.ClaimTTLMs, 60000, 1000, 3600000},
		{"workers.resyncMs", fw.ResyncMs, &c.Workers.ResyncMs, 300000, 1000, 86400000},
	} {
		*r.out = deref(r.in, r.def)
		if *r.out < r.min || *r.out > r.max {
			b.report(b.errorf(r.option, "must be from %d to %d", r.min, r.max))
		}
	}
	return nil
}

func (b *builder) metrics(fc *fileConfig, c *Config) error {
	fm := deref(fc.Metrics, fileMetrics{})
	c.Metrics.Token = deref(fm.Token, "")
	if c.Metrics.Token != "" && utf8.RuneCountInString(c.Metrics.Token) < MinMetricsToken {
		b.report(b.errorf("metrics.token", "must be at least %d characters", MinMetricsToken))
	}
	c.Metrics.Path = deref(fm.Path, DefaultMetricsPath)
	if msg := checkHostRoute(c.Metrics.Path, c.BasePath); msg != "" {
		return b.errorf("metrics.path", "%s", msg)
	}
	if c.IAM.Events != nil && c.IAM.Events.Path == c.Metrics.Path {
		return b.errorf("metrics.path", "must differ from iam.events.path")
	}
	return nil
}

func (b *builder) listen(fc *fileConfig, c *Config) error {
	c.Host = deref(fc.Host, DefaultHost)
	if _, err := netip.ParseAddr(c.Host); err != nil {
		if msg := checkDNSName(c.Host); msg != "" {
			b.report(b.errorf("host", "must be an IP address or a host name"))
		}
	}
	c.Port = deref(fc.Port, DefaultPort)
	if c.Port < 0 || c.Port > 65535 {
		return b.errorf("port", "must be an integer from 0 to 65535")
	}
	return nil
}

func (b *builder) roles(fc *fileConfig, c *Config) error {
	names := fc.Roles
	if len(names) == 0 {
		names = []string{string(RoleAll)}
	}
	want := map[Role]bool{}
	for i, n := range names {
		opt := "roles"
		if b.env["roles"] == "" {
			opt = fmt.Sprintf("roles[%d]", i)
		}
		switch r := Role(n); r {
		case RoleAll:
			for _, r := range AllRoles {
				if r != RoleGateway || c.Gateway != nil {
					want[r] = true
				}
			}
		case RoleAPI, RoleControllers, RoleScheduler, RoleSinks, RoleIAM:
			want[r] = true
		case RoleGateway:
			if c.Gateway == nil && !b.failed("gateway") { // a bad gateway option is reported already
				b.report(b.errorf(opt, "the gateway role needs the gateway option (gateway.url)"))
			}
			want[r] = true
		case "":
			b.report(b.errorf(opt, "has an empty role name"))
		default:
			b.report(b.errorf(opt, "unknown role %q: use api, controllers, scheduler, sinks, iam, gateway or all", n))
		}
	}
	for _, r := range AllRoles {
		if want[r] {
			c.Roles = append(c.Roles, r)
		}
	}
	return nil
}

// iamDecisions checks iam.decisions: one external decision service.
func (b *builder) iamDecisions(fd *fileIAMDecisions, c *Config) error {
	if fd == nil {
		return nil
	}
	if fd.SpiceDB == nil {
		return b.errorf("iam.decisions", "must name a decision service: spicedb")
	}
	f := fd.SpiceDB
	s := &SpiceDB{
		Endpoint:        deref(f.Endpoint, ""),
		PresharedKeyEnv: deref(f.PresharedKeyEnv, DefaultSpiceDBKeyEnv),
		Plaintext:       deref(f.Plaintext, false),
		CAFile:          deref(f.CAFile, ""),
		Timeout:         DefaultSpiceDBTimeout,
	}
	host, port, err := net.SplitHostPort(s.Endpoint)
	if err != nil || host == "" || port == "" {
		return b.errorf("iam.decisions.spicedb.endpoint", "must be host:port, got %q", s.Endpoint)
	}
	if s.Plaintext && !loopbackHost(host) {
		return b.errorf("iam.decisions.spicedb.plaintext", "is allowed only to a loopback host, not %q: use TLS (caFile)", host)
	}
	if s.Plaintext && s.CAFile != "" {
		return b.errorf("iam.decisions.spicedb.caFile", "cannot be combined with plaintext")
	}
	if !envNameRe.MatchString(s.PresharedKeyEnv) {
		return b.errorf("iam.decisions.spicedb.presharedKeyEnv", "must name an environment variable, got %q", s.PresharedKeyEnv)
	}
	if s.PresharedKey = b.getenv(s.PresharedKeyEnv); s.PresharedKey == "" {
		return b.errorf("iam.decisions.spicedb.presharedKeyEnv", "names %s, which is not set: the preshared key is required", s.PresharedKeyEnv)
	}
	if f.TimeoutMs != nil {
		if *f.TimeoutMs < 100 || *f.TimeoutMs > 10000 {
			return b.errorf("iam.decisions.spicedb.timeoutMs", "must be 100 to 10000, got %d", *f.TimeoutMs)
		}
		s.Timeout = time.Duration(*f.TimeoutMs) * time.Millisecond
	}
	c.IAM.Decisions = &IAMDecisions{SpiceDB: s}
	return nil
}

// iamAuthentication checks iam.authentication: one external OIDC provider.
func (b *builder) iamAuthentication(fa *fileIAMAuthentication, c *Config) error {
	if fa == nil {
		return nil
	}
	if fa.OIDC == nil {
		return b.errorf("iam.authentication", "must name an authentication service: oidc")
	}
	f := fa.OIDC
	o := &OIDC{
		Issuer:      deref(f.Issuer, ""),
		Audience:    deref(f.Audience, ""),
		TenantClaim: deref(f.TenantClaim, DefaultOIDCTenantClaim),
		CAFile:      deref(f.CAFile, ""),
		Timeout:     DefaultOIDCTimeout,
	}
	u, err := url.Parse(o.Issuer)
	switch {
	case o.Issuer == "" || err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "":
		return b.errorf("iam.authentication.oidc.issuer", "must be an absolute URL without query or fragment, got %q", o.Issuer)
	case u.Scheme == "http" && !loopbackHost(u.Hostname()):
		return b.errorf("iam.authentication.oidc.issuer", "must be https (http only to a loopback host), got %q", o.Issuer)
	case u.Scheme != "http" && u.Scheme != "https":
		return b.errorf("iam.authentication.oidc.issuer", "must be https, got %q", o.Issuer)
	}
	if o.Audience == "" {
		return b.errorf("iam.authentication.oidc.audience", "is required: tokens for other audiences are refused")
	}
	if !claimRe.MatchString(o.TenantClaim) {
		return b.errorf("iam.authentication.oidc.tenantClaim", "must be a claim name of 1 to 64 characters of A-Z, a-z, 0-9, _ . : / -, got %q", o.TenantClaim)
	}
	if f.TimeoutMs != nil {
		if *f.TimeoutMs < 100 || *f.TimeoutMs > 10000 {
			return b.errorf("iam.authentication.oidc.timeoutMs", "must be 100 to 10000, got %d", *f.TimeoutMs)
		}
		o.Timeout = time.Duration(*f.TimeoutMs) * time.Millisecond
	}
	c.IAM.Authentication = &IAMAuthentication{OIDC: o}
	return nil
}

var (
	envNameRe = wire.MustPattern(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	claimRe   = wire.MustPattern(`^[A-Za-z0-9_.:/-]{1,64}$`)
)

// loopbackHost reports whether host is localhost or a loopback address.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
