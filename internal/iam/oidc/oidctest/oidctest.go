// Package oidctest runs a real OpenID Connect provider for tests: the
// program in tools/oidcprovider (a separate module built on
// github.com/zitadel/oidc/v3's op package), built once per machine into
// .service/bin (`make tools` does the same ahead), on a loopback port.
package oidctest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/proctest"
)

// Audience is the audience of the provider's tokens.
const Audience = "compute-test"

// Provider is one running provider.
type Provider struct {
	Issuer string // http://127.0.0.1:<port>

	admin  string
	server *proctest.Server
}

// Binary returns the provider, building it into .service/bin when it is
// missing or was built from other sources (one build at a time).
func Binary(t testing.TB) string {
	t.Helper()
	src := filepath.Join(proctest.ModuleRoot(t), "tools", "oidcprovider")
	h := sha256.New()
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		require.NoError(t, err)
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return proctest.ToolBinaryOf(t, "oidcprovider", hex.EncodeToString(h.Sum(nil)), func(_, bin string) error {
		cmd := exec.Command("go", "build", "-o", bin, ".")
		cmd.Dir = src
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build tools/oidcprovider: %w: %s", err, b)
		}
		return nil
	})
}

// Option changes how Start runs the provider.
type Option func(*[]string)

// TokenTTL sets the lifetime of the access tokens it issues (5 minutes by
// default): a test longer than that keeps its tokens valid.
func TokenTTL(d time.Duration) Option {
	return func(args *[]string) { *args = append(*args, "-token-ttl", d.String()) }
}

// Start runs a provider; the test's cleanup stops it.
func Start(t testing.TB, opts ...Option) *Provider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := &Provider{Issuer: "http://" + addr, admin: token(16)}
	args := []string{"-addr", addr, "-issuer", p.Issuer, "-audience", Audience}
	for _, o := range opts {
		o(&args)
	}
	p.server = proctest.StartServer(t, proctest.ServerSpec{
		Name: "oidcprovider",
		Bin:  Binary(t),
		Args: args,
		Env:  []string{"OIDCPROVIDER_ADMIN_TOKEN=" + p.admin},
		Ready: func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Issuer+"/.well-known/openid-configuration", nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("discovery answered %s", resp.Status)
			}
			return nil
		},
	})
	return p
}

// Stop stops the provider (an outage).
func (p *Provider) Stop() { p.server.Stop() }

// Config is the service's configuration of this provider.
func (p *Provider) Config() string {
	return fmt.Sprintf("iam: {authentication: {oidc: {issuer: '%s', audience: '%s'}}}\n", p.Issuer, Audience)
}

func (p *Provider) adminCall(t testing.TB, path string, body any) []byte {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, p.Issuer+path, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+p.admin)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	require.Less(t, resp.StatusCode, 300, "%s: %s", path, out.String())
	return out.Bytes()
}

// Token registers a client for identity in tenant (the token's subject and
// tenant claim) and returns an access token issued to it by the
// client-credentials grant.
func (p *Provider) Token(t testing.TB, identity, tenant string) string {
	t.Helper()
	secret := token(16)
	p.adminCall(t, "/admin/clients", map[string]string{"ID": identity, "Secret": secret, "Tenant": tenant})
	return p.tokenFor(t, identity, secret)
}

func (p *Provider) tokenFor(t testing.TB, id, secret string) string {
	t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "scope": {"openid"}}
	req, err := http.NewRequest(http.MethodPost, p.Issuer+"/oauth/token", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(id), url.QueryEscape(secret))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Equal(t, http.StatusOK, resp.StatusCode, "token: %s %s", out.Error, out.Description)
	require.Equal(t, 2, strings.Count(out.AccessToken, "."), "a JWT access token")
	return out.AccessToken
}

// Rotate makes the provider sign with a new key; the old one stays
// published until Retire.
func (p *Provider) Rotate(t testing.TB) { p.adminCall(t, "/admin/rotate", nil) }

// Retire publishes only the key signing now.
func (p *Provider) Retire(t testing.TB) { p.adminCall(t, "/admin/retire", nil) }

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Expiry reads the exp claim of a token the provider issued (not
// verified: the service verifies).
func Expiry(t testing.TB, tok string) time.Time {
	t.Helper()
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 3)
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var claims struct {
		Exp int64 `json:"exp"`
	}
	require.NoError(t, json.Unmarshal(b, &claims))
	return time.Unix(claims.Exp, 0)
}
