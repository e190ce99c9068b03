package provideraccounts_test

// The cloud instance-identity attestor end to end: computed with every
// role as a process, configured with attestors: [cloud]; the localqemu
// metadata service as a process signing each machine's identity document
// with its own key on the machine's socket; compute-agent fetching it at
// join. A machine joins through a bootstrap; for a second machine, forged,
// expired, wrong-audience, another machine's, another account's and
// missing documents are refused with no node, then its genuine document
// joins it and, replayed, is refused.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/agentproto"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/providers"
	"computeplane/internal/providers/instanceid"
	"computeplane/internal/providers/localqemu"
	"computeplane/internal/providers/localqemu/metadata"
)

// startMetadata runs the localqemu metadata service over the provider
// directory's machines, signing with a key the test keeps (to date a
// genuine document in the past), and answers its issuer URL.
func startMetadata(t *testing.T, provDir string) (issuer string, key *ecdsa.PrivateKey, p *proctest.Process) {
	bin := proctest.Build(t, "computeplane/cmd/localqemu-metadata")
	keyFile := filepath.Join(t.TempDir(), "metadata-key.pem")
	key, err := metadata.LoadKey(keyFile)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	dir := filepath.Join(provDir, localqemu.Name)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	p = proctest.Start(t, "localqemu-metadata", bin, proctest.ChildEnv(nil), "--dir", dir, "--key", keyFile, "--listen", addr)
	p.WaitHealthy(t, addr)
	return "http://" + addr, key, p
}

// machineDocument reads a machine's document from its own socket of the
// metadata service, as its daemon does.
func machineDocument(t *testing.T, provDir, machine, audience string) string {
	sock := filepath.Join(provDir, localqemu.Name, machine, metadata.SocketName)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	var doc string
	require.Eventually(t, func() bool { // the service opens a new machine's socket within 200 ms
		req, _ := http.NewRequest(http.MethodGet, "http://metadata"+instanceid.Path+"?audience="+url.QueryEscape(audience), nil)
		req.Header.Set("Metadata-Flavor", "computeplane")
		res, err := hc.Do(req)
		if err != nil {
			return false
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		require.Equal(t, http.StatusOK, res.StatusCode, "%s", b)
		doc = string(b)
		return true
	}, 10*time.Second, 50*time.Millisecond)
	return doc
}

// postJoin presents token and document with a fresh key named hostname,
// straight to the join endpoint, and answers the status and body.
func postJoin(t *testing.T, publicURL, token, hostname, doc string) (int, string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: hostname}}, key)
	require.NoError(t, err)
	body, _ := json.Marshal(agentproto.JoinRequest{Token: token, CSR: csr, CloudIdentity: doc})
	res, err := (&http.Client{Timeout: 15 * time.Second}).Post(publicURL+agentproto.JoinPath, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestCloudAttestedBootstrap(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two VMs and runs computed, the metadata service and compute-agent")
	}
	agentBin := proctest.Build(t, "computeplane/cmd/compute-agent")
	im, imagesDir, provDir := localProvider(t)
	issuer, mdKey, mdProc := startMetadata(t, provDir)
	// The machine's side of the delivery, watched: the wrapper keeps the
	// join token it was given, holds the join while hold-<machine>
	// exists, and joins with doc-<machine> when the test wrote one
	// (instead of fetching a document itself).
	work := t.TempDir()
	wrapper := filepath.Join(work, "agent-wrapper")
	require.NoError(t, os.WriteFile(wrapper, []byte(fmt.Sprintf(`#!/bin/bash
W=%q
if [ "$1" = join ]; then
  h=""; prev=""; for a in "$@"; do [ "$prev" = --hostname ] && h="$a"; prev="$a"; done
  printf %%s "$COMPUTE_AGENT_TOKEN" > "$W/token-$h"
  while [ -e "$W/hold-$h" ]; do sleep 0.1; done
  if [ -e "$W/doc-$h" ]; then
    args=(); skip=0
    for a in "$@"; do
      if [ $skip = 1 ]; then skip=0; continue; fi
      if [ "$a" = --cloud-metadata ]; then skip=1; args+=(--cloud-identity-file "$W/doc-$h"); continue; fi
      args+=("$a")
    done
    exec %q "${args[@]}"
  fi
fi
exec %q "$@"
`, work, agentBin, agentBin)), 0o700))
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\nproviderDir: %q\nbootstrap: {agent: %q}\nattestors: [cloud]\n"+
		"cloud: {issuers: [{issuer: %q, jwksUrl: %q, provider: localqemu}]}\n",
		imagesDir, provDir, wrapper, issuer, issuer+instanceid.JWKSPath))
	ctx := t.Context()
	audience := agentproto.JoinAudience(f.PublicURL)
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	accountConfig := map[string]any{"image": im.ID, "accel": "tcg", "machineTypes": []any{map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256}}}
	acct, err := f.C.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: fleettest.Tenant, Provider: localqemu.Name, Name: "lab",
		Config: raw(accountConfig)})
	require.NoError(t, err)
	account := acct.Data.AccountId
	bootstrap := func(in *client.ProviderAccountsBootstrapInput, within time.Duration) client.Bootstrap {
		var b client.Bootstrap
		require.Eventually(t, func() bool {
			res, err := f.C.ProviderAccountsBootstrap(ctx, in)
			require.NoError(t, err)
			b = res.Data
			require.NotEqual(t, "failed", b.State, "bootstrap failed: %s\n%s", b.Error.Value, proctest.Tail(f.Computed.Stderr.String(), 40))
			return b.State == "joined"
		}, within, 100*time.Millisecond)
		return b
	}
	nodes := func() (n int) {
		require.NoError(t, f.DB.QueryRow(ctx, `select count(*) from nodes where pool_id = $1`, pool).Scan(&n))
		return n
	}

	// 1. An offer claimed: the daemon reads its machine's document from
	// the metadata service at join, and the node joins attested.
	in1 := &client.ProviderAccountsBootstrapInput{TenantId: fleettest.Tenant, AccountId: account, PoolId: pool, IdempotencyKey: "first",
		OfferId: client.NewOptString("small")}
	_, err = f.C.ProviderAccountsBootstrap(ctx, in1)
	require.NoError(t, err)
	b1 := bootstrap(in1, 4*time.Minute)
	machine1 := b1.MachineId.Value
	var attestor, instance, attAccount string
	require.NoError(t, f.DB.QueryRow(ctx, `select attestor, instance_id, account_id from node_attestations where node_id = $1`, b1.NodeId.Value).
		Scan(&attestor, &instance, &attAccount))
	assert.Equal(t, []string{"cloud", machine1, account}, []string{attestor, instance, attAccount})
	assert.Equal(t, 1, nodes())

	// 2. A machine of the account claimed by hand, bootstrapped with its
	// join held: every bad document is refused and leaves no node.
	lq, err := localqemu.New(providers.Env{Dir: filepath.Join(provDir, localqemu.Name), AccountID: account,
		Images: func(context.Context, string) (string, string, string, error) {
			return im.Location, im.Initrd, im.Cmdline, nil
		}},
		json.RawMessage(raw(accountConfig)))
	require.NoError(t, err)
	own, err := lq.Claim(ctx, "small", "by-hand")
	require.NoError(t, err)
	machine2 := own.ID
	require.NoError(t, os.WriteFile(filepath.Join(work, "hold-"+machine2), nil, 0o600))
	in2 := &client.ProviderAccountsBootstrapInput{TenantId: fleettest.Tenant, AccountId: account, PoolId: pool, IdempotencyKey: "second",
		MachineId: client.NewOptString(machine2)}
	_, err = f.C.ProviderAccountsBootstrap(ctx, in2)
	require.NoError(t, err)
	var token string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(work, "token-"+machine2))
		token = string(b)
		return strings.HasPrefix(token, "cjt_")
	}, 2*time.Minute, 50*time.Millisecond, "the install of machine 2 reached its join")

	sign := func(key *ecdsa.PrivateKey, instance, account, aud string, iat time.Time) string {
		doc, err := instanceid.Sign(key, instanceid.Claims{Claims: jwt.Claims{Issuer: issuer, Subject: instance, Audience: jwt.Audience{aud},
			IssuedAt: jwt.NewNumericDate(iat), Expiry: jwt.NewNumericDate(iat.Add(time.Hour))},
			InstanceID: instance, AccountID: account, Region: localqemu.Region, Provider: localqemu.Name})
		require.NoError(t, err)
		return doc
	}
	forger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	for _, c := range []struct{ name, doc, want string }{
		{"no document", "", "an instance-identity document is required"},
		{"forged (another key)", sign(forger, machine2, account, audience, time.Now()), "signature does not verify"},
		{"expired (issued 10 minutes ago, maxAge 5m)", sign(mdKey, machine2, account, audience, time.Now().Add(-10*time.Minute)), "older than 5m0s"},
		{"wrong audience", machineDocument(t, provDir, machine2, "https://elsewhere.example"+agentproto.JoinPath), "not this join endpoint"},
		{"another machine's", machineDocument(t, provDir, machine1, audience), "names instance " + machine1},
		{"another account's", sign(mdKey, machine2, "pac_another", audience, time.Now()), "names account pac_another"},
		{"not a JWT", "not-a-document", "not a signed JWT"},
	} {
		status, body := postJoin(t, f.PublicURL, token, machine2, c.doc)
		assert.Equal(t, http.StatusUnauthorized, status, "%s: %s", c.name, body)
		assert.Contains(t, body, c.want, c.name)
		assert.Contains(t, body, "UNAUTHENTICATED", c.name)
	}
	assert.Equal(t, 1, nodes(), "no refused document left a node")
	var used bool
	require.NoError(t, f.DB.QueryRow(ctx, `select j.used_at is not null from join_tokens j join provider_bootstraps b on b.token_id = j.token_id
		where b.machine_id = $1`, machine2).Scan(&used))
	assert.False(t, used, "no refused document used the token")

	// 3. Its genuine document joins it (the held daemon presents it).
	doc2 := machineDocument(t, provDir, machine2, audience)
	require.NoError(t, os.WriteFile(filepath.Join(work, "doc-"+machine2), []byte(doc2), 0o600))
	require.NoError(t, os.Remove(filepath.Join(work, "hold-"+machine2)))
	b2 := bootstrap(in2, 2*time.Minute)
	var digest string
	require.NoError(t, f.DB.QueryRow(ctx, `select instance_id, document_sha256 from node_attestations where node_id = $1`, b2.NodeId.Value).
		Scan(&instance, &digest))
	assert.Equal(t, machine2, instance)
	assert.Equal(t, instanceid.Digest(doc2), digest)
	assert.Equal(t, 2, nodes())

	// 4. Replayed, the document is refused.
	status, body := postJoin(t, f.PublicURL, token, machine2, doc2)
	assert.Equal(t, http.StatusUnauthorized, status, body)
	assert.Contains(t, body, "already used to join (a replay)")
	assert.Equal(t, 2, nodes(), "the replay made no node")

	// 5. The issuer's keys unreachable: a document signed by a key the
	// cache does not know cannot be judged, UNAVAILABLE with a retry
	// hint (after the 10 s between fetches for unknown keys).
	mdProc.Stop(t, 10*time.Second)
	time.Sleep(11 * time.Second)
	status, body = postJoin(t, f.PublicURL, token, machine2, sign(forger, machine2, account, audience, time.Now()))
	assert.Equal(t, http.StatusServiceUnavailable, status, body)
	assert.Contains(t, body, "UNAVAILABLE")
	assert.Contains(t, body, "retryAfterMs")
	assert.Equal(t, 2, nodes())
}
