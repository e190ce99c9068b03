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
	"sync"
	"sync/atomic"
	"time"

	"computeplane/gen/api"
	"computeplane/internal/admission"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/events"
	"computeplane/internal/gateway"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/metrics"
	"computeplane/internal/notify"
	"computeplane/internal/placement"
	"computeplane/internal/plugins"
	"computeplane/internal/rpc"
	"computeplane/internal/server"
	"computeplane/internal/sinks"
	"computeplane/internal/store"
	"computeplane/internal/tunnels"
	"computeplane/internal/webhooks"
	"computeplane/internal/workers"
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
	cfg     *config.Config
	log     *slog.Logger
	store   *store.Store
	handler http.Handler
	// admission is the envelope's admission controller (nil: admits all).
	admission *admission.Controller
	draining  *atomic.Bool // /readyz fails while set
	identity  *embedded.Service
	follow    func(ctx context.Context, in iam.Inbox, every time.Duration, wake <-chan struct{}) // nil with embedded decisions
	caches    *iam.Cached
	watch     *events.Watch
	sinks     []sinks.Sink
	dispatch  *sinks.Dispatcher
	notifier  *notify.Notifier
	workers   *workers.Runner // nil without a worker role
	placer    *placement.Engine
	gateway   *gateway.Gateway // nil without the gateway role
	queue     *placement.Queue // the pool-lease placer's reconciler, nil without it
	relay     *tunnels.Relay   // the tunnels relay, nil without the tunnels option
	siblings  []*store.Store   // the connection pools beside the store's, closed with it
	plugins   *plugins.Host    // the plugin processes, stopped with it
	closers   []func()         // other connections (an external identity adapter), closed with it
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
	runner.RegisterPeriodic(engine.Periodic(n, DispatchPoll))
	return nil
}

// SinkJobs are the singleton jobs of the configured sinks, one per sink,
// for the worker runner of the sinks role (see sinks.Job).
func (h *Host) SinkJobs() []sinks.Job { return h.dispatch.Jobs(h.sinks, 0) }

// Placement is the placement engine every admission books capacity with.
func (h *Host) Placement() *placement.Engine { return h.placer }

// Identity is the embedded identity service.
func (h *Host) Identity() *embedded.Service { return h.identity }

// FollowIdentity keeps an external decision service's role bindings in
// step with the identity inbox until ctx ends (Serve runs it in the api
// role, woken by the notifier's iam.TopicInbox; wake nil polls only):
// bindings reach SpiceDB from the inbox, and authentication writes
// nothing. It returns at once with embedded decisions.
func (h *Host) FollowIdentity(ctx context.Context, wake <-chan struct{}) {
	if h.follow != nil {
		h.follow(ctx, h.identity, iam.InboxPoll, wake)
	}
}

// Caches are the identity caches in front of the identity service; their
// React applies identity events (and closes revoked /watch streams).
func (h *Host) Caches() *iam.Cached { return h.caches }

// Admission is the api role's admission controller (for tests and
// benchmarks that need a slot held).
func (h *Host) Admission() *admission.Controller { return h.admission }

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

// Plugins runs the configured plugins' processes (in the api role).
func (h *Host) Plugins() *plugins.Host { return h.plugins }

// Close stops the plugin processes and releases the store and the
// background pools, waiting at most CloseGrace for the pools.
func (h *Host) Close() {
	h.plugins.Close()
	for _, c := range h.closers {
		c()
	}
	within(CloseGrace, h.log, "database pools", func() {
		closeAll(append([]*store.Store{h.store}, h.siblings...))
	})
}

// CloseGrace bounds the closing of the database pools (and of the
// notifier's connection) at exit. A pool's Close waits until each of its
// connections is closed, and pgx closes a connection whose query was
// interrupted (a call cut short by the shutdown or by its client) by
// sending PostgreSQL a cancel request and waiting up to 15 s for the
// answer: with a database that had stopped answering (an overloaded
// machine, a partition) the process outlived SIGTERM by that much. Past
// the bound the exit goes on; the kernel closes the sockets, and
// PostgreSQL ends their sessions as for a killed process.
const CloseGrace = 2 * time.Second

// closeAll closes the pools at once, each one's wait alongside the others'.
func closeAll(pools []*store.Store) {
	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Go(p.Close)
	}
	wg.Wait()
}

// within runs fn, waiting at most d for it to return; past d it leaves fn
// running (the process is exiting) and says so.
func within(d time.Duration, log *slog.Logger, what string, fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Warn("shutdown: stopped waiting", "for", what, "afterMs", d.Milliseconds())
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
	defer within(CloseGrace, h.log, "notifier", h.notifier.Close)
	if h.cfg.HasRole(config.RoleAPI) {
		// Identity events (revocations) reach this process's caches
		// within about a second.
		// The notifier's TopicInbox (written with each event) wakes the
		// drain at once: revoked tunnels close within a second.
		wake, stop := h.notifier.Subscribe(iam.TopicInbox)
		defer stop()
		go iam.DrainInboxWoken(ctx, h.identity, h.caches.React, iam.InboxPoll, wake, h.log)
		if h.follow != nil {
			wake, stop := h.notifier.Subscribe(iam.TopicInbox)
			defer stop()
			go h.FollowIdentity(ctx, wake)
		}
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
	// What one connection may hold is bounded whatever the kernel's
	// buffers do (a client that pipelines and never reads is let go).
	// At most admission.maxConnections are served at once: the rest
	// wait in the kernel's accept queue.
	bounded, connState := server.BoundConns(ln, server.ConnLimits{MaxConns: h.cfg.Admission.MaxConnections}, nil)
	// The wait check (admission.queueTargetMs) judges a call's wait from
	// its arrival on the socket.
	ln = admission.ArrivalListener(bounded)
	srv := &http.Server{
		Handler:           bounded.Handler(h.handler),
		ConnState:         connState,
		ConnContext:       admission.ArrivalContext,
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
	// Step 0: /readyz fails for shutdown.unreadyMs while calls are still
	// served, so that balancers stop sending before the listener closes;
	// answers ask their clients to close the connection meanwhile.
	h.draining.Store(true)
	srv.SetKeepAlivesEnabled(false)
	if d := h.cfg.Shutdown.Unready; d > 0 {
		h.log.Info("shutting down: not ready", "forMs", d.Milliseconds())
		select {
		case <-time.After(d):
		case err := <-errc:
			return err
		}
	}
	h.log.Info("shutting down")
	drainGateway()
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	// Step 3: the tunnel relays (hijacked connections, which the
	// server's shutdown leaves alone) close after the listener, each
	// recording its end; the workers stop on return.
	if h.relay != nil {
		tctx, cancel := context.WithTimeout(context.Background(), TunnelCloseGrace)
		defer cancel()
		if err := h.relay.Shutdown(tctx); err != nil {
			h.log.Warn("tunnels: not every end was recorded", "error", err.Error())
		}
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// TunnelCloseGrace bounds the closing of the tunnel relays at shutdown.
const TunnelCloseGrace = 5 * time.Second
