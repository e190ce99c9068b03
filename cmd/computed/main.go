// Command computed is the service: one binary for every role (api, workers,
// gateway), chosen by SERVICE_ROLES.
//
//	computed            serve the configured roles
//	computed migrate    apply the embedded migrations and exit
//	computed version    print the release version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"computeplane/internal/buildinfo"
	"computeplane/internal/config"
	"computeplane/internal/host"
	"computeplane/internal/logging"
	"computeplane/internal/store"
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
	cfg, err := config.Load(getenv)
	if err != nil {
		// Configuration errors come before any connection is opened.
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := logging.New(stderr, logging.ParseLevel(cfg.Log.Level))
	switch cmd {
	case "serve":
		h, err := host.New(ctx, cfg, log, host.Options{SkipMigrations: getenv("SERVICE_SKIP_MIGRATIONS") == "1"})
		if err != nil {
			log.Error("startup failed", "error", err.Error())
			return 1
		}
		if err := h.Serve(ctx); err != nil {
			log.Error("serve failed", "error", err.Error())
			return 1
		}
		return 0
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
		fmt.Fprintln(stderr, errors.New("usage: computed [serve|migrate|version]"))
		return 2
	}
}
