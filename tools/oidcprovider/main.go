// Command oidcprovider is a real OpenID Connect provider for tests, built on
// github.com/zitadel/oidc/v3's op package (Apache 2.0) and its in-memory
// example storage: discovery, a JWKS endpoint and the token endpoint,
// issuing JWT access tokens by the client-credentials grant. A client is
// an identity: its id is the token's subject, and the token carries the
// client's tenant in the compute_tenant claim and the configured audience.
//
// Tests drive it through a loopback admin API (bearer -admin-token):
//
//	POST /admin/clients {"id","secret","tenant"}  register a client
//	POST /admin/rotate                             sign with a new key from now on; the old one stays published
//	POST /admin/retire                             publish only the key signing now
//
// It is a separate module (tools/oidcprovider) so that the service's module
// does not carry the provider's dependencies.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	issuer := flag.String("issuer", "", "issuer URL (http://<addr>)")
	audience := flag.String("audience", "compute", "audience of the access tokens")
	claim := flag.String("tenant-claim", "compute_tenant", "claim carrying the client's tenant")
	ttl := flag.Duration("token-ttl", 5*time.Minute, "access token lifetime")
	flag.Parse()
	adminToken := os.Getenv("OIDCPROVIDER_ADMIN_TOKEN")
	if *issuer == "" || adminToken == "" {
		log.Fatal("oidcprovider: -issuer and OIDCPROVIDER_ADMIN_TOKEN are required")
	}
	st := &store{
		Storage:  storage.NewStorage(storage.NewUserStore(*issuer)),
		clients:  map[string]*client{},
		audience: *audience,
		claim:    *claim,
		ttl:      *ttl,
	}
	st.rotate()
	provider, err := op.NewProvider(&op.Config{
		CryptoKey:             sha256.Sum256([]byte(adminToken)),
		CryptoKeyId:           "enc",
		AuthMethodPost:        true,
		GrantTypeRefreshToken: false,
	}, st, op.StaticIssuer(*issuer), op.WithAllowInsecure(), op.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", st.admin(adminToken))
	mux.Handle("/", provider)
	log.Printf("oidcprovider: serving %s on %s", *issuer, *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}

// store is the example storage with clients of the test, JWT access
// tokens by client credentials, and keys that rotate.
type store struct {
	*storage.Storage
	audience, claim string
	ttl             time.Duration

	mu      sync.Mutex
	clients map[string]*client
	signing *key
	keys    []*key // published
}

type key struct {
	id  string
	rsa *rsa.PrivateKey
}

func (k *key) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *key) Key() any                                    { return k.rsa }
func (k *key) ID() string                                  { return k.id }

type public struct{ k *key }

func (p public) ID() string                         { return p.k.id }
func (p public) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (p public) Use() string                        { return "sig" }
func (p public) Key() any                           { return &p.k.rsa.PublicKey }

func (s *store) rotate() string {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signing = &key{id: fmt.Sprintf("k%x", id), rsa: k}
	s.keys = append(s.keys, s.signing)
	return s.signing.id
}

func (s *store) retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = []*key{s.signing}
}

func (s *store) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.signing, nil
}

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]op.Key, len(s.keys))
	for i, k := range s.keys {
		out[i] = public{k}
	}
	return out, nil
}

// client is a confidential client of the client-credentials grant with JWT
// access tokens.
type client struct {
	id, secret, tenant string
}

func (c *client) GetID() string                       { return c.id }
func (c *client) RedirectURIs() []string              { return nil }
func (c *client) PostLogoutRedirectURIs() []string    { return nil }
func (c *client) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c *client) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodBasic }
func (c *client) ResponseTypes() []oidc.ResponseType  { return nil }
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeClientCredentials}
}
func (c *client) LoginURL(string) string              { return "" }
func (c *client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (c *client) IDTokenLifetime() time.Duration      { return time.Hour }
func (c *client) DevMode() bool                       { return true }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(string) bool           { return true }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *client) ClockSkew() time.Duration             { return 0 }

func (s *store) lookup(id string) (*client, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	return c, ok
}

func (s *store) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	if c, ok := s.lookup(id); ok {
		return c, nil
	}
	return s.Storage.GetClientByClientID(ctx, id)
}

func (s *store) AuthorizeClientIDSecret(ctx context.Context, id, secret string) error {
	if c, ok := s.lookup(id); ok {
		if subtle.ConstantTimeCompare([]byte(c.secret), []byte(secret)) == 1 {
			return nil
		}
		return errors.New("invalid client secret")
	}
	return s.Storage.AuthorizeClientIDSecret(ctx, id, secret)
}

func (s *store) ClientCredentials(_ context.Context, id, secret string) (op.Client, error) {
	c, ok := s.lookup(id)
	if !ok || subtle.ConstantTimeCompare([]byte(c.secret), []byte(secret)) != 1 {
		return nil, errors.New("wrong client or secret")
	}
	return c, nil
}

func (s *store) ClientCredentialsTokenRequest(_ context.Context, id string, scopes []string) (op.TokenRequest, error) {
	if _, ok := s.lookup(id); !ok {
		return nil, errors.New("unknown client")
	}
	return &oidc.JWTTokenRequest{Subject: id, Audience: []string{s.audience}, Scopes: scopes}, nil
}

// CreateAccessToken is the example storage's, with the lifetime of
// -token-ttl (the example's is a fixed 5 minutes): the token's exp.
func (s *store) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, _, err := s.Storage.CreateAccessToken(ctx, req)
	return id, time.Now().Add(s.ttl), err
}

func (s *store) GetPrivateClaimsFromScopes(_ context.Context, userID, _ string, _ []string) (map[string]any, error) {
	if c, ok := s.lookup(userID); ok {
		return map[string]any{s.claim: c.tenant}, nil
	}
	return nil, nil
}

func (s *store) admin(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/clients", func(w http.ResponseWriter, r *http.Request) {
		var c struct{ ID, Secret, Tenant string }
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil || c.ID == "" || c.Secret == "" {
			http.Error(w, "id and secret are required", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.clients[c.ID] = &client{id: c.ID, secret: c.Secret, tenant: c.Tenant}
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /admin/rotate", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"kid": s.rotate()})
	})
	mux.HandleFunc("POST /admin/retire", func(w http.ResponseWriter, _ *http.Request) {
		s.retire()
		w.WriteHeader(http.StatusNoContent)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}
