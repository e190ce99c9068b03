package host

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane"
	"computeplane/gen/api"
	"computeplane/gen/db"
	gendocs "computeplane/gen/docs"
	"computeplane/internal/admission"
	"computeplane/internal/audit"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/cursor"
	"computeplane/internal/downloads"
	"computeplane/internal/events"
	"computeplane/internal/flavors"
	"computeplane/internal/gateway"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/iam/oidc"
	"computeplane/internal/iam/spicedb"
	"computeplane/internal/images"
	"computeplane/internal/instances"
	"computeplane/internal/join"
	"computeplane/internal/keys"
	"computeplane/internal/metrics"
	"computeplane/internal/nodes"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/pki"
	"computeplane/internal/placement"
	"computeplane/internal/plugins"
	"computeplane/internal/pools"
	"computeplane/internal/profiles"
	"computeplane/internal/projects"
	"computeplane/internal/provideraccounts"
	"computeplane/internal/quotas"
	"computeplane/internal/reservations"
	"computeplane/internal/rpc"
	"computeplane/internal/sandboxes"
	"computeplane/internal/sandboxtemplates"
	"computeplane/internal/sandboxvolumes"
	"computeplane/internal/secrets"
	"computeplane/internal/server"
	"computeplane/internal/sinks"
	"computeplane/internal/sites"
	"computeplane/internal/store"
	"computeplane/internal/supportbundles"
	"computeplane/internal/system"
	"computeplane/internal/tunnels"
	"computeplane/internal/uow"
	"computeplane/internal/usage"
	"computeplane/internal/webhooks"
	"computeplane/internal/workers"
	"computeplane/internal/workflows"
)

// assembly is what the roles of one process are built from and share:
// Assemble fills it one role at a time.
type assembly struct {
	cfg     *config.Config
	st      *store.Store
	log     *slog.Logger
	plugins builtin.Plugins
	now     func() time.Time
	bundle  func() (*pki.Bundle, error)
	// draining makes /readyz fail once shutdown began (Host.Serve).
	draining *atomic.Bool

	siblings []*store.Store // pools opened beside st, closed with the host
	closers  []func()       // other connections closed with the host
	gw       *system.Gateway
	cursors  *cursor.Sealer
	sinkList []sinks.Sink
	placer   *placement.Engine
	images   images.Source
	reg      *metrics.Registry
	notifier *notify.Notifier
	// internalAPI calls gateways' internal control API (wakes, tunnels).
	internalAPI *gateway.InternalClient
	// gwRole is this process's gateway (nil: it runs none), set once
	// built, before any call is served.
	gwRole *gateway.Gateway

	// The groups' services, and those of them jobs and the gateway use.
	services      *api.Services
	reservations  *reservations.Service
	sandboxes     *sandboxes.Service
	tunnels       *tunnels.Service
	relay         *tunnels.Relay // nil without the tunnels option
	secrets       *secrets.Service
	providerAccts *provideraccounts.Service
	bundles       *supportbundles.Service

	identity *embedded.Service
	port     iam.Port // identity, or an external adapter in front of it
	cached   *iam.Cached
	gate     rpc.Gate

	// follow keeps an external decision service's role bindings in step
	// with the identity inbox (nil with embedded decisions).
	follow func(ctx context.Context, in iam.Inbox, every time.Duration, wake <-chan struct{})

	// pluginHost runs the configured plugins (in the api role) and serves
	// their methods.
	pluginHost *plugins.Host
}

// Assemble builds the host around an open store: services, registry check,
// envelope and routes. Tests use it with a store of their own.
func Assemble(cfg *config.Config, st *store.Store, log *slog.Logger, builtIn builtin.Plugins, ov Overrides) (_ *Host, err error) {
	if err := refuseUnbuilt(cfg); err != nil {
		return nil, err
	}
	if err := plugins.Check(cfg.Plugins); err != nil {
		return nil, err
	}
	if builtIn.Drivers, err = enabledDrivers(cfg, builtIn.Drivers); err != nil {
		return nil, err
	}
	a := &assembly{cfg: cfg, st: st, log: log, plugins: builtIn, now: time.Now, bundle: pki.Loader(cfg.PKIFile, cfg.Secret), draining: &atomic.Bool{}}
	if ov.Now != nil {
		a.now = ov.Now
	}
	defer func() {
		if err != nil {
			closeAll(a.siblings)
			for _, c := range a.closers {
				c()
			}
		}
	}()
	if err := a.groupServices(ov); err != nil {
		return nil, err
	}
	if err := a.identityPort(ov); err != nil {
		return nil, err
	}
	a.reg = metrics.NewRegistry()
	// The notifier's connections open in Serve; until then wakes stay in
	// the process.
	a.notifier = notify.New(cfg.Notifier, st.Pool(), log)
	a.internalAPI = gateway.NewInternalClient(st, a.bundle, log)
	envelope, watch, err := a.apiRole()
	if err != nil {
		return nil, err
	}
	runner, dispatch, queue, err := a.workerRoles()
	if err != nil {
		return nil, err
	}
	gwRole, err := a.gatewayRole()
	if err != nil {
		return nil, err
	}
	a.gwRole = gwRole
	handler, err := a.routes(envelope, watch, gwRole)
	if err != nil {
		return nil, err
	}
	if cfg.HasRole(config.RoleAPI) {
		// Last: nothing after it can fail and leave processes behind.
		a.pluginHost.Start()
	}
	return &Host{plugins: a.pluginHost, cfg: cfg, log: log, store: st, handler: handler, admission: envelope.Admission, identity: a.identity, draining: a.draining, follow: a.follow, caches: a.cached, watch: watch,
		sinks: a.sinkList, dispatch: dispatch,
		notifier: a.notifier, workers: runner, siblings: a.siblings, closers: a.closers, placer: a.placer, gateway: gwRole, queue: queue, relay: a.relay,
	}, nil
}

// sibling opens a pool of its own beside the store's, closed with the host.
func (a *assembly) sibling(name string, conns int32) (*store.Store, error) {
	s, err := a.st.Sibling(context.Background(), name, conns)
	if err != nil {
		return nil, err
	}
	a.siblings = append(a.siblings, s)
	return s, nil
}

// groupServices builds every API group's service and the system checks.
func (a *assembly) groupServices(ov Overrides) error {
	cfg, st := a.cfg, a.st
	if cfg.Gateway != nil {
		a.gw = &system.Gateway{URL: cfg.Gateway.URL, ServerName: cfg.Gateway.ServerName}
		if b, err := a.bundle(); err == nil {
			// Daemons pin the serving CA they verify gateways with.
			a.gw.ServingCAPin = pki.Fingerprint(b.ServingCA.Cert)
		}
	}
	sys := system.New(cfg.BasePath, a.gw)
	a.cursors = cursor.New(cfg.Secret)
	var err error
	if a.sinkList, err = sinks.FromConfig(cfg.Sinks); err != nil {
		return err
	}
	a.placer = placement.New(placement.OptionsFrom(cfg))
	a.images = images.FromConfig(cfg.Images)
	a.reservations = &reservations.Service{Placer: a.placer, Store: st, PlacerKind: cfg.Capacity.Placer,
		SpotNotice: time.Duration(cfg.Capacity.SpotNoticeMs) * time.Millisecond}
	a.secrets = secrets.New(cfg.RootTenantID, string(cfg.Secrets.Store), keys.Derive(cfg.Secret, keys.Secrets))
	if a.providerAccts, err = provideraccounts.New(cfg, st, a.plugins.Providers, a.images, a.bundle, a.log); err != nil {
		return err
	}
	a.sandboxes = &sandboxes.Service{Placer: a.placer, Images: a.images, Store: st}
	if a.bundles, err = supportBundlesService(cfg, st); err != nil {
		return err
	}
	a.tunnels = tunnelsService(cfg, a.bundle)
	a.pluginHost = plugins.New(cfg.Plugins, a.log)
	hooks := webhooks.OptionsFrom(cfg)
	// webhooks.eventTypes lists the configured plugins' families beside
	// the service's own, and patterns are checked against the same.
	hooks.EventTypes = plugins.EventTypes(cfg.Plugins)
	a.services = &api.Services{
		ProviderAccounts: a.providerAccts,
		System:           sys,
		Sites: sites.New(cfg.RootTenantID, a.cursors, pools.SiteReferences).OnDelete(func(ctx context.Context, tx pgx.Tx, site string) error {
			_, err := join.RevokeSite(ctx, tx, site)
			return err
		}),
		Pools:            pools.New(cfg.RootTenantID).WithPKI(a.bundle),
		Flavors:          flavors.Service{},
		Quotas:           quotas.Service{},
		Nodes:            nodes.Service{},
		Projects:         projects.Service{},
		Usage:            usage.Service{Cursors: a.cursors},
		Images:           images.Service{Source: a.images},
		Instances:        &instances.Service{Placer: a.placer, Images: a.images, Store: st, Providers: a.providerAccts},
		Reservations:     a.reservations,
		SandboxVolumes:   &sandboxvolumes.Service{Placer: a.placer},
		SandboxTemplates: &sandboxtemplates.Service{Images: a.images},
		Sandboxes:        a.sandboxes,
		SandboxSnapshots: sandboxes.Snapshots{S: a.sandboxes},
		SupportBundles:   a.bundles,
		Secrets:          a.secrets,
		Events:           events.New(a.cursors),
		Webhooks:         webhooks.New(hooks),
		Workflows:        workflows.Service{},
		Profiles:         &profiles.Service{Cursors: a.cursors},
		Tunnels:          a.tunnels,
		Plugins:          a.pluginHost,
	}
	sys.WithChecks(
		system.CatalogCheck(a.services),
		system.MigrationsCheck(st),
		system.ExtensionCheck(),
		system.ClockCheck(time.Now),
		sinks.Check(a.sinkList),
		workers.Check(),
		nodes.Check(),
		usage.Check(cfg.Capacity.UsageEvery, time.Now),
		gateway.Check(),
		a.pluginHost.SelfCheck(),
	)
	if ov.Services != nil {
		ov.Services(a.services)
	}
	if err := a.services.Check(); err != nil {
		return fmt.Errorf("registry check: %w", err)
	}
	return nil
}

// tunnelsService is the tunnels group: absent (NOT_FOUND) without the
// tunnels option; its SSH side (the bundle's SSH CA) with tunnels.ssh.
func tunnelsService(cfg *config.Config, bundle func() (*pki.Bundle, error)) *tunnels.Service {
	s := &tunnels.Service{BasePath: cfg.BasePath}
	if t := cfg.Tunnels; t != nil {
		s.Issuer, s.PerMinute = t.Issuer, t.Limits.TunnelsPerMinute
		s.PreviewKey, s.PreviewDomain = keys.Derive(cfg.Secret, keys.Previews), t.PreviewDomain
		s.NodeRequiresMFA = t.SSHRequiresMFA
		if t.SSH {
			s.SSH = &tunnels.SSH{Bundle: bundle, RequiresMFA: t.SSHRequiresMFA, Accounts: t.SSHAccounts, PerHour: t.Limits.SSHCertificatesPerHour}
		}
	}
	return s
}

// identityPort builds the embedded identity service, its caches and the
// gate every call is decided by.
func (a *assembly) identityPort(ov Overrides) error {
	// The embedded identity service is a dependency like an external one
	// would be: its own connections, so that calls queued on the API's
	// pool (behind a held lock, say) never keep decisions from being made.
	iamStore, err := a.sibling("computed-iam", a.st.Pool().Config().MaxConns)
	if err != nil {
		return err
	}
	a.identity = embedded.New(iamStore, a.cfg.RootTenantID, a.cfg.TypePrefix, a.now)
	// Authentication: API keys by the embedded service, and access tokens
	// of an OIDC provider when configured.
	var keeper spicedb.Keeper = a.identity
	if au := a.cfg.IAM.Authentication; au != nil && au.OIDC != nil {
		if keeper, err = oidc.New(a.identity, au.OIDC, a.now); err != nil {
			return err
		}
	}
	a.port = keeper
	if d := a.cfg.IAM.Decisions; d != nil && d.SpiceDB != nil {
		// Decisions by SpiceDB; the embedded service stays the keeper of
		// tenants, keys, role bindings and the projection's record.
		client, err := spicedb.Dial(d.SpiceDB)
		if err != nil {
			return err
		}
		a.closers = append(a.closers, func() { _ = client.Close() })
		decider := spicedb.New(spicedb.Options{Keeper: keeper, Store: iamStore, Client: client,
			TypePrefix: a.cfg.TypePrefix, Timeout: d.SpiceDB.Timeout, Log: a.log})
		a.port, a.follow = decider, decider.Follow
	}
	a.cached = iam.NewCached(a.port, a.now)
	a.gate = &iam.Gate{
		Port:         a.cached,
		TypePrefix:   a.cfg.TypePrefix,
		AcceptCookie: a.cfg.AcceptIAMCookie,
		Origin:       a.cfg.BaseURL,
	}
	if ov.Gate != nil {
		a.gate = ov.Gate
	}
	return nil
}

// apiRole builds the call envelope and GET /watch.
func (a *assembly) apiRole() (*rpc.Handler, *events.Watch, error) {
	cfg, log, notifier := a.cfg, a.log, a.notifier
	// GET /watch is decided through the same gate as events.list; revoked
	// sessions close their streams; the notifier wakes open streams at
	// once after a commit instead of at their next poll.
	watch := &events.Watch{Gate: a.gate, Store: a.st, Cursors: a.cursors, Revocations: a.cached, Log: log}
	watch.Wake = func() (<-chan struct{}, func()) { return notifier.Subscribe(notify.TopicOutbox) }
	rpcMetrics, err := metrics.NewRPC(a.reg)
	if err != nil {
		return nil, nil, err
	}
	internalAPI := a.internalAPI
	admit := admission.New(admissionLimits(cfg.Admission, int(a.st.Pool().Config().MaxConns)))
	if err := admit.Register(a.reg.Prometheus()); err != nil {
		return nil, nil, err
	}
	envelope := &rpc.Handler{
		BasePath: cfg.BasePath,
		Services: a.services,
		Gate:     a.gate,
		// The catalog's rootTenantOnly rules are input validation: they
		// answer before authentication.
		Precheck: a.precheck(),
		Store:    a.st,
		Metrics:  rpcMetrics,
		Audit:    audit.Record,
		// Calls beyond what the pool and CPUs can run are shed at once.
		Admission: admit,
		// Waits re-read when what they wait on is reported changed.
		Wakes: notifier,
		// A committed mutation may have written outbox rows: wake their
		// consumers.
		AfterCommit: func(ctx context.Context, _ *rpc.Call, u *uow.Unit) {
			notifier.Wake(notify.TopicOutbox)
			for _, t := range notifier.WakeUnit(u) {
				// A gateway with an internal API is woken there too: no
				// database round trip, and without a notifier at all.
				// This process's own gateway was woken (and handed its
				// spec) by WakeUnit: its internal wake would cost a read
				// of its URL and a call to itself, and wake it again, on
				// the 2 cores a claimed VM resumes on.
				if id, ok := strings.CutPrefix(t, "gateway/"); ok && t != gateway.TopicAll && (a.gwRole == nil || a.gwRole.ID() != id) {
					go func() {
						wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
						defer cancel()
						if err := internalAPI.Wake(wctx, id, t); err != nil {
							log.Debug("gateway internal wake", "gateway", id, "error", err.Error())
						}
					}()
				}
			}
		},
		Log: log,
	}
	return envelope, watch, nil
}

// precheck is the envelope's validation before authentication: a plugin
// method of a plugin not configured is not mounted (NOT_FOUND), and the
// catalog's rootTenantOnly rules are input validation.
func (a *assembly) precheck() func(ctx context.Context, call *rpc.Call) error {
	rootOnly := iam.RootTenantPrecheck(a.cached.RootTenant())
	return func(ctx context.Context, call *rpc.Call) error {
		if err := a.pluginHost.Precheck(call.Method); err != nil {
			return err
		}
		return rootOnly(ctx, call)
	}
}

// workerRoles builds the runner and the jobs of the controllers,
// scheduler, iam and sinks roles; all nil without a worker role.
func (a *assembly) workerRoles() (*workers.Runner, *sinks.Dispatcher, *placement.Queue, error) {
	cfg, log, notifier := a.cfg, a.log, a.notifier
	sinkMetrics, err := sinks.NewMetrics(a.reg)
	if err != nil {
		return nil, nil, nil, err
	}
	// Background work runs on pools of its own: API load, however heavy,
	// never keeps a worker from its connections, and lease renewal has a
	// pool nothing else uses, so a busy job cannot cost a lease either.
	work := a.st
	var runner *workers.Runner
	if slices.ContainsFunc(workerRoles, cfg.HasRole) {
		if work, err = a.sibling("computed-workers", int32(cfg.Workers.Concurrency)+4); err != nil {
			return nil, nil, nil, err
		}
		leases, err := a.sibling("computed-leases", 2)
		if err != nil {
			return nil, nil, nil, err
		}
		runner = workers.New(leases, workers.Options{Workers: cfg.Workers, Log: log})
	}
	dispatch := &sinks.Dispatcher{Store: work, Metrics: sinkMetrics, Log: log}
	if runner == nil {
		return nil, dispatch, nil, nil
	}
	var queue *placement.Queue
	if cfg.HasRole(config.RoleScheduler) && cfg.Capacity.Placer == config.PlacerPoolLease {
		queue = &placement.Queue{
			Engine: a.placer, Store: work, MaxBatch: cfg.Capacity.MaxBatch,
			WithTx: func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
				return work.WithTx(ctx, false, fn)
			},
		}
		runner.RegisterReconciler(placement.ReconcilerName, queue)
	}
	if cfg.HasRole(config.RoleIAM) {
		handovers, err := usage.NewHandovers(work, a.identity.Billing(), cfg.Capacity.UsageEvery, a.reg)
		if err != nil {
			return nil, nil, nil, err
		}
		runner.RegisterPeriodic(handovers.Periodic())
		// Drafts a killed process left in the projection go after a bound.
		runner.RegisterPeriodic(a.identity.DraftSweep(log))
	}
	if cfg.HasRole(config.RoleSinks) {
		if err := registerDispatch(runner, work, cfg, a.reg, notifier, dispatch.Jobs(a.sinkList, cfg.Workers.BatchSize), log); err != nil {
			return nil, nil, nil, err
		}
	}
	if cfg.HasRole(config.RoleControllers) {
		runner.RegisterReconciler(usage.RollupReconciler, &usage.Rollups{Store: work, Now: time.Now})
		downAfter := config.DefaultGatewayDownAfter
		if cfg.Gateway != nil {
			downAfter = cfg.Gateway.DownAfter
		}
		for _, job := range []*workers.Periodic{
			(&gateway.Sweeper{Store: work, Notifier: notifier, DownAfter: downAfter, Log: log}).Periodic(),
			(&reservations.Job{Service: a.reservations, Store: work, Notifier: notifier, MaxAttempts: cfg.Capacity.MaxAttempts, Log: log}).Periodic(),
			(&sandboxes.Job{Service: a.sandboxes, Store: work, Notifier: notifier, Log: log}).Periodic(),
			(&workflows.Job{Store: work, Notifier: notifier, Images: a.images, Log: log, Drivers: a.plugins.Drivers}).Periodic(),
			a.providerAccts.Job(work, notifier, log).Periodic(),
			a.providerAccts.InstancesJob(work, notifier, log).Periodic(),
		} {
			runner.RegisterPeriodic(job)
		}
	}
	return runner, dispatch, queue, nil
}

// gatewayRole builds the gateway, nil without the role. It refuses to
// start (INVALID_CONFIG) without a region, node CA roots or a trust
// domain, before any listener opens.
func (a *assembly) gatewayRole() (*gateway.Gateway, error) {
	if !a.cfg.HasRole(config.RoleGateway) {
		return nil, nil
	}
	gwStore, err := a.sibling("computed-gateway", 8)
	if err != nil {
		return nil, err
	}
	// Each group follows its own kinds of instances and of commands.
	work := &nodework.Registry{Now: a.now}
	instances.RegisterStatus(work)
	sandboxes.RegisterStatus(work)
	sandboxvolumes.RegisterStatus(work, a.placer)
	sandboxes.RegisterResults(work)
	supportbundles.RegisterResults(work, a.bundles)
	var roots config.PEM
	if a.cfg.PKI.NodeCA != nil {
		roots = a.cfg.PKI.NodeCA.Cert
	}
	var perNode, perGateway int
	if t := a.cfg.Tunnels; t != nil {
		perNode, perGateway = t.Limits.OpenPerNode, t.Limits.OpenPerGateway
	}
	return gateway.New(gateway.Options{Config: a.cfg.Gateway, NodeCARoots: roots, Bundle: a.bundle,
		TunnelsPerNode: perNode, TunnelsPerGateway: perGateway,
		Store: gwStore, Notifier: a.notifier, Log: a.log.With("role", "gateway"), TrustVersion: a.cfg.PKI.TrustVersion,
		Work: work,
		OnResolve: func(ctx context.Context, node, instanceID string, refs []string) (map[string]string, error) {
			return instances.ResolveUserData(ctx, db.New(gwStore.Pool()), a.secrets, node, instanceID, refs)
		}})
}

// routes builds the HTTP surface: the envelope, documents, metrics, the
// join endpoint, the daemons' fallback session and identity events.
func (a *assembly) routes(envelope *rpc.Handler, watch *events.Watch, gwRole *gateway.Gateway) (http.Handler, error) {
	cfg, log := a.cfg, a.log
	opts := server.Options{
		Draining:     a.draining.Load,
		BasePath:     cfg.BasePath,
		RPC:          envelope,
		Store:        a.st,
		Document:     system.Document(cfg.BasePath, a.gw),
		MetricsToken: cfg.Metrics.Token,
		MetricsPath:  cfg.Metrics.Path,
		Metrics:      a.reg,
		OpenAPI:      computeplane.OpenAPI,
		DocsHTML:     gendocs.IndexHTML,
		Watch:        watch,
		Log:          log,
		Join: &join.Handler{Store: a.st, Bundle: a.bundle, Projection: a.port.Projection(), TypePrefix: cfg.TypePrefix,
			Gateways: gateway.LiveGateways, FallbackURL: fallbackURL(cfg, gwRole), Log: log, Now: a.now, TPM: tpmAttestor(cfg),
			Cloud: cloudAttestor(cfg)},
	}
	if gwRole != nil {
		opts.Session = gwRole.FallbackHandler()
	}
	if cfg.Tunnels != nil {
		// Mounted only with an issuer (the tunnels option requires one).
		a.relay = &tunnels.Relay{Store: a.st, Gateways: a.internalAPI, Notifier: a.notifier, Log: log.With("module", "tunnels"), SSH: a.tunnels.SSH,
			Identity: a.cached, TypePrefix: cfg.TypePrefix, IdleTimeout: cfg.Tunnels.Limits.IdleTimeout}
		opts.Tunnels = a.relay
		pv := &tunnels.Previews{Store: a.st, Gateways: a.internalAPI, Key: a.tunnels.PreviewKey, BasePath: cfg.BasePath,
			Domain: cfg.Tunnels.PreviewDomain, Log: log.With("module", "previews")}
		opts.Previews, opts.IsPreviewHost = pv, pv.IsPreviewHost
	}
	if ev := cfg.IAM.Events; ev != nil {
		// Identity-service events signed with the configured secret feed
		// the inbox; this process's caches react at once.
		opts.IAMEvents = &iam.EventHook{Key: iam.EventHookKey(ev.Secret), Record: a.identity.RecordEvent,
			React: a.cached.React, Now: a.now, Log: log}
		opts.IAMEventsPath = ev.Path
	}
	src, err := downloadSource(cfg, os.Getenv)
	if err != nil {
		return nil, err
	}
	if src != nil {
		opts.Downloads = &downloads.Handler{BasePath: cfg.BasePath, Source: src, Log: log.With("module", "downloads")}
	}
	handler := server.New(opts)
	// Forwarding headers are resolved and stripped before anything else
	// but a call refused for the in-flight limit, which is answered before
	// any work (its answer uses none of them).
	return envelope.RefuseEarly(iam.WithSourceIP(cfg.TrustedProxies, handler), opts.IsPreviewHost), nil
}

// admissionLimits resolves the admission option against the api's pool.
func admissionLimits(o config.Admission, poolConns int) admission.Limits {
	l := admission.Limits{
		MaxInFlight: o.MaxInFlight, Adaptive: o.Adaptive, MinInFlight: o.MinInFlight,
		AcquireTarget: o.AcquireTarget, MaxQueue: o.MaxQueue, SlotWait: o.SlotWait,
		QueueTarget: o.QueueTarget, QueueInterval: o.QueueInterval,
		TenantRate: o.TenantRate, TenantBurst: o.TenantBurst,
		GlobalRate: o.GlobalRate, GlobalBurst: o.GlobalBurst,
	}
	if l.MaxInFlight == config.AutoInFlight {
		l.MaxInFlight = config.InFlightPerConn * poolConns
		if l.Adaptive {
			l.MaxInFlight = config.AdaptiveInFlightPerConn * poolConns
		}
	}
	if l.MinInFlight == config.AutoInFlight {
		l.MinInFlight = min(poolConns, l.MaxInFlight)
	}
	if len(o.Tenants) > 0 {
		l.Tenants = make(map[string]admission.Bucket, len(o.Tenants))
		for t, b := range o.Tenants {
			l.Tenants[t] = admission.Bucket{Rate: b.Rate, Burst: b.Burst}
		}
	}
	return l
}

// cloudAttestor is the cloud instance-identity join attestor when
// attestors names cloud; nil otherwise. Its audience defaults to the join
// endpoint machines are given (bootstrap.joinUrl, else baseURL).
func cloudAttestor(cfg *config.Config) *join.CloudAttestor {
	if cfg.Cloud == nil {
		return nil
	}
	aud := cfg.Cloud.Audience
	if aud == "" {
		base := cfg.BaseURL
		if cfg.Bootstrap != nil && cfg.Bootstrap.JoinURL != "" {
			base = cfg.Bootstrap.JoinURL
		}
		aud = join.Audience(base)
	}
	issuers := make([]join.CloudIssuer, 0, len(cfg.Cloud.Issuers))
	for _, is := range cfg.Cloud.Issuers {
		issuers = append(issuers, join.CloudIssuer{Issuer: is.Issuer, JWKSURL: is.JWKSURL, Provider: is.Provider})
	}
	return join.NewCloudAttestor(aud, cfg.Cloud.MaxAge, issuers)
}

// tpmAttestor is the TPM join attestor when attestors names tpm (the
// configuration then holds its enrolled endorsement keys); nil otherwise.
func tpmAttestor(cfg *config.Config) *join.TPMAttestor {
	if cfg.TPM == nil {
		return nil
	}
	return join.NewTPMAttestor(cfg.TPM.EndorsementKeys)
}
