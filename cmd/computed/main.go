// Command computed is the service: one binary for every role (api, workers,
// gateway), chosen by SERVICE_ROLES.
//
//	computed            serve the configured roles
//	computed migrate    apply the embedded migrations and exit
//	computed iam ...    operator commands of the embedded identity service
//	                    (create-key, revoke-key, list-keys)
//	computed pki init [--trust-domain D]
//	                    write the sealed PKI bundle to SERVICE_PKI unless it exists
//	                    (adding a release key to a bundle without one)
//	computed pki release-key
//	                    print the release public key (PEM) daemons pin
//	computed nodes register ...
//	                    enter a node with a declared capacity (no daemon)
//	computed metal enroll ...
//	                    enter a bare-metal host and start its provisioning workflow
//	computed config check [--no-env] FILE
//	                    check a configuration file offline: every problem, with its option path
//	computed version    print the release version
package main

import (
	"context"
	"errors"
	"expvar"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"computeplane/internal/buildinfo"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/gateway"
	"computeplane/internal/gctarget"
	"computeplane/internal/host"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/logging"
	"computeplane/internal/nodes"
	"computeplane/internal/pki"
	"computeplane/internal/profiles"
	"computeplane/internal/release"
	"computeplane/internal/sshca"
	"computeplane/internal/store"
	"computeplane/internal/workflows"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	if cmd == "version" {
		fmt.Fprintln(stdout, buildinfo.Version())
		return 0
	}
	if cmd == "config" {
		return configCommand(args[1:], getenv, stdout, stderr)
	}
	if cmd == "iam" || cmd == "nodes" || cmd == "metal" {
		// Operator commands find the dev cluster the way make run does.
		getenv = devEnv(getenv, stderr)
	}
	load := config.Load
	if cmd == "serve" {
		// The check `computed config check` makes: the options, then
		// what this build has (every problem of both at once).
		load = func(getenv func(string) string) (*config.Config, error) {
			return host.CheckConfig(getenv, builtin.All())
		}
	}
	cfg, err := load(getenv)
	if err != nil {
		// Configuration errors come before any connection is opened.
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := logging.New(stderr, logging.ParseLevel(cfg.Log.Level))
	switch cmd {
	case "serve":
		if addr := getenv("SERVICE_PPROF_ADDR"); addr != "" {
			servePprof(ctx, addr, log)
		}
		processGC(ctx, cfg, getenv, gateway.Handshakes, log)
		// Workflows render and lock profiles through the profiles group
		// (own, public, then shipped: the specification's lookup order).
		workflows.Profiles, workflows.ProfileLocker = profiles.ForWorkflows{}, profiles.ForWorkflows{}
		h, err := host.New(ctx, cfg, log, host.Options{SkipMigrations: getenv("SERVICE_SKIP_MIGRATIONS") == "1", Plugins: builtin.All()})
		if err != nil {
			log.Error("startup failed", "error", err.Error())
			return 1
		}
		// A fresh install gets one root admin key, printed once, so that
		// its operator can make the first call: made only once every
		// listener is bound, so that a busy port does not lose it.
		ready := func() error {
			token, created, err := h.Identity().EnsureRootAdminKey(ctx)
			if err != nil {
				return fmt.Errorf("root admin key: %w", err)
			}
			banner(stdout, cfg, token, created)
			return nil
		}
		if err := h.Serve(ctx, ready); err != nil {
			log.Error("serve failed", "error", err.Error())
			return 1
		}
		return 0
	case "iam":
		st, err := store.Open(ctx, cfg.Database)
		if err != nil {
			log.Error("iam: open store", "error", err.Error())
			return 1
		}
		defer st.Close()
		if err := st.Migrate(ctx); err != nil {
			log.Error("iam: migrate", "error", err.Error())
			return 1
		}
		return embedded.RunCommand(ctx, embedded.New(st, cfg.RootTenantID, cfg.TypePrefix, time.Now), args[1:], stdout, stderr)
	case "nodes":
		st, err := store.Open(ctx, cfg.Database)
		if err != nil {
			log.Error("nodes: open store", "error", err.Error())
			return 1
		}
		defer st.Close()
		if err := st.Migrate(ctx); err != nil {
			log.Error("nodes: migrate", "error", err.Error())
			return 1
		}
		identity := embedded.New(st, cfg.RootTenantID, cfg.TypePrefix, time.Now)
		return nodes.RunCommand(ctx, st, identity.Projection(), cfg.TypePrefix, args[1:], stdout, stderr)
	case "metal":
		st, err := store.Open(ctx, cfg.Database)
		if err != nil {
			log.Error("metal: open store", "error", err.Error())
			return 1
		}
		defer st.Close()
		if err := st.Migrate(ctx); err != nil {
			log.Error("metal: migrate", "error", err.Error())
			return 1
		}
		identity := embedded.New(st, cfg.RootTenantID, cfg.TypePrefix, time.Now)
		return workflows.RunCommand(ctx, st, identity.Projection(), cfg.TypePrefix, args[1:], stdout, stderr)
	case "pki":
		if len(args) > 1 && args[1] == "revoke" {
			st, err := store.Open(ctx, cfg.Database)
			if err != nil {
				log.Error("pki: open store", "error", err.Error())
				return 1
			}
			defer st.Close()
			return gateway.RunRevokeCommand(ctx, st, pki.Loader(cfg.PKIFile, cfg.Secret), args[2:], stdout, stderr)
		}
		return pkiCommand(cfg, args[1:], stdout, stderr)
	case "migrate":
		st, err := store.Open(ctx, cfg.Database)
		if err == nil {
			defer st.Close()
			err = st.Migrate(ctx)
		}
		if err != nil {
			log.Error("migrate failed", "error", err.Error())
			return 1
		}
		return 0
	default:
		fmt.Fprintln(stderr, errors.New("usage: computed [serve|migrate|iam|nodes|metal|pki|config|version]"))
		return 2
	}
}

// configCommand runs `computed config check FILE`: the file (as
// SERVICE_CONFIG) with the environment on top, checked as serve checks it
// at start, offline. Every problem is printed, one a line with its option
// path; exit 1 when there is any, 2 for a usage error.
func configCommand(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("computed config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	noEnv := fs.Bool("no-env", false, "check the file alone, without the SERVICE_* environment (database and secret must then be in it)")
	if len(args) == 0 || args[0] != "check" || fs.Parse(args[1:]) != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: computed config check [--no-env] FILE")
		return 2
	}
	file := fs.Arg(0)
	env := func(k string) string {
		switch {
		case k == config.EnvConfig:
			return file
		case *noEnv:
			return ""
		}
		return getenv(k)
	}
	_, err := host.CheckConfig(env, builtin.All())
	problems := config.Problems(err)
	if err != nil && len(problems) == 0 {
		fmt.Fprintln(stderr, "computed config check:", err)
		return 1
	}
	for _, p := range problems {
		fmt.Fprintln(stdout, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "%s: %d problem(s)\n", file, len(problems))
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", file)
	return 0
}

// pkiCommand runs `computed pki init`: a new bundle (CAs, join and
// command signing keys, SSH CA) sealed with the service secret at
// SERVICE_PKI, or the one already there with what it lacks added.
func pkiCommand(cfg *config.Config, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("computed pki init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	domain := fs.String("trust-domain", pki.DefaultTrustDomain, "SPIFFE trust domain of node identities")
	if len(args) == 1 && args[0] == "release-key" {
		// The public half, for operators to pin (compute-agent upgrade
		// --release-key) and to verify releases with.
		b, err := pki.Loader(cfg.PKIFile, cfg.Secret)()
		if err == nil && b.ReleaseKey() == nil {
			err = errors.New("the bundle has no release key yet: computed pki init adds one")
		}
		if err != nil {
			fmt.Fprintln(stderr, "computed pki release-key:", err)
			return 1
		}
		_, _ = stdout.Write(release.PublicKeyPEM(b.ReleaseKey()))
		return 0
	}
	if len(args) == 0 || args[0] != "init" || fs.Parse(args[1:]) != nil {
		fmt.Fprintln(stderr, "usage: computed pki init [--trust-domain D] | computed pki release-key | computed pki revoke --node ID | --serial HEX")
		return 2
	}
	b, made, err := pki.Init(cfg.PKIFile, cfg.Secret, *domain)
	if err != nil {
		fmt.Fprintln(stderr, "computed pki init:", err)
		return 1
	}
	what := "kept the PKI bundle in"
	if made {
		what = "wrote a new PKI bundle to"
	}
	fmt.Fprintf(stdout, "%s %s (trust domain %s, version %d, node CA %s)\n", what, cfg.PKIFile, b.TrustDomain, b.TrustVersion, pki.Fingerprint(b.NodeCA.Cert)[:16])
	if ca, err := sshca.New(b.SSHCA, nil); err == nil {
		fmt.Fprintf(stdout, "SSH CA (TrustedUserCAKeys): %s\n", ca.AuthorizedKey())
	}
	return 0
}

// devEnv fills SERVICE_DATABASE_URL and SERVICE_SECRET, when both are
// unset, from the private dev cluster under .service/ in the working
// directory (scripts/devdb.sh starts it if needed), as make run does.
func devEnv(getenv func(string) string, stderr io.Writer) func(string) string {
	if getenv(config.EnvDatabaseURL) != "" || getenv(config.EnvSecret) != "" {
		return getenv
	}
	secret, err := os.ReadFile(filepath.Join(".service", "secret"))
	if err != nil {
		return getenv // no dev cluster here
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, err := exec.CommandContext(ctx, filepath.Join("scripts", "devdb.sh"), "start").Output()
	if err != nil {
		fmt.Fprintln(stderr, "computed: the dev cluster under .service/ did not start:", err)
		return getenv
	}
	fmt.Fprintln(stderr, "computed: using the dev cluster under .service/")
	dev := map[string]string{
		config.EnvDatabaseURL: strings.TrimSpace(string(url)),
		config.EnvSecret:      strings.TrimSpace(string(secret)),
	}
	return func(k string) string {
		if v, ok := dev[k]; ok {
			return v
		}
		return getenv(k)
	}
}

// banner tells the person who started the process where the API and its
// reference are and, on the first start, the root admin key with lines to
// paste for the CLI and curl.
func banner(w io.Writer, cfg *config.Config, token string, created bool) {
	if !cfg.HasRole(config.RoleAPI) {
		return
	}
	api := cfg.BaseURL + cfg.BasePath
	fmt.Fprintf(w, "computed: API %s, reference %s/docs\n", api, api)
	if !created {
		return
	}
	fmt.Fprintf(w, "Root admin API key of tenant %s (shown once, stored only as a hash). To use it:\n", cfg.RootTenantID)
	fmt.Fprintf(w, "  export SERVICE_URL=%s SERVICE_TOKEN=%s SERVICE_TENANT=%s\n", cfg.BaseURL, token, cfg.RootTenantID)
	fmt.Fprintln(w, token)
}

// servePprof serves net/http/pprof on a private address (SERVICE_PPROF_ADDR,
// e.g. 127.0.0.1:6060) for profiling a running process; never on the API
// listener.
func servePprof(ctx context.Context, addr string, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/debug/vars", expvar.Handler()) // the roles' counters (the gateway's hellos and statuses)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof listener failed", "error", err.Error())
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
}

// GatewayGCPercent is the collector's target on a process that runs the
// gateway role alone. Its heap is mostly long-lived session state and it
// allocates little once sessions are idle, so a tighter target costs
// little CPU and keeps an idle session near 32 KiB instead of 45
// (docs/benchmarks-notes.md). During a reconnect storm the target is
// raised for a while (processGC, internal/gctarget; docs/gateway.md,
// "Memory"). GOGC in the environment wins.
const GatewayGCPercent = 20

// APIGCPercent is the collector's target on a process that serves the api
// role without the gateway's. Every call allocates (about 7.6 KB for a
// cached sites.get, net/http's share included) and the benchmark gives the
// process one core, so each cycle's mark phase fills that core for about
// 10 ms and stalls the calls beside it: those stalls are the half-load p99
// (docs/benchmarks-notes.md, "The collector's mark"). At 400 the heap goal
// is five times the live heap, about 3 MB at rest and 5 to 10 MB under
// load since the catalog's patterns stopped being regexps (2026-11-29).
// Larger targets did not help: 600 and 1000 at 6,300 sites.get a second
// made fewer but longer stalls, during which the load generator opened
// more connections, each adding to the next mark, and the p99 was no
// better in interleaved runs; a floor of 256 MB made stalls of 40 to 70
// ms, most of each after its mark (the larger heap's sweep), and the p99
// worse (docs/benchmarks-notes.md, "a heap floor"). GOGC in the
// environment wins; GOMEMLIMIT still caps the heap.
const APIGCPercent = 400

// processGC sets the collector's target for the roles this process runs.
// On a gateway-only process it also starts the storm policy until ctx
// ends: while handshakes (the gateway's count, gateway.Handshakes) come
// at a reconnect storm's rate the target is raised to
// gctarget.StormPercent, then set back and the storm's garbage returned
// to the OS (internal/gctarget). It says whether it started the policy:
// not elsewhere, and not whenever GOGC is set.
func processGC(ctx context.Context, cfg *config.Config, getenv func(string) string, handshakes func() int64, log *slog.Logger) (stormPolicy bool) {
	if getenv("GOGC") != "" {
		return false
	}
	switch {
	case len(cfg.Roles) == 1 && cfg.Roles[0] == config.RoleGateway:
		debug.SetGCPercent(GatewayGCPercent)
		log.Info("gateway-only process: collector target lowered", "gcPercent", GatewayGCPercent, "stormGcPercent", gctarget.StormPercent)
		go gctarget.New(GatewayGCPercent, gctarget.StormPercent, handshakes, debug.SetGCPercent, debug.FreeOSMemory, log).Run(ctx)
		return true
	case slices.Contains(cfg.Roles, config.RoleAPI) && !slices.Contains(cfg.Roles, config.RoleGateway):
		debug.SetGCPercent(APIGCPercent)
		log.Info("api process: collector target raised", "gcPercent", APIGCPercent)
	}
	return false
}
