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
	"time"

	"computeplane"
	"computeplane/gen/api"
	gendocs "computeplane/gen/docs"
	"computeplane/internal/audit"
	"computeplane/internal/config"
	"computeplane/internal/cursor"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/keys"
	"computeplane/internal/metrics"
	"computeplane/internal/rpc"
	"computeplane/internal/secrets"
	"computeplane/internal/server"
	"computeplane/internal/sites"
	"computeplane/internal/store"
	"computeplane/internal/system"
)

// ShutdownGrace is how long open requests get to finish when the listener closes.
const ShutdownGrace = 2 * time.Second

// Host is one running process.
type Host struct {
	cfg      *config.Config
	log      *slog.Logger
	store    *store.Store
	handler  http.Handler
	identity *embedded.Service
	caches   *iam.Cached
}

// Options change how a host starts; the zero value runs migrations.
type Options struct {
	SkipMigrations bool
	Overrides      Overrides
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
	h, err := Assemble(cfg, st, log, opt.Overrides)
	if err != nil {
		st.Close()
		return nil, err
	}
	return h, nil
}

// Assemble builds the host around an open store: services, registry check,
// envelope and routes. Tests use it with a store of their own.
func Assemble(cfg *config.Config, st *store.Store, log *slog.Logger, ov Overrides) (*Host, error) {
	var gw *system.Gateway
	if cfg.Gateway != nil {
		gw = &system.Gateway{URL: cfg.Gateway.URL, ServerName: cfg.Gateway.ServerName}
	}
	sys := system.New(cfg.BasePath, gw)
	cursors := cursor.New(cfg.Secret)
	services := &api.Services{
		System:  sys,
		Sites:   sites.New(cfg.RootTenantID, cursors, nil),
		Secrets: secrets.New(cfg.RootTenantID, string(cfg.Secrets.Store), keys.Derive(cfg.Secret, keys.Secrets)),
	}
	sys.WithChecks(
		system.CatalogCheck(services),
		system.MigrationsCheck(st),
		system.ExtensionCheck(),
		system.ClockCheck(time.Now),
	)
	if ov.Services != nil {
		ov.Services(services)
	}
	now := time.Now
	if ov.Now != nil {
		now = ov.Now
	}
	identity := embedded.New(st, cfg.RootTenantID, cfg.TypePrefix, now)
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
	if err := services.Check(); err != nil {
		return nil, fmt.Errorf("registry check: %w", err)
	}
	reg := metrics.NewRegistry()
	rpcMetrics, err := metrics.NewRPC(reg)
	if err != nil {
		return nil, err
	}
	envelope := &rpc.Handler{
		BasePath: cfg.BasePath,
		Services: services,
		Gate:     gate,
		Store:    st,
		Metrics:  rpcMetrics,
		Audit:    audit.Record,
		Log:      log,
	}
	handler := server.New(server.Options{
		BasePath:     cfg.BasePath,
		RPC:          envelope,
		Store:        st,
		Document:     system.Document(cfg.BasePath, gw),
		MetricsToken: cfg.Metrics.Token,
		MetricsPath:  cfg.Metrics.Path,
		Metrics:      reg,
		OpenAPI:      computeplane.OpenAPI,
		DocsHTML:     gendocs.IndexHTML,
		Log:          log,
	})
	// Forwarding headers are resolved and stripped before anything else.
	handler = iam.WithSourceIP(cfg.TrustedProxies, handler)
	return &Host{cfg: cfg, log: log, store: st, handler: handler, identity: identity, caches: cached}, nil
}

// Identity is the embedded identity service.
func (h *Host) Identity() *embedded.Service { return h.identity }

// Handler is the HTTP surface of the api role.
func (h *Host) Handler() http.Handler { return h.handler }

// Close releases the store.
func (h *Host) Close() { h.store.Close() }

// Serve runs the roles until ctx is done, then shuts down in order: the
// HTTP listener closes with a grace period, then the store.
func (h *Host) Serve(ctx context.Context) error {
	defer h.Close()
	if !h.cfg.HasRole(config.RoleAPI) {
		h.log.Info("no api role: nothing to listen on")
		<-ctx.Done()
		return nil
	}
	// Identity events (revocations) reach this process's caches within
	// about a second.
	go iam.DrainInbox(ctx, h.identity, h.caches.React, iam.InboxPoll, h.log)
	addr := net.JoinHostPort(h.cfg.Host, fmt.Sprint(h.cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	h.log.Info("serving", "addr", ln.Addr().String(), "basePath", h.cfg.BasePath)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	h.log.Info("shutting down")
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
