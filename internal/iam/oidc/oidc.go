// Package oidc authenticates JWT access tokens of an external OpenID
// Connect provider in front of the embedded identity service: discovery
// (issuer/.well-known/openid-configuration), the provider's JWKS (fetched
// again when a token names an unknown key and at most KeysTTL after the
// last fetch, so rotated keys are taken and removed keys refused), the
// issuer, the audience and the token's time window. A token's subject is
// an identity the embedded service keeps (its home tenant and role
// bindings decide); the token must carry the same tenant in the tenant
// claim. Other credentials (API keys) go to the embedded service. The
// mapping is written down in docs/identity.md ("External authentication").
package oidc

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"computeplane/internal/config"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
)

// SessionKindJWT is the session kind of callers authenticated by a token.
const SessionKindJWT = "jwt"

// KeysTTL is how long a fetched JWKS is used before it is fetched again;
// minRefetch spaces fetches caused by unknown key ids.
const (
	KeysTTL    = 10 * time.Second
	minRefetch = time.Second
	// leeway is the clock skew allowed on exp, nbf and iat.
	leeway = 30 * time.Second
)

// algorithms are the signature algorithms accepted.
var algorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.ES256, jose.ES384, jose.EdDSA}

// Keeper is the embedded service the authenticator stands in front of.
type Keeper interface {
	iam.Port
	RoleOf(ctx context.Context, tenant, identity string) (string, error)
	CheckDelegation(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error
	IdentityOf(ctx context.Context, id string) (tenant, kind string, ok bool, err error)
}

var _ Keeper = (*embedded.Service)(nil)

// Authenticator is the keeper with OIDC access tokens accepted too; it is
// itself a keeper, so decisions (embedded or SpiceDB) go on unchanged.
type Authenticator struct {
	Keeper
	cfg    *config.OIDC
	client *http.Client
	now    func() time.Time

	mu        sync.Mutex
	jwksURI   string // from discovery; "" until discovered
	keys      jose.JSONWebKeySet
	fetchedAt time.Time
}

// New returns the authenticator; now is the clock (time.Now when nil).
func New(k Keeper, cfg *config.OIDC, now func() time.Time) (*Authenticator, error) {
	if now == nil {
		now = time.Now
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("oidc: caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("oidc: caFile holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Authenticator{Keeper: k, cfg: cfg, now: now,
		client: &http.Client{Timeout: cfg.Timeout, Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// Authenticate verifies a JWT (three dot-separated parts) as an access
// token of the provider; anything else is the keeper's.
func (a *Authenticator) Authenticate(ctx context.Context, cred iam.Credential) (*iam.Caller, error) {
	if strings.Count(cred.Token, ".") != 2 {
		return a.Keeper.Authenticate(ctx, cred)
	}
	claims, err := a.verify(ctx, cred.Token)
	if err != nil {
		return nil, err
	}
	tenant, kind, ok, err := a.IdentityOf(ctx, claims.Subject)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: subject %q is no identity of the service", iam.ErrUnauthenticated, claims.Subject)
	}
	if claims.tenant != tenant {
		return nil, fmt.Errorf("%w: the token's %s is not the identity's tenant", iam.ErrUnauthenticated, a.cfg.TenantClaim)
	}
	sum := sha256.Sum256([]byte(cred.Token))
	return &iam.Caller{
		IdentityID:   claims.Subject,
		IdentityKind: kind,
		TenantID:     tenant,
		SessionKind:  SessionKindJWT,
		MFA:          slices.Contains(claims.AMR, "mfa"),
		Session:      "jwt:" + hex.EncodeToString(sum[:12]),
	}, nil
}

type tokenClaims struct {
	Issuer    string          `json:"iss"`
	Subject   string          `json:"sub"`
	Audience  json.RawMessage `json:"aud"`
	Expiry    *float64        `json:"exp"`
	NotBefore *float64        `json:"nbf"`
	IssuedAt  *float64        `json:"iat"`
	AMR       []string        `json:"amr"`
	tenant    string
}

// verify checks the signature by the provider's published keys, then the
// issuer, the audience and the time window.
func (a *Authenticator) verify(ctx context.Context, token string) (*tokenClaims, error) {
	jws, err := jose.ParseSigned(token, algorithms)
	if err != nil || len(jws.Signatures) != 1 {
		return nil, fmt.Errorf("%w: not a signed JWT", iam.ErrUnauthenticated)
	}
	kid := jws.Signatures[0].Header.KeyID
	key, err := a.key(ctx, kid)
	if err != nil {
		return nil, err
	}
	payload, err := jws.Verify(key)
	if err != nil {
		return nil, fmt.Errorf("%w: signature: %v", iam.ErrUnauthenticated, err)
	}
	var c tokenClaims
	var raw map[string]any
	if json.Unmarshal(payload, &c) != nil || json.Unmarshal(payload, &raw) != nil {
		return nil, fmt.Errorf("%w: claims are not JSON", iam.ErrUnauthenticated)
	}
	if c.Issuer != a.cfg.Issuer {
		return nil, fmt.Errorf("%w: issuer %q", iam.ErrUnauthenticated, c.Issuer)
	}
	if !audienceHas(c.Audience, a.cfg.Audience) {
		return nil, fmt.Errorf("%w: audience", iam.ErrUnauthenticated)
	}
	now := a.now()
	switch {
	case c.Expiry == nil || now.After(unix(*c.Expiry).Add(leeway)):
		return nil, fmt.Errorf("%w: expired", iam.ErrUnauthenticated)
	case c.NotBefore != nil && now.Add(leeway).Before(unix(*c.NotBefore)):
		return nil, fmt.Errorf("%w: not yet valid", iam.ErrUnauthenticated)
	case c.IssuedAt != nil && now.Add(leeway).Before(unix(*c.IssuedAt)):
		return nil, fmt.Errorf("%w: issued in the future", iam.ErrUnauthenticated)
	case c.Subject == "":
		return nil, fmt.Errorf("%w: no subject", iam.ErrUnauthenticated)
	}
	c.tenant, _ = raw[a.cfg.TenantClaim].(string)
	if c.tenant == "" {
		return nil, fmt.Errorf("%w: no %s claim", iam.ErrUnauthenticated, a.cfg.TenantClaim)
	}
	return &c, nil
}

func unix(f float64) time.Time { return time.Unix(int64(f), 0) }

func audienceHas(raw json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	return json.Unmarshal(raw, &many) == nil && slices.Contains(many, want)
}

// key returns the published key kid names: from the keys fetched less than
// KeysTTL ago, else (or when kid is unknown) from a fresh fetch.
func (a *Authenticator) key(ctx context.Context, kid string) (*jose.JSONWebKey, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	fresh := !a.fetchedAt.IsZero() && now.Sub(a.fetchedAt) < KeysTTL
	if fresh {
		if k := find(a.keys, kid); k != nil {
			return k, nil
		}
		if now.Sub(a.fetchedAt) < minRefetch {
			return nil, fmt.Errorf("%w: unknown signing key %q", iam.ErrUnauthenticated, kid)
		}
	}
	if err := a.fetchKeys(ctx); err != nil {
		return nil, err
	}
	if k := find(a.keys, kid); k != nil {
		return k, nil
	}
	return nil, fmt.Errorf("%w: unknown signing key %q", iam.ErrUnauthenticated, kid)
}

func find(set jose.JSONWebKeySet, kid string) *jose.JSONWebKey {
	for i := range set.Keys {
		k := &set.Keys[i]
		if (kid == "" || k.KeyID == kid) && k.Valid() && k.IsPublic() && (k.Use == "" || k.Use == "sig") {
			return k
		}
	}
	return nil
}

// fetchKeys discovers the provider (once) and fetches its JWKS; a failure
// is the provider being unavailable.
func (a *Authenticator) fetchKeys(ctx context.Context) error {
	if a.jwksURI == "" {
		var doc struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		if err := a.getJSON(ctx, strings.TrimSuffix(a.cfg.Issuer, "/")+"/.well-known/openid-configuration", &doc); err != nil {
			return err
		}
		if doc.Issuer != a.cfg.Issuer || doc.JWKSURI == "" {
			return fmt.Errorf("%w: oidc discovery names issuer %q and jwks_uri %q", iam.ErrUnavailable, doc.Issuer, doc.JWKSURI)
		}
		a.jwksURI = doc.JWKSURI
	}
	var set jose.JSONWebKeySet
	if err := a.getJSON(ctx, a.jwksURI, &set); err != nil {
		return err
	}
	a.keys, a.fetchedAt = set, a.now()
	return nil
}

func (a *Authenticator) getJSON(ctx context.Context, url string, into any) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("%w: oidc: %w", iam.ErrUnavailable, err)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: oidc: %w", iam.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: oidc: GET %s: %s %v", iam.ErrUnavailable, url, resp.Status, err)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("%w: oidc: GET %s: %w", iam.ErrUnavailable, url, err)
	}
	return nil
}
