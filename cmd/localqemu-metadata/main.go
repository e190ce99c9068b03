// Command localqemu-metadata is the localqemu provider's metadata service
// (internal/providers/localqemu/metadata): it signs each machine's
// instance-identity document, served on a unix socket in the machine's
// directory, and publishes its signing key (JWKS) over HTTP for the
// control plane's cloud join attestor (attestors: [cloud]).
//
//	localqemu-metadata --dir <providerDir>/localqemu --key metadata-key.pem --listen 127.0.0.1:8479
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"computeplane/internal/providers/localqemu/metadata"
)

func main() {
	dir := flag.String("dir", ".service/providers/localqemu", "the localqemu provider's machines directory (<providerDir>/localqemu)")
	keyFile := flag.String("key", "", "the signing key (PEM ECDSA P-256), made when the file does not exist")
	listen := flag.String("listen", "127.0.0.1:8479", "where the published keys (JWKS) are served")
	issuer := flag.String("issuer", "", "the iss of documents (default http://<listen>)")
	ttl := flag.Duration("ttl", metadata.DefaultTTL, "how long a document is valid")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(log, *dir, *keyFile, *listen, *issuer, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "localqemu-metadata:", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, dir, keyFile, listen, issuer string, ttl time.Duration) error {
	if keyFile == "" {
		return errors.New("--key is required")
	}
	if ttl < time.Second || ttl > 24*time.Hour {
		return errors.New("--ttl must be from 1s to 24h")
	}
	key, err := metadata.LoadKey(keyFile)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if issuer == "" {
		issuer = "http://" + l.Addr().String()
	}
	s := &metadata.Service{Dir: dir, Issuer: issuer, Key: key, TTL: ttl, Log: log}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	done := make(chan struct{})
	go func() { s.Watch(ctx, 200*time.Millisecond); close(done) }()
	srv := &http.Server{Handler: s.Public(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("listening", "url", "http://"+l.Addr().String(), "issuer", issuer, "dir", dir)
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-done
	return nil
}
