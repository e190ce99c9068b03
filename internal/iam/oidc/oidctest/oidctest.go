// Package oidctest runs a real OpenID Connect provider for tests: the
// program in tools/oidcprovider (a separate module built on
// github.com/zitadel/oidc/v3's op package), built once per machine into
// .service/bin (`make tools` does the same ahead), on a loopback port.
package oidctest

import (
	"bytes"
	"context"
	"crypto/rand"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Audience is the audience of the provider's tokens.
const Audience = "compute-test"

// Provider is one running provider.
type Provider struct {
	Issuer string // http://127.0.0.1:<port>

	bin, admin, log string
	addr            string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the provider, building it into .service/bin when it is
// missing (one build at a time).
func Binary(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir := filepath.Join(root, ".service", "bin")
	bin := filepath.Join(dir, "oidcprovider")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	lock, err := os.OpenFile(filepath.Join(dir, ".oidcprovider.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "tools", "oidcprovider")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "build tools/oidcprovider: %s", b)
	return bin
}

// Start runs a provider; the test's cleanup stops it.
func Start(t testing.TB) *Provider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := &Provider{Issuer: "http://" + addr, bin: Binary(t), admin: token(16), addr: addr,
		log: filepath.Join(t.TempDir(), "oidcprovider.log")}
	t.Cleanup(p.Stop)
	p.start(t)
	return p
}

func (p *Provider) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	cmd := exec.Command(p.bin, "-addr", p.addr, "-issuer", p.Issuer, "-audience", Audience)
	cmd.Env = append(os.Environ(), "OIDCPROVIDER_ADMIN_TOKEN="+p.admin)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.Issuer + "/.well-known/openid-configuration")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			b, _ := os.ReadFile(p.log)
			t.Fatalf("oidcprovider exited at start: %s", b)
		default:
		}
		require.True(t, time.Now().Before(deadline), "oidcprovider did not serve within 30 s: %v", err)
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the provider (an outage).
func (p *Provider) Stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

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
