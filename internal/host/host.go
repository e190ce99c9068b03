// Package host runs a process of the service: it opens the store, migrates,
// checks the registry, starts the roles it is given and stops them in the
// specification's order on SIGINT or SIGTERM.
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane"
	"computeplane/gen/api"
	"computeplane/gen/db"
	gendocs "computeplane/gen/docs"
	"computeplane/internal/agentproto"
	"computeplane/internal/audit"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/cursor"
	"computeplane/internal/events"
	"computeplane/internal/flavors"
	"computeplane/internal/gateway"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
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
	"computeplane/internal/system"
	"computeplane/internal/uow"
	"computeplane/internal/usage"
	"computeplane/internal/webhooks"
	"computeplane/internal/workers"
	"computeplane/internal/workflows"
)

// ShutdownGrace is how long open requests get to finish when the listener closes.
const ShutdownGrace = 2 * time.Second

// WorkerStopGrace bounds the wait for background work to end at shutdown:
// a lease lifetime, after which its leases would have expired anyway; work
// still running then is fenced out of the database.
const WorkerStopGrace = 15 * time.Second

// workerRoles run the Runner.
var workerRoles = []config.Role{config.RoleControllers, config.RoleScheduler, config.RoleSinks, config.RoleIAM}

// Host is one running process.
type Host struct {
	cfg      *config.Config
	log      *slog.Logger
	store    *store.Store
	handler  http.Handler
	identity *embedded.Service
	caches   *iam.Cached
	watch    *events.Watch
	sinks    []sinks.Sink
	dispatch *sinks.Dispatcher
	notifier *notify.Notifier
	workers  *workers.Runner // nil without a worker role
	placer   *placement.Engine
	gateway  *gateway.Gateway // nil without the gateway role
	queue    *placement.Queue // the pool-lease placer's reconciler, nil without it
	siblings []*store.Store   // the connection pools beside the store's, closed with it
}

// Options change how a host starts; the zero value runs migrations.
type Options struct {
	SkipMigrations bool
	// Plugins are the provider adapters and bare-metal drivers built in
	// (builtin.All in the main).
	Plugins   builtin.Plugins
	Overrides Overrides
}

// Overrides replace parts of the host, for tests of the envelope: a gate
// that admits what the identity port would, a service double, or the clock
// of the identity caches.
type Overrides struct {
	Gate     rpc.Gate
	Services func(*api.Services)
	Now      func() time.Time
}

// New loads nothing itself: it opens the store, migrates (unless skipped),
// checks the registry and builds the HTTP surface of the api role.
func New(ctx context.Context, cfg *config.Config, log *slog.Logger, opt Options) (*Host, error) {
	st, err := store.Open(ctx, cfg.Database)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if !opt.SkipMigrations {
		if err := st.Migrate(ctx); err != nil {
			st.Close()
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	h, err := Assemble(cfg, st, log, opt.Plugins, opt.Overrides)
	if err != nil {
		st.Close()
		return nil, err
	}
	return h, nil
}

// Assemble builds the host around an open store: services, registry check,
// envelope and routes. Tests use it with a store of their own.
func Assemble(cfg *config.Config, st *store.Store, log *slog.Logger, plugins builtin.Plugins, ov Overrides) (_ *Host, err error) {
	// Pools opened beside st (see Store.Sibling) close with the host, or
	// here when assembling fails.
	var siblings []*store.Store
	defer func() {
		if err != nil {
			closeAll(siblings)
		}
	}()
	bundle := pki.Loader(cfg.PKIFile, cfg.Secret)
	var gw *system.Gateway
	if cfg.Gateway != nil {
		gw = &system.Gateway{URL: cfg.Gateway.URL, ServerName: cfg.Gateway.ServerName}
		if b, err := bundle(); err == nil {
			// Daemons pin the serving CA they verify gateways with.
			gw.ServingCAPin = pki.Fingerprint(b.ServingCA.Cert)
		}
	}
	sys := system.New(cfg.BasePath, gw)
	cursors := cursor.New(cfg.Secret)
	sinkList, err := sinks.FromConfig(cfg.Sinks)
	if err != nil {
		return nil, err
	}
	placer := placement.New(placement.OptionsFrom(cfg))
	imageSource := images.FromConfig(cfg.Images)
	rsvService := &reservations.Service{Placer: placer, Store: st, PlacerKind: cfg.Capacity.Placer,
		SpotNotice: time.Duration(cfg.Capacity.SpotNoticeMs) * time.Millisecond}
	secretService := secrets.New(cfg.RootTenantID, string(cfg.Secrets.Store), keys.Derive(cfg.Secret, keys.Secrets))
	providerAccounts, err := provideraccounts.New(cfg, st, plugins.Providers, imageSource, bundle, log)
	if err != nil {
		return nil, err
	}
	sandboxService := &sandboxes.Service{Placer: placer, Images: imageSource, Store: st}
	services := &api.Services{
		ProviderAccounts: providerAccounts,
		System:           sys,
		Sites: sites.New(cfg.RootTenantID, cursors, pools.SiteReferences).OnDelete(func(ctx context.Context, tx pgx.Tx, site string) error {
			_, err := join.RevokeSite(ctx, tx, site)
			return err
		}),
		Pools:            pools.New(cfg.RootTenantID).WithPKI(bundle),
		Flavors:          flavors.Service{},
		Quotas:           quotas.Service{},
		Nodes:            nodes.Service{},
		Projects:         projects.Service{},
		Usage:            usage.Service{Cursors: cursors},
		Images:           images.Service{Source: imageSource},
		Instances:        &instances.Service{Placer: placer, Images: imageSource, Store: st, Providers: providerAccounts},
		Reservations:     rsvService,
		SandboxVolumes:   &sandboxvolumes.Service{Placer: placer},
		SandboxTemplates: &sandboxtemplates.Service{Images: imageSource},
		Sandboxes:        sandboxService,
		SandboxSnapshots: sandboxes.Snapshots{S: sandboxService},
		Secrets:          secretService,
		Events:           events.New(cursors),
		Webhooks:         webhooks.New(webhooks.OptionsFrom(cfg)),
		Workflows:        workflows.Service{},
		Profiles:         &profiles.Service{Cursors: cursors},
	}
	sys.WithChecks(
		system.CatalogCheck(services),
		system.MigrationsCheck(st),
		system.ExtensionCheck(),
		system.ClockCheck(time.Now),
		sinks.Check(sinkList),
		workers.Check(),
		nodes.Check(),
		usage.Check(cfg.Capacity.UsageEvery, time.Now),
		gateway.Check(),
	)
	if ov.Services != nil {
		ov.Services(services)
	}
	now := time.Now
	if ov.Now != nil {
		now = ov.Now
	}
	// The embedded identity service is a dependency like an external one
	// would be: its own connections, so that calls queued on the API's
	// pool (behind a held lock, say) never keep decisions from being made.
	iamStore, err := st.Sibling(context.Background(), "computed-iam", st.Pool().Config().MaxConns)
	if err != nil {
		return nil, err
	}
	siblings = append(siblings, iamStore)
	identity := embedded.New(iamStore, cfg.RootTenantID, cfg.TypePrefix, now)
	cached := iam.NewCached(identity, now)
	var gate rpc.Gate = &iam.Gate{
		Port:         cached,
		TypePrefix:   cfg.TypePrefix,
		AcceptCookie: cfg.AcceptIAMCookie,
		Origin:       cfg.BaseURL,
	}
	if ov.Gate != nil {
		gate = ov.Gate
	}
	// GET /watch is decided through the same gate as events.list; revoked
	// sessions close their streams; the notifier wakes them (below).
	watch := &events.Watch{Gate: gate, Store: st, Cursors: cursors, Revocations: cached, Log: log}
	if err := services.Check(); err != nil {
		return nil, fmt.Errorf("registry check: %w", err)
	}
	reg := metrics.NewRegistry()
	rpcMetrics, err := metrics.NewRPC(reg)
	if err != nil {
		return nil, err
	}
	sinkMetrics, err := sinks.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	// The notifier's connections open in Serve; until then wakes stay in
	// the process.
	notifier := notify.New(cfg.Notifier, st.Pool(), log)
	// Open /watch streams read at once after a commit instead of at their
	// next poll.
	watch.Wake = func() (<-chan struct{}, func()) { return notifier.Subscribe(notify.TopicOutbox) }
	internalAPI := gateway.NewInternalClient(st, bundle, log)
	envelope := &rpc.Handler{
		BasePath: cfg.BasePath,
		Services: services,
		Gate:     gate,
		// The catalog's rootTenantOnly rules are input validation: they
		// answer before authentication.
		Precheck: iam.RootTenantPrecheck(cached.RootTenant()),
		Store:    st,
		Metrics:  rpcMetrics,
		Audit:    audit.Record,
		// Waits re-read when what they wait on is reported changed.
		Wakes: notifier,
		// A committed mutation may have written outbox rows: wake their
		// consumers.
		AfterCommit: func(ctx context.Context, _ *rpc.Call, u *uow.Unit) {
			notifier.Wake(notify.TopicOutbox)
			for _, t := range notifier.WakeUnit(u) {
				// A gateway with an internal API is woken there too: no
				// database round trip, and without a notifier at all.
				if id, ok := strings.CutPrefix(t, "gateway/"); ok && t != gateway.TopicAll {
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
	// Background work runs on pools of its own: API load, however heavy,
	// never keeps a worker from its connections, and lease renewal has a
	// pool nothing else uses, so a busy job cannot cost a lease either.
	work, leases := st, st
	if slices.ContainsFunc(workerRoles, cfg.HasRole) {
		if work, err = st.Sibling(context.Background(), "computed-workers", int32(cfg.Workers.Concurrency)+4); err != nil {
			return nil, err
		}
		siblings = append(siblings, work)
		if leases, err = st.Sibling(context.Background(), "computed-leases", 2); err != nil {
			return nil, err
		}
		siblings = append(siblings, leases)
	}
	dispatch := &sinks.Dispatcher{Store: work, Metrics: sinkMetrics, Log: log}
	var runner *workers.Runner
	if slices.ContainsFunc(workerRoles, cfg.HasRole) {
		runner = workers.New(leases, workers.Options{Workers: cfg.Workers, Log: log})
	}
	var placeQueue *placement.Queue
	if runner != nil && cfg.HasRole(config.RoleScheduler) && cfg.Capacity.Placer == config.PlacerPoolLease {
		queue := &placement.Queue{
			Engine: placer, Store: work, MaxBatch: cfg.Capacity.MaxBatch,
			WithTx: func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
				return work.WithTx(ctx, false, fn)
			},
		}
		runner.RegisterReconciler(placement.ReconcilerName, queue)
		placeQueue = queue
	}
	if runner != nil && cfg.HasRole(config.RoleControllers) {
		runner.RegisterReconciler(usage.RollupReconciler, &usage.Rollups{Store: work, Now: time.Now})
	}
	if runner != nil && cfg.HasRole(config.RoleIAM) {
		handovers, err := usage.NewHandovers(work, identity.Billing(), cfg.Capacity.UsageEvery, reg)
		if err != nil {
			return nil, err
		}
		runner.RegisterPeriodic(handovers.Periodic())
	}
	if runner != nil && cfg.HasRole(config.RoleIAM) {
		// Drafts a killed process left in the projection go after a bound.
		runner.RegisterPeriodic(identity.DraftSweep(log))
	}
	if runner != nil && cfg.HasRole(config.RoleSinks) {
		if err := registerDispatch(runner, work, cfg, reg, notifier, dispatch.Jobs(sinkList, cfg.Workers.BatchSize), log); err != nil {
			return nil, err
		}
	}
	if runner != nil && cfg.HasRole(config.RoleControllers) {
		downAfter := config.DefaultGatewayDownAfter
		if cfg.Gateway != nil {
			downAfter = cfg.Gateway.DownAfter
		}
		sweeper := &gateway.Sweeper{Store: work, Notifier: notifier, DownAfter: downAfter, Log: log}
		runner.RegisterPeriodic(sweeper.Periodic())
		rsv := &reservations.Job{Service: rsvService, Store: work, Notifier: notifier,
			MaxAttempts: cfg.Capacity.MaxAttempts, Log: log}
		runner.RegisterPeriodic(rsv.Periodic())
		sbx := &sandboxes.Job{Service: sandboxService, Store: work, Notifier: notifier, Log: log}
		runner.RegisterPeriodic(sbx.Periodic())
		wf := &workflows.Job{Store: work, Notifier: notifier, Images: imageSource, Log: log,
			Drivers: plugins.Drivers}
		runner.RegisterPeriodic(wf.Periodic())
		runner.RegisterPeriodic(providerAccounts.Job(work, notifier, log).Periodic())
		runner.RegisterPeriodic(providerAccounts.InstancesJob(work, notifier, log).Periodic())
	}
	// The gateway role refuses to start (INVALID_CONFIG) without a region,
	// node CA roots or a trust domain, before any listener opens.
	var gwRole *gateway.Gateway
	if cfg.HasRole(config.RoleGateway) {
		gwStore, err := st.Sibling(context.Background(), "computed-gateway", 8)
		if err != nil {
			return nil, err
		}
		siblings = append(siblings, gwStore)
		// Each group follows its own kinds of instances.
		statuses := &nodework.Registry{}
		instances.RegisterStatus(statuses)
		sandboxes.RegisterStatus(statuses)
		sandboxvolumes.RegisterStatus(statuses, placer)
		var roots config.PEM
		if cfg.PKI.NodeCA != nil {
			roots = cfg.PKI.NodeCA.Cert
		}
		if gwRole, err = gateway.New(gateway.Options{Config: cfg.Gateway, NodeCARoots: roots, Bundle: bundle,
			Store: gwStore, Notifier: notifier, Log: log.With("role", "gateway"), TrustVersion: cfg.PKI.TrustVersion,
			OnStatus: statuses.ApplyStatus,
			OnResolve: func(ctx context.Context, node, instanceID string, refs []string) (map[string]string, error) {
				return instances.ResolveUserData(ctx, db.New(gwStore.Pool()), secretService, node, instanceID, refs)
			},
			OnResult: func(ctx context.Context, _ string, r *agentproto.Result) error {
				return sandboxes.ApplyResult(ctx, db.New(gwStore.Pool()), r)
			}}); err != nil {
			return nil, err
		}
	}
	opts := server.Options{
		BasePath:     cfg.BasePath,
		RPC:          envelope,
		Store:        st,
		Document:     system.Document(cfg.BasePath, gw),
		MetricsToken: cfg.Metrics.Token,
		MetricsPath:  cfg.Metrics.Path,
		Metrics:      reg,
		OpenAPI:      computeplane.OpenAPI,
		DocsHTML:     gendocs.IndexHTML,
		Watch:        watch,
		Log:          log,
		Join: &join.Handler{Store: st, Bundle: bundle, Projection: identity.Projection(), TypePrefix: cfg.TypePrefix,
			Gateways: gateway.LiveGateways, FallbackURL: fallbackURL(cfg, gwRole), Log: log, Now: now},
	}
	if gwRole != nil {
		opts.Session = gwRole.FallbackHandler()
	}
	if ev := cfg.IAM.Events; ev != nil {
		// Identity-service events signed with the configured secret feed
		// the inbox; this process's caches react at once.
		opts.IAMEvents = &iam.EventHook{Key: iam.EventHookKey(ev.Secret), Record: identity.RecordEvent,
			React: cached.React, Now: now, Log: log}
		opts.IAMEventsPath = ev.Path
	}
	handler := server.New(opts)
	// Forwarding headers are resolved and stripped before anything else.
	handler = iam.WithSourceIP(cfg.TrustedProxies, handler)
	return &Host{cfg: cfg, log: log, store: st, handler: handler, identity: identity, caches: cached, watch: watch,
		sinks: sinkList, dispatch: dispatch,
		notifier: notifier, workers: runner, siblings: siblings, placer: placer, gateway: gwRole, queue: placeQueue,
	}, nil
}

// fallbackURL is the daemons' WebSocket fallback on the public host, when
// this process serves it (it runs a gateway).
func fallbackURL(cfg *config.Config, gw *gateway.Gateway) string {
	if gw == nil {
		return ""
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil {
		return ""
	}
	u.Scheme = map[string]string{"https": "wss", "http": "ws"}[u.Scheme]
	u.Path, u.RawQuery = server.SessionPath, ""
	return u.String()
}

// Gateway is the process's gateway role, nil without one.
func (h *Host) Gateway() *gateway.Gateway { return h.gateway }

// DispatchPoll is how often outbox consumers look for work when no wake-up
// came (a notifier is best effort, never the source of truth).
const DispatchPoll = time.Second

// registerDispatch puts the outbox consumers of the sinks role on the
// runner: one singleton job per configured sink and one for webhook
// delivery, each under its own lease, woken by the notifier after commits,
// every write fenced by the lease's epoch.
func registerDispatch(runner *workers.Runner, st *store.Store, cfg *config.Config, reg *metrics.Registry,
	n *notify.Notifier, jobs []sinks.Job, log *slog.Logger) error {
	for _, j := range jobs {
		runner.RegisterPeriodic(j.Periodic(n, DispatchPoll))
	}
	engine, err := webhooks.NewEngine(st, webhooks.OptionsFrom(cfg), webhooks.EngineOptions{
		Metrics: reg, Log: log,
		Batch: cfg.Workers.BatchSize,
		// A delivery claim must outlive its 15 s attempt.
		ClaimTTL: max(time.Duration(cfg.Workers.ClaimTTLMs)*time.Millisecond, webhooks.DefaultTimeout+time.Second),
	})
	if err != nil {
		return err
	}
	runner.RegisterSingleton("webhooks", func(ctx context.Context, l workers.Lease) error {
		wake, stop := n.Subscribe(notify.TopicOutbox)
		defer stop()
		engine.Run(ctx, l.Fence, wake, DispatchPoll)
		return nil
	})
	return nil
}

// SinkJobs are the singleton jobs of the configured sinks, one per sink,
// for the worker runner of the sinks role (see sinks.Job).
func (h *Host) SinkJobs() []sinks.Job { return h.dispatch.Jobs(h.sinks, 0) }

// Placement is the placement engine every admission books capacity with.
func (h *Host) Placement() *placement.Engine { return h.placer }

// Identity is the embedded identity service.
func (h *Host) Identity() *embedded.Service { return h.identity }

// Caches are the identity caches in front of the identity service; their
// React applies identity events (and closes revoked /watch streams).
func (h *Host) Caches() *iam.Cached { return h.caches }

// Handler is the HTTP surface of the api role.
func (h *Host) Handler() http.Handler { return h.handler }

// Notifier carries the wake-ups after commit; subscribe to its topics
// (notify.TopicOutbox) to start work without waiting for a poll.
func (h *Host) Notifier() *notify.Notifier { return h.notifier }

// Workers is the process's Runner, nil without a worker role. Register
// singleton jobs and reconcilers on it before Serve.
func (h *Host) Workers() *workers.Runner { return h.workers }

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// Close releases the store and the background pools.
func (h *Host) Close() {
	closeAll(h.siblings)
	h.store.Close()
}

func closeAll(siblings []*store.Store) {
	for _, p := range siblings {
		p.Close()
	}
}

// Serve runs the roles until ctx is done, then shuts down in the
// specification's order: the HTTP listener closes with a grace period, the
// workers stop (releasing their leases and leaving the workers table), then
// the notifier and the store close.
//
// ready, when not nil, is called once every listener of the process (the
// api's and the gateway's) is bound, so that what it prints is true; an
// error from it stops the process.
func (h *Host) Serve(ctx context.Context, ready func() error) error {
	defer h.Close()
	var ln net.Listener
	if h.cfg.HasRole(config.RoleAPI) {
		// Bound first, so that a busy port stops the process before any
		// worker or gateway starts.
		addr := net.JoinHostPort(h.cfg.Host, fmt.Sprint(h.cfg.Port))
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("api listener: %w (PORT and HOST move it)", err)
		}
		defer ln.Close()
	}
	h.notifier.Start()
	defer h.notifier.Close()
	if h.cfg.HasRole(config.RoleAPI) {
		// Identity events (revocations) reach this process's caches
		// within about a second.
		go iam.DrainInbox(ctx, h.identity, h.caches.React, iam.InboxPoll, h.log)
	}
	if h.workers != nil {
		if err := h.workers.Start(ctx); err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), WorkerStopGrace)
			defer cancel()
			if err := h.workers.Stop(sctx); err != nil {
				h.log.Warn("workers stop", "error", err.Error())
			}
		}()
	}
	if h.queue != nil {
		// A queued admission is placed at once by the worker holding its
		// pool's shard (in whichever process), not at the next resync.
		go func() {
			wake, stop := h.notifier.Subscribe(placement.TopicQueued)
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-wake:
					kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					if err := h.queue.Kick(kctx, h.workers.Enqueue); err != nil {
						h.log.Warn("placement kick", "error", err.Error())
					}
					cancel()
				}
			}
		}()
	}
	if h.workers != nil && h.cfg.HasRole(config.RoleControllers) {
		// The rollup runs every capacity.rollupEvery: each worker lists
		// the keys of the shards it holds.
		go every(ctx, h.cfg.Capacity.RollupEvery, h.workers.Resync)
	}
	if h.gateway != nil {
		if err := h.gateway.Start(ctx); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	}
	// Shutdown step 1: the gateway drains before the HTTP listener closes;
	// deferred too, so it drains before the workers stop on any return.
	drainGateway := sync.OnceFunc(func() {
		if h.gateway != nil {
			h.gateway.Drain()
		}
	})
	defer drainGateway()
	if ready != nil {
		if err := ready(); err != nil {
			return err
		}
	}
	if ln == nil {
		h.log.Info("no api role: nothing to listen on")
		<-ctx.Done()
		return nil
	}
	srv := &http.Server{
		Handler:           h.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	// Event streams never go idle: end them when shutdown begins.
	srv.RegisterOnShutdown(h.watch.Close)
	h.log.Info("serving", "addr", ln.Addr().String(), "basePath", h.cfg.BasePath)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	h.log.Info("shutting down")
	drainGateway()
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
