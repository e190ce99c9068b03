package supportbundles_test

// Support bundles through the API against real processes: computed with
// every role, a compute-agent running a real VM (qemu, TCG), and a real
// S3 server (versitygw). Secrets are planted in the agent's environment,
// state, log and a VM's console; the downloaded bundle holds none.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	gencli "computeplane/gen/cli"
	"computeplane/gen/client"
	"computeplane/internal/blob/blobtest"
	"computeplane/internal/cli"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

func TestMain(m *testing.M) { qemutest.Main(m) }

// Planted secrets: none may appear in a bundle.
const (
	envToken      = "jt-planted-env-5f1c2a9d"     // COMPUTE_AGENT_TOKEN (a join token)
	envPassword   = "pw-planted-env-77aa01"       // DB_PASSWORD
	stateKey      = "ak-planted-state-9c9c9c"     // an apiKey in state.json
	logBearer     = "bearer-planted-log-31337"    // Authorization: Bearer in the log
	logURLPass    = "urlpass-planted-log-4242"    // postgres://u:<here>@...
	consoleSecret = "console-planted-password-88" // password= on a VM's console
	consoleToken  = "jt-planted-env-5f1c2a9d"     // the join token echoed bare on the console
)

func TestSupportBundles(t *testing.T) {
	srv := blobtest.Start(t)
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\nsupportBundles: {blob: %q}\n", filepath.Dir(filepath.Dir(im.Location)), srv.URL("bundles")),
		fleettest.Env(srv.Env()),
		fleettest.AgentEnv(map[string]string{"COMPUTE_AGENT_TOKEN": envToken, "DB_PASSWORD": envPassword}))
	ctx := t.Context()
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")

	// Secrets in the agent's state (its configuration on disk) and log.
	agent.Stop()
	state, err := os.ReadFile(filepath.Join(agent.Dir, "state.json"))
	require.NoError(t, err)
	state = bytes.Replace(state, []byte("{"), []byte(`{"apiKey": "`+stateKey+`",`), 1)
	require.NoError(t, os.WriteFile(filepath.Join(agent.Dir, "state.json"), state, 0o600))
	lf, err := os.OpenFile(filepath.Join(agent.Dir, "logs", "agent.log"), os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	fmt.Fprintf(lf, "level=WARN msg=\"calling out\" header=\"Authorization: Bearer %s\"\nlevel=INFO msg=\"dial postgres://svc:%s@db:5432/x\"\nlevel=INFO msg=planted-marker-line\n",
		logBearer, logURLPass)
	require.NoError(t, lf.Close())
	agent.Run()
	require.Eventually(t, func() bool { return f.NodeState(agent.Node) == "ready" }, 30*time.Second, 50*time.Millisecond)

	// A VM whose console prints secrets.
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool,
		Flavor: "small", ImageId: "computeplane/minimal", Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone)})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: sbx.Data.SandboxId})
		return err == nil && string(s.Data.State) == "running"
	}, 120*time.Second, 200*time.Millisecond)
	ex, err := f.C.SandboxesExec(ctx, &client.SandboxesExecInput{TenantId: fleettest.Tenant, SandboxId: sbx.Data.SandboxId,
		Argv: []string{"sh", "-c", fmt.Sprintf("echo console-marker-line password=%s > /dev/console; echo %s > /dev/console", consoleSecret, consoleToken)}})
	require.NoError(t, err)
	require.Equal(t, int64(0), ex.Data.ExitCode)
	consoles, _ := filepath.Glob(filepath.Join(agent.Dir, "runtime", "vms", "*", "console.log"))
	require.NotEmpty(t, consoles)
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(consoles[0])
		return bytes.Contains(b, []byte(consoleSecret))
	}, 10*time.Second, 50*time.Millisecond, "the secret is on the VM's console")

	// The bundle, waited for.
	b, err := f.C.SupportBundlesCreate(ctx, &client.SupportBundlesCreateInput{TenantId: fleettest.Tenant, NodeId: agent.Node, IdempotencyKey: "b1",
		Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	require.Equal(t, "ready", string(b.Data.State), "error: %v", b.Data.Error)
	assert.Equal(t, int64(256<<20), b.Data.MaxBytes, "the default")
	size, ok := b.Data.SizeBytes.Get()
	require.True(t, ok)
	red, _ := b.Data.Redactions.Get()
	assert.Positive(t, red)
	assert.True(t, b.Data.DownloadUrl.Null, "create gives no URL")

	// get: a presigned GET of exactly that archive.
	g, err := f.C.SupportBundlesGet(ctx, &client.SupportBundlesGetInput{TenantId: fleettest.Tenant, BundleId: b.Data.BundleId})
	require.NoError(t, err)
	url, ok := g.Data.DownloadUrl.Get()
	require.True(t, ok)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	require.NoError(t, err)
	archive, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, size, int64(len(archive)))
	files := untar(t, archive)
	all := strings.Join(values(files), "\n")
	for _, secret := range []string{envToken, envPassword, stateKey, logBearer, logURLPass, consoleSecret, consoleToken,
		srv.SecretKey, testenv.TestSecret, f.Key, "PRIVATE KEY"} {
		assert.NotContains(t, all, secret)
	}
	id := b.Data.BundleId
	for _, name := range []string{"manifest.json", "agent/state.json", "agent/logs/agent.log", "agent/environment.txt", "agent/certificate.json",
		"system/uname.json", "system/meminfo", "system/interfaces.json"} {
		assert.Contains(t, files, id+"/"+name)
	}
	assert.Contains(t, files[id+"/agent/logs/agent.log"], "planted-marker-line", "the log is there, scrubbed")
	assert.Contains(t, files[id+"/agent/environment.txt"], "DB_PASSWORD=[REDACTED]")
	var console, qemuLog bool
	for name, body := range files {
		console = console || (strings.HasSuffix(name, "/console.log") && strings.Contains(body, "console-marker-line"))
		qemuLog = qemuLog || strings.HasSuffix(name, "/qemu.log")
	}
	assert.True(t, console, "the VM's console tail is there")
	assert.True(t, qemuLog, "the VM's qemu log is there")

	// computectl downloads it too.
	env := map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: f.Key, cli.EnvTenant: fleettest.Tenant}
	local := filepath.Join(t.TempDir(), "bundle.tar.gz")
	var out, errOut strings.Builder
	code := cli.Run(context.Background(), gencli.Groups, []string{"supportBundles", "get", "--bundle-id", id, "--to", local},
		func(k string) string { return env[k] }, cli.Streams{Stdout: &out, Stderr: &errOut})
	require.Equal(t, 0, code, errOut.String())
	got, err := os.ReadFile(local)
	require.NoError(t, err)
	assert.Equal(t, archive, got)

	// list, delete: the archive leaves the store.
	l, err := f.C.SupportBundlesList(ctx, &client.SupportBundlesListInput{TenantId: fleettest.Tenant})
	require.NoError(t, err)
	require.Len(t, l.Data.Items, 1)
	assert.Equal(t, id, l.Data.Items[0].BundleId)
	objs, err := srv.Store(t, "bundles").List(ctx, "")
	require.NoError(t, err)
	require.Len(t, objs, 1)
	assert.Equal(t, size, objs[0].Size)
	d, err := f.C.SupportBundlesDelete(ctx, &client.SupportBundlesDeleteInput{TenantId: fleettest.Tenant, BundleId: id})
	require.NoError(t, err)
	assert.Equal(t, "deleted", string(d.Data.State))
	objs, err = srv.Store(t, "bundles").List(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, objs)
	d, err = f.C.SupportBundlesDelete(ctx, &client.SupportBundlesDeleteInput{TenantId: fleettest.Tenant, BundleId: id})
	require.NoError(t, err, "deleting twice")
	assert.Equal(t, "deleted", string(d.Data.State))
	g, err = f.C.SupportBundlesGet(ctx, &client.SupportBundlesGetInput{TenantId: fleettest.Tenant, BundleId: id})
	require.NoError(t, err)
	assert.True(t, g.Data.DownloadUrl.Null, "no URL for a deleted bundle")
	code = cli.Run(context.Background(), gencli.Groups, []string{"supportBundles", "get", "--bundle-id", id, "--to", local},
		func(k string) string { return env[k] }, cli.Streams{Stdout: &out, Stderr: &errOut})
	assert.Equal(t, cli.ExitState, code)
	l, err = f.C.SupportBundlesList(ctx, &client.SupportBundlesListInput{TenantId: fleettest.Tenant})
	require.NoError(t, err)
	assert.Empty(t, l.Data.Items)
	l, err = f.C.SupportBundlesList(ctx, &client.SupportBundlesListInput{TenantId: fleettest.Tenant, IncludeDeleted: client.NewOptBool(true)})
	require.NoError(t, err)
	assert.Len(t, l.Data.Items, 1)

	_, err = f.C.SandboxesDelete(ctx, &client.SandboxesDeleteInput{TenantId: fleettest.Tenant, SandboxId: sbx.Data.SandboxId})
	require.NoError(t, err)
}

// TestSupportBundleAboveMaxBytes: a bundle larger than maxBytes is refused
// and nothing reaches the store.
func TestSupportBundleAboveMaxBytes(t *testing.T) {
	srv := blobtest.Start(t)
	f := fleettest.Start(t, fmt.Sprintf("supportBundles: {blob: %q, maxBytes: 2048}\n", srv.URL("small")), fleettest.Env(srv.Env()))
	ctx := t.Context()
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "4", "--memory-mib", "4096")
	b, err := f.C.SupportBundlesCreate(ctx, &client.SupportBundlesCreateInput{TenantId: fleettest.Tenant, NodeId: agent.Node, IdempotencyKey: "b1",
		Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	require.Equal(t, "failed", string(b.Data.State))
	msg, _ := b.Data.Error.Get()
	assert.Contains(t, msg, "above maxBytes 2048")
	assert.Equal(t, int64(2048), b.Data.MaxBytes)
	objs, err := srv.Store(t, "small").List(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, objs)
	left, _ := os.ReadDir(filepath.Join(agent.Dir, "bundles"))
	assert.Empty(t, left, "the daemon keeps nothing of it")

	// A declared node has no daemon; an unknown one is NOT_FOUND.
	_, err = f.C.SupportBundlesCreate(ctx, &client.SupportBundlesCreateInput{TenantId: fleettest.Tenant, NodeId: "node_00000000000000000000000000",
		IdempotencyKey: "b2"})
	assert.Equal(t, "NOT_FOUND", string(testenv.APIError(t, err).Code))
}

func untar(t *testing.T, archive []byte) map[string]string {
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = string(b)
	}
}

func values(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
