// Package metadata is the localqemu provider's metadata service: what a
// cloud's instance metadata endpoint (169.254.169.254) is to its
// machines. It signs each machine's instance-identity document
// (internal/providers/instanceid) with the service's own key and
// publishes that key (JWKS) for the control plane's cloud join attestor.
//
// A machine reaches only its own document: the service listens on a unix
// socket in each machine's directory (<providerDir>/localqemu/<id>/
// metadata.sock, mode 0600 in a 0700 directory), the way a cloud answers
// a machine from its own link-local address. The daemon of a localqemu
// machine runs beside its VM (docs/providers.md), so that socket is the
// machine's own channel. The service watches the directory: a machine
// that appears gets its socket, one that is released loses it.
package metadata

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"

	"computeplane/internal/providers/instanceid"
)

// SocketName is the socket in each machine's directory.
const SocketName = "metadata.sock"

// DefaultTTL is how long a document is valid (its exp).
const DefaultTTL = 10 * time.Minute

// Service signs the documents of the machines under Dir.
type Service struct {
	Dir    string // <providerDir>/localqemu
	Issuer string
	Key    *ecdsa.PrivateKey
	TTL    time.Duration
	Log    *slog.Logger
	Now    func() time.Time

	mu      sync.Mutex
	sockets map[string]*http.Server // machine id -> its socket's server
}

// machine is what the service reads of a machine's machine.json.
type machine struct {
	ID        string `json:"id"`
	AccountID string `json:"accountId"`
	Region    string `json:"region"`
}

// LoadKey reads a PEM (PKCS#8 or SEC 1) ECDSA P-256 key, or makes one
// and writes it (0600) when the file does not exist.
func LoadKey(path string) (*ecdsa.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, err
		}
		return k, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	}
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("metadata: %s is not PEM", path)
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", path, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("metadata: %s is not an ECDSA P-256 key", path)
	}
	return ek, nil
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Public serves the published keys (JWKS) and /healthz.
func (s *Service) Public() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+instanceid.JWKSPath, func(w http.ResponseWriter, _ *http.Request) {
		set, err := instanceid.JWKS(&s.Key.PublicKey)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "max-age=300")
		_ = json.NewEncoder(w).Encode(set)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// machineHandler answers machine id's own document.
func (s *Service) machineHandler(id string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+instanceid.Path, func(w http.ResponseWriter, r *http.Request) {
		// As GCP's: a request without the header (a proxied one) is refused.
		if r.Header.Get("Metadata-Flavor") == "" {
			http.Error(w, "the Metadata-Flavor header is required", http.StatusForbidden)
			return
		}
		aud := r.URL.Query().Get("audience")
		if u, err := url.Parse(aud); aud == "" || len(aud) > 512 || err != nil || u.Scheme == "" || u.Host == "" {
			http.Error(w, "audience must be the absolute URL of the endpoint the document is for", http.StatusBadRequest)
			return
		}
		m, err := s.read(id)
		if err != nil {
			http.Error(w, "this machine is gone", http.StatusNotFound)
			return
		}
		now := s.now()
		jti := make([]byte, 16)
		_, _ = rand.Read(jti)
		ttl := s.TTL
		if ttl <= 0 {
			ttl = DefaultTTL
		}
		doc, err := instanceid.Sign(s.Key, instanceid.Claims{
			Claims: jwt.Claims{Issuer: s.Issuer, Subject: m.ID, Audience: jwt.Audience{aud}, IssuedAt: jwt.NewNumericDate(now),
				NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(ttl)), ID: hex.EncodeToString(jti)},
			InstanceID: m.ID, AccountID: m.AccountID, Region: m.Region, Provider: "localqemu",
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.Log.Info("document issued", "machine", m.ID, "audience", aud)
		w.Header().Set("Content-Type", "application/jwt")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(doc))
	})
	return mux
}

func (s *Service) read(id string) (*machine, error) {
	b, err := os.ReadFile(filepath.Join(s.Dir, id, "machine.json"))
	if err != nil {
		return nil, err
	}
	var m machine
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m.ID != id || m.AccountID == "" {
		return nil, fmt.Errorf("metadata: %s: not a machine record", id)
	}
	if m.Region == "" {
		m.Region = "local" // machines recorded before the region was
	}
	return &m, nil
}

// Watch gives each machine under Dir its socket until ctx ends, checking
// every interval; at the end every socket closes and is removed.
func (s *Service) Watch(ctx context.Context, interval time.Duration) {
	s.mu.Lock()
	s.sockets = map[string]*http.Server{}
	s.mu.Unlock()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.sync()
		select {
		case <-ctx.Done():
			s.mu.Lock()
			defer s.mu.Unlock()
			for id, srv := range s.sockets {
				_ = srv.Close()
				_ = os.Remove(filepath.Join(s.Dir, id, SocketName))
			}
			return
		case <-t.C:
		}
	}
}

// sync opens the sockets of new machines and closes those of machines
// that are gone.
func (s *Service) sync() {
	entries, _ := os.ReadDir(s.Dir)
	live := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "lq_") {
			continue
		}
		if _, err := s.read(e.Name()); err == nil {
			live[e.Name()] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, srv := range s.sockets {
		if !live[id] {
			_ = srv.Close()
			delete(s.sockets, id)
		}
	}
	for id := range live {
		if s.sockets[id] != nil {
			continue
		}
		path := filepath.Join(s.Dir, id, SocketName)
		_ = os.Remove(path) // a socket left by an earlier run
		l, err := net.Listen("unix", path)
		if err != nil {
			s.Log.Warn("machine socket", "machine", id, "error", err.Error())
			continue
		}
		_ = os.Chmod(path, 0o600)
		srv := &http.Server{Handler: s.machineHandler(id), ReadHeaderTimeout: 5 * time.Second}
		s.sockets[id] = srv
		go func() { _ = srv.Serve(l) }()
		s.Log.Info("machine socket", "machine", id, "path", path)
	}
}
