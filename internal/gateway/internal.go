package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"computeplane/gen/db"
	"computeplane/internal/pki"
	"computeplane/internal/store"
)

// The internal control API of a gateway (gateway.internalListen): mutual
// TLS with the internal CA, for the other processes of the deployment. The
// api wakes the gateway that owns a node at once (POST /internal/v1/wake)
// and pushes revocations (POST /internal/v1/revocations); GET
// /internal/v1/sessions says how many sessions it holds. The notifier
// (PostgreSQL NOTIFY) carries the same wake-ups when it is configured;
// this path needs no database round trip.

// Internal API paths.
const (
	InternalWake        = "/internal/v1/wake"
	InternalRevocations = "/internal/v1/revocations"
	InternalSessions    = "/internal/v1/sessions"
)

// internalTLS is the server side: a certificate from the internal CA, and
// clients that present one from it naming an internal role of the trust
// domain.
func (g *Gateway) internalTLS(host string) (*tls.Config, error) {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if host != "" {
		hosts = append(hosts, host)
	}
	cert, err := g.bundle.IssueInternal("gateway", hosts, true)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(g.bundle.InternalCA.Cert)
	td := g.bundle.TrustDomain
	return &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			for _, chain := range chains {
				for _, u := range chain[0].URIs {
					if u.Scheme == "spiffe" && u.Host == td && strings.HasPrefix(u.Path, "/internal/") {
						return nil
					}
				}
			}
			return errors.New("the client certificate names no internal role of this trust domain")
		},
	}, nil
}

// serveInternal starts the internal control API on addr.
func (g *Gateway) serveInternal(addr string) (string, error) {
	host, _, _ := net.SplitHostPort(addr)
	tc, err := g.internalTLS(host)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+InternalWake, func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Topics []string `json:"topics"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&in); err != nil {
			http.Error(w, "a JSON body with topics", http.StatusBadRequest)
			return
		}
		for _, t := range in.Topics {
			g.o.Notifier.Wake(t) // this process's subscribers: the dispatch loop
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+InternalRevocations, func(w http.ResponseWriter, r *http.Request) {
		g.applyRevocations()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+InternalSessions, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"gatewayId": g.id, "sessions": g.count(), "draining": g.draining.Load()})
	})
	mux.HandleFunc("GET "+InternalTunnels+"{node}", g.serveTunnel)
	mux.HandleFunc("POST "+InternalTunnels+"{node}", g.serveTunnelStream)
	g.internal = &http.Server{Handler: mux, TLSConfig: tc, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(g.o.Log.Handler(), slog.LevelDebug),
		// Tunnels are HTTP/2 streams (tunnels.go): as many as the
		// gateway's own bound admits on one connection, each with its
		// window; the connection's window is no bound of its own, so
		// that tunnels whose daemon side is slow cannot stall the others.
		// Its frames stay at HTTP/2's default size: the api's writer of a
		// request's body holds a buffer of that size per open tunnel.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1 << 16, MaxReceiveBufferPerStream: tunnelWindow,
			MaxReceiveBufferPerConnection: 1 << 30}}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := g.internal.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.o.Log.Error("gateway internal API", "error", err.Error())
		}
	}()
	return "https://" + ln.Addr().String(), nil
}

// InternalClient is the api's side of the internal control API: a client
// certificate from the internal CA, and the gateways' internal URLs from
// their rows.
type InternalClient struct {
	Store *store.Store
	Log   *slog.Logger

	once sync.Once
	hc   *http.Client
	// stream is hc without its timeout: tunnels (DialTunnel bounds their
	// answer), on the same connections.
	stream *http.Client
	err    error
	load   func() (*pki.Bundle, error)
}

// NewInternalClient makes the client once the bundle can be read; without
// the internal CA every call is refused (the deployment has not configured
// it).
func NewInternalClient(st *store.Store, bundle func() (*pki.Bundle, error), log *slog.Logger) *InternalClient {
	return &InternalClient{Store: st, Log: log, load: bundle}
}

func (c *InternalClient) client() (*http.Client, error) {
	c.once.Do(func() {
		b, err := c.load()
		if err != nil {
			c.err = fmt.Errorf("gateway internal API: no internal CA: %w", err)
			return
		}
		cert, err := b.IssueInternal("api", nil, false)
		if err != nil {
			c.err = err
			return
		}
		roots := x509.NewCertPool()
		roots.AddCert(b.InternalCA.Cert)
		// HTTP/2: calls and tunnels to a gateway share a connection
		// (a tunnel opens without a TLS handshake of its own).
		tr := &http.Transport{
			TLSClientConfig:   &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, Certificates: []tls.Certificate{cert}},
			ForceAttemptHTTP2: true, IdleConnTimeout: 5 * time.Minute,
			HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: tunnelWindow, MaxReceiveBufferPerConnection: 1 << 30, MaxReadFrameSize: maxH2Frame},
		}
		c.hc = &http.Client{Timeout: 2 * time.Second, Transport: tr}
		c.stream = &http.Client{Transport: tr}
	})
	return c.hc, c.err
}

// Wake asks a gateway to look for work at once (best effort: the
// notifier and its one-second loop remain).
func (c *InternalClient) Wake(ctx context.Context, gatewayID string, topics ...string) error {
	u, err := db.New(c.Store.Pool()).GatewayInternalURL(ctx, gatewayID)
	if err != nil || u == "" {
		return err
	}
	body, _ := json.Marshal(map[string]any{"topics": topics})
	return c.post(ctx, u+InternalWake, body)
}

// PushRevocations tells every live gateway with an internal API to load
// the revocation set now.
func (c *InternalClient) PushRevocations(ctx context.Context) error {
	rows, err := db.New(c.Store.Pool()).LiveInternalURLs(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rows {
		errs = append(errs, c.post(ctx, r.InternalUrl+InternalRevocations, nil))
	}
	return errors.Join(errs...)
}

func (c *InternalClient) post(ctx context.Context, url string, body []byte) error {
	hc, err := c.client()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("gateway internal API %s: HTTP %d", url, resp.StatusCode)
	}
	return nil
}
