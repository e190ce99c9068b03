package tunnels_test

// SSH through a tunnel end to end: computed (api and gateway), a
// compute-agent with the qemu runtime, a sandbox that is a real VM (TCG)
// whose compute-guest serves SSH, and the system's OpenSSH client run by
// computectl ssh (its ProxyCommand is computectl tunnels ssh-proxy).

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/cli"
	"computeplane/internal/config"
	"computeplane/internal/fleettest"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/sshca"
	"computeplane/internal/testenv"
)

type run struct {
	code           int
	stdout, stderr string
}

func runCmd(t *testing.T, env []string, stdin, bin string, args ...string) run {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	require.NoError(t, cmd.Start())
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s %v: no end within 90 s; stderr: %s", bin, args, errOut.String())
	}
	return run{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
}

func TestSSHIntoASandbox(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("the OpenSSH client is not installed (apt-get install openssh-client; .ci/run installs it)")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.SSH())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("computed:\n%s\nagent:\n%s", proctest.Tail(f.Computed.Stderr.String(), 60), proctest.Tail(agent.Proc.Stderr.String(), 60))
		}
	})
	ctx := t.Context()
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool,
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone), Flavor: "small", ImageId: "computeplane/minimal"})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	id := sbx.Data.SandboxId
	require.Eventually(t, func() bool {
		g, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: id})
		require.NoError(t, err)
		return g.Data.State == "running"
	}, 60*time.Second, 100*time.Millisecond)

	computectl := proctest.Build(t, "computeplane/cmd/computectl")
	env := append(os.Environ(), cli.EnvURL+"="+f.PublicURL, cli.EnvToken+"="+f.Key, cli.EnvTenant+"="+fleettest.Tenant,
		cli.EnvConfig+"="+filepath.Join(t.TempDir(), "none.json"))

	// A command with its stdin, its output and its exit code, through
	// the system's ssh with a certificate made for the call.
	start := time.Now()
	r := runCmd(t, env, "hello\n", computectl, "ssh", id, "--", "read x; echo got $x from $USER; echo to-err >&2; exit 7")
	t.Logf("computectl ssh (key, certificate, tunnel, handshake, command): %v", time.Since(start))
	require.Equal(t, 7, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
	assert.Equal(t, "got hello from root\n", r.stdout)
	assert.Equal(t, "to-err\n", r.stderr)
	// With a terminal asked for (-t): the program runs on one.
	r = runCmd(t, env, "", computectl, "ssh", "-t", "root@"+id, "tty")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^/dev/pts/\d+\r\n$`, r.stdout)

	// The tunnel and the certificates are recorded.
	l, err := f.C.TunnelsList(ctx, &client.TunnelsListInput{TenantId: fleettest.Tenant, IncludeClosed: client.NewOptBool(true)})
	require.NoError(t, err)
	require.Len(t, l.Data.Items, 2)
	assert.Equal(t, client.TunnelKindSSH, l.Data.Items[0].Kind)
	assert.Empty(t, l.Data.Items[0].Argv)
	assert.Equal(t, 2, f.Events("security.ssh.certificate.issued", id))
	require.Eventually(t, func() bool {
		return f.Events("tunnel.closed", l.Data.Items[1].TunnelId) == 1
	}, 10*time.Second, 50*time.Millisecond)

	// Certificates the guest refuses: signed by another CA, expired,
	// for another target. ssh is run by hand with the same ProxyCommand.
	bundleFile, err := os.ReadFile(f.PKIFile)
	require.NoError(t, err)
	bundle, err := pki.Open(testenv.TestSecret, bundleFile)
	require.NoError(t, err)
	ours, err := sshca.New(bundle.SSHCA, nil)
	require.NoError(t, err)
	hourAgo, err := sshca.New(bundle.SSHCA, func() time.Time { return time.Now().Add(-time.Hour) })
	require.NoError(t, err)
	_, foreignKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	foreign, err := sshca.New(foreignKey, nil)
	require.NoError(t, err)
	sshWith := func(ca *sshca.CA, principal string) run {
		t.Helper()
		dir := t.TempDir()
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		blk, err := ssh.MarshalPrivateKey(priv, "")
		require.NoError(t, err)
		key := filepath.Join(dir, "id")
		require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(blk), 0o600))
		spub, err := ssh.NewPublicKey(pub)
		require.NoError(t, err)
		cert, err := ca.SignUser(sshca.UserRequest{Key: spub, Principals: []string{principal}, KeyID: "test"})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(key+"-cert.pub", []byte(sshca.AuthorizedKey(cert)+"\n"), 0o600))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "known_hosts"), []byte(sshca.KnownHostsLine(ours.PublicKey(), id)+"\n"), 0o600))
		return runCmd(t, env, "", "ssh", "-F", "/dev/null", "-o", "IdentityFile="+key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
			"-o", "BatchMode=yes", "-o", "UserKnownHostsFile="+filepath.Join(dir, "known_hosts"), "-o", "StrictHostKeyChecking=yes",
			"-o", "HostKeyAlias="+id, "-o", fmt.Sprintf("ProxyCommand=%s tunnels ssh-proxy --target-kind sandbox --target-id %s", computectl, id),
			"-l", "root", id, "echo in")
	}
	r = sshWith(ours, "root@"+id)
	require.Equal(t, 0, r.code, "the deployment's CA, a valid certificate: %s", r.stderr)
	assert.Equal(t, "in\n", r.stdout)
	for name, refused := range map[string]run{
		"another CA":     sshWith(foreign, "root@"+id),
		"expired":        sshWith(hourAgo, "root@"+id),
		"another target": sshWith(ours, "root@sbx_0000000000000000000000000a"),
	} {
		assert.Equal(t, 255, refused.code, name)
		assert.Contains(t, refused.stderr, "Permission denied", name)
		assert.Empty(t, refused.stdout, name)
	}

	// Break-glass certificates for a node: a root-tenant operator, from
	// an MFA session only.
	node := agent.Node
	rootKey := f.CreateKey(config.DefaultRootTenantID, "operator", "owner")
	mfaKey := f.CreateKey(config.DefaultRootTenantID, "operator", "owner", "--mfa")
	as := func(key string) *computeclient.Client {
		c, err := computeclient.New(f.PublicURL+config.DefaultBasePath, computeclient.WithToken(key),
			computeclient.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
		require.NoError(t, err)
		return c
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	spub, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	pubLine := sshca.AuthorizedKey(spub)
	forNode := &client.TunnelsIssueSshCertificateInput{TenantId: config.DefaultRootTenantID, NodeId: client.NewOptString(node), PublicKey: pubLine}
	_, err = as(rootKey).TunnelsIssueSshCertificate(ctx, forNode)
	e, ok := computeclient.AsError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "ACCESS_DENIED", e.Code)
	assert.Equal(t, "mfa-required", e.Details["reason"])
	got, err := as(mfaKey).TunnelsIssueSshCertificate(ctx, forNode)
	require.NoError(t, err)
	assert.Equal(t, []string{"root@" + node}, got.Data.Principals)
	assert.Equal(t, node, got.Data.HostName)
	c, _, _, _, err := ssh.ParseAuthorizedKey([]byte(got.Data.Certificate))
	require.NoError(t, err)
	cert := c.(*ssh.Certificate)
	assert.Equal(t, spub.Marshal(), cert.Key.Marshal())
	assert.WithinDuration(t, time.Now().Add(sshca.UserLifetime), time.Unix(int64(cert.ValidBefore), 0), 30*time.Second)
	// Only sshAccounts (default root) on nodes; only the root tenant.
	_, err = as(mfaKey).TunnelsIssueSshCertificate(ctx, &client.TunnelsIssueSshCertificateInput{TenantId: config.DefaultRootTenantID,
		NodeId: client.NewOptString(node), PublicKey: pubLine, Account: client.NewOptString("ops")})
	e, ok = computeclient.AsError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	_, err = f.C.TunnelsIssueSshCertificate(ctx, &client.TunnelsIssueSshCertificateInput{TenantId: fleettest.Tenant,
		NodeId: client.NewOptString(node), PublicKey: pubLine})
	e, ok = computeclient.AsError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "INVALID_INPUT", e.Code, "a node's certificate is the root tenant's")

	// Twenty certificates an hour per identity: a member's twentieth
	// passes, the twenty-first is RATE_LIMITED with a hint.
	member := as(f.CreateKey(fleettest.Tenant, "dev", "member"))
	forSandbox := &client.TunnelsIssueSshCertificateInput{TenantId: fleettest.Tenant, PublicKey: pubLine,
		Target: client.NewOptTunnelTarget(client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id})}
	for i := 0; i < 20; i++ {
		_, err := member.TunnelsIssueSshCertificate(ctx, forSandbox)
		require.NoError(t, err, "certificate %d", i+1)
	}
	_, err = member.TunnelsIssueSshCertificate(ctx, forSandbox)
	e, ok = computeclient.AsError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "RATE_LIMITED", e.Code)
	require.NotNil(t, e.RetryAfterMs)
	assert.Greater(t, *e.RetryAfterMs, int64(0))
	assert.LessOrEqual(t, *e.RetryAfterMs, int64(time.Hour/time.Millisecond))
	_, err = f.C.TunnelsIssueSshCertificate(ctx, forSandbox)
	require.NoError(t, err, "another identity has its own hour")
}
