package provideraccounts_test

// A real bootstrap: computed with every role as a process, the localqemu
// provider, and the compute-agent binary: an offer claimed (a qemu VM
// booted), the daemon delivered with a join token bound to the machine,
// the node ready in the pool; the token replayed is refused.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/builtin"
	"computeplane/internal/fleettest"
	"computeplane/internal/images"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/provideraccounts"
	"computeplane/internal/providers"
	"computeplane/internal/providers/localqemu"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

// localFleet starts computed (every role) with the deployment's image
// source and a provider directory for localqemu, whose machines end with
// the test; extra is more of the config.
func localFleet(t *testing.T, extra string) (*fleettest.Fleet, *images.Image, string) {
	im, imagesDir, provDir := localProvider(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\nproviderDir: %q\n", imagesDir, provDir)+extra)
	return f, im, provDir
}

// localProvider finds the guest image and its image source's directory,
// and makes a provider directory whose machines end with the test.
func localProvider(t *testing.T) (im *images.Image, imagesDir, provDir string) {
	im = qemutest.Image(t)
	imagesDir = filepath.Dir(filepath.Dir(im.Location)) // .service/images
	if _, err := os.Stat(filepath.Join(imagesDir, "minimal.json")); err != nil {
		imagesDir = filepath.Dir(im.Location)
	}
	provDir, err := os.MkdirTemp("", "pv") // short: the VMs' unix sockets live under it
	require.NoError(t, err)
	t.Cleanup(func() {
		localqemu.KillAll(filepath.Join(provDir, localqemu.Name))
		_ = os.RemoveAll(provDir)
	})
	return im, imagesDir, provDir
}

func TestRealBootstrap(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and runs computed and compute-agent")
	}
	agentBin := proctest.Build(t, "computeplane/cmd/compute-agent")
	// The machine's side of the delivery, watched: a wrapper keeps a copy
	// of the join token the daemon was given, so that the test can replay
	// it. Nothing of the service keeps it.
	work := t.TempDir()
	captured := filepath.Join(work, "captured-token")
	wrapper := filepath.Join(work, "agent-wrapper")
	require.NoError(t, os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = join ]; then printf %%s \"$COMPUTE_AGENT_TOKEN\" > %q; fi\nexec %q \"$@\"\n",
		captured, agentBin)), 0o700))
	f, im, provDir := localFleet(t, fmt.Sprintf("bootstrap: {agent: %q}\n", wrapper))
	ctx := t.Context()
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	acct, err := f.C.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: fleettest.Tenant, Provider: localqemu.Name, Name: "lab",
		Config: raw(map[string]any{"image": im.ID, "accel": "tcg", "machineTypes": []any{map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256}}})})
	require.NoError(t, err)
	account := acct.Data.AccountId
	offers, err := f.C.ProviderAccountsOffers(ctx, &client.ProviderAccountsOffersInput{TenantId: fleettest.Tenant, AccountId: account})
	require.NoError(t, err)
	require.Equal(t, []string{"small"}, offerIDs(t, offers))

	in := &client.ProviderAccountsBootstrapInput{TenantId: fleettest.Tenant, AccountId: account, PoolId: pool, IdempotencyKey: "first",
		OfferId: client.NewOptString("small")}
	start := time.Now()
	res, err := f.C.ProviderAccountsBootstrap(ctx, in)
	require.NoError(t, err)
	require.Equal(t, "claiming", res.Data.State)
	id := res.Data.BootstrapId
	states := map[string]time.Duration{}
	var b client.Bootstrap
	require.Eventually(t, func() bool {
		res, err := f.C.ProviderAccountsBootstrap(ctx, in) // a repeat returns the current status
		require.NoError(t, err)
		b = res.Data
		if _, ok := states[b.State]; !ok {
			states[b.State] = time.Since(start)
		}
		require.NotEqual(t, "failed", b.State, "bootstrap failed: %s\n%s", b.Error.Value, proctest.Tail(f.Computed.Stderr.String(), 40))
		return b.State == "joined"
	}, 4*time.Minute, 100*time.Millisecond)
	assert.Equal(t, id, b.BootstrapId)
	machine := b.MachineId.Value
	node := b.NodeId.Value
	require.True(t, strings.HasPrefix(machine, "lq_"), machine)

	// The machine booted: its qemu runs and its guest came up.
	mdir := filepath.Join(provDir, localqemu.Name, machine)
	pidb, err := os.ReadFile(filepath.Join(mdir, "vm", "qemu.pid"))
	require.NoError(t, err)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidb)))
	require.NoError(t, syscall.Kill(pid, 0), "the VM runs")
	consoleLog, err := os.ReadFile(filepath.Join(mdir, "vm", "console.log"))
	require.NoError(t, err)
	assert.Contains(t, string(consoleLog), "compute-guest: READY", "the guest booted")
	t.Logf("console: %s", proctest.Tail(string(consoleLog), 5))
	// The node is ready in the pool, named for the machine.
	var state, nodePool, hostname string
	require.NoError(t, f.DB.QueryRow(ctx, `select state, pool_id, hostname from nodes where node_id = $1`, node).Scan(&state, &nodePool, &hostname))
	assert.Equal(t, "ready", state)
	assert.Equal(t, pool, nodePool)
	assert.Equal(t, machine, hostname)
	for _, e := range []string{"provider.bootstrap.started", "provider.bootstrap.installed", "provider.bootstrap.joined"} {
		assert.Equal(t, 1, f.Events(e, account), e)
	}
	assert.Zero(t, f.Events("provider.bootstrap.failed", account))

	// The token was never returned or stored: not in the answer, not in
	// any row the bootstrap or the join wrote.
	token, err := os.ReadFile(captured)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(token), "cjt_"))
	answer, _ := json.Marshal(b)
	assert.NotContains(t, string(answer), string(token))
	var hits int
	require.NoError(t, f.DB.QueryRow(ctx, `select count(*) from provider_bootstraps p where row_to_json(p)::text like '%' || $1 || '%'`, string(token)).Scan(&hits))
	require.NoError(t, f.DB.QueryRow(ctx, `select $2::int + count(*) from join_tokens j where row_to_json(j)::text like '%' || $1 || '%'`, string(token), hits).Scan(&hits))
	require.NoError(t, f.DB.QueryRow(ctx, `select $2::int + count(*) from outbox o where row_to_json(o)::text like '%' || $1 || '%'`, string(token), hits).Scan(&hits))
	assert.Zero(t, hits)

	// Replayed, the token is refused: by another key for the same
	// machine (it was used), and for another machine (it is bound).
	replay := func(hostname string) string {
		dir := t.TempDir()
		tf := filepath.Join(dir, "token")
		require.NoError(t, os.WriteFile(tf, token, 0o600))
		cmd := exec.CommandContext(ctx, agentBin, "join", "--api", f.PublicURL, "--token-file", tf, "--dir", filepath.Join(dir, "agent"), "--hostname", hostname)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "a replayed token joined: %s", out)
		return string(out)
	}
	assert.Contains(t, replay(machine), "refused")
	assert.Contains(t, replay("another-machine"), "refused")
	var nodes int
	require.NoError(t, f.DB.QueryRow(ctx, `select count(*) from nodes where pool_id = $1`, pool).Scan(&nodes))
	assert.Equal(t, 1, nodes, "no replay made a node")
	firstID := id

	// identifying: a machine the account already has (claimed outside any
	// bootstrap, as an operator would have one) becomes a second node.
	lq, err := localqemu.New(providers.Env{Dir: filepath.Join(provDir, localqemu.Name), AccountID: account,
		Images: func(context.Context, string) (string, string, string, error) {
			return im.Location, im.Initrd, im.Cmdline, nil
		}},
		json.RawMessage(raw(map[string]any{"image": im.ID, "accel": "tcg", "machineTypes": []any{map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256}}})))
	require.NoError(t, err)
	own, err := lq.Claim(ctx, "small", "by-hand")
	require.NoError(t, err)
	in2 := &client.ProviderAccountsBootstrapInput{TenantId: fleettest.Tenant, AccountId: account, PoolId: pool, IdempotencyKey: "second",
		MachineId: client.NewOptString(own.ID)}
	res, err = f.C.ProviderAccountsBootstrap(ctx, in2)
	require.NoError(t, err)
	require.Equal(t, "identifying", res.Data.State)
	require.Eventually(t, func() bool {
		res, err := f.C.ProviderAccountsBootstrap(ctx, in2)
		require.NoError(t, err)
		b = res.Data
		require.NotEqual(t, "failed", b.State, "bootstrap failed: %s", b.Error.Value)
		return b.State == "joined"
	}, 2*time.Minute, 100*time.Millisecond)
	require.NoError(t, f.DB.QueryRow(ctx, `select state, hostname from nodes where node_id = $1`, b.NodeId.Value).Scan(&state, &hostname))
	assert.Equal(t, "ready", state)
	assert.Equal(t, own.ID, hostname)
	assert.Equal(t, 2, f.Events("provider.bootstrap.joined", account))

	// Per-phase timings (docs/benchmarks.md).
	for _, run := range []struct{ name, id, first string }{{"offer claimed", firstID, "claiming (VM booted, guest ready)"},
		{"machine identified", b.BootstrapId, "identifying"}} {
		var created, machineAt, installedAt, finishedAt time.Time
		require.NoError(t, f.DB.QueryRow(ctx, `select created_at, machine_at, installed_at, finished_at from provider_bootstraps where bootstrap_id = $1`, run.id).
			Scan(&created, &machineAt, &installedAt, &finishedAt))
		t.Logf("bootstrap (%s): %s %s; installing (token minted, compute-agent joined and started) %s; joining (session, node ready, seen by the reconciler) %s; total %s",
			run.name, run.first, machineAt.Sub(created).Round(time.Millisecond), installedAt.Sub(machineAt).Round(time.Millisecond),
			finishedAt.Sub(installedAt).Round(time.Millisecond), finishedAt.Sub(created).Round(time.Millisecond))
	}
	t.Logf("first bootstrap: states seen by repeats at %v", states)
}

// A bootstrap whose install keeps failing (the delivered agent is
// /bin/false) fails after its attempts: its unused tokens are revoked and
// the machine it claimed is released (the VM ends, its directory goes).
func TestFailedBootstrapReleasesItsMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	im, imagesDir, provDir := localProvider(t)
	pkiFile := filepath.Join(t.TempDir(), "pki.json")
	_, _, err := pki.Init(pkiFile, testenv.TestSecret, "test.local")
	require.NoError(t, err)
	w := setup(t, fmt.Sprintf("images: {dir: %q}\nproviderDir: %q\nbootstrap: {agent: /bin/false}\n", imagesDir, provDir), testenv.WithEnv("SERVICE_PKI", pkiFile))
	ctx := t.Context()
	a := w.account(t, w.owner, localqemu.Name, "lab", map[string]any{"image": im.ID, "machineTypes": []any{map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256}}})
	in := &client.ProviderAccountsBootstrapInput{TenantId: "acme", AccountId: a.AccountId, PoolId: w.pool(t, "p", nil), IdempotencyKey: "k",
		OfferId: client.NewOptString("small")}
	res, err := w.owner.ProviderAccountsBootstrap(ctx, in)
	require.NoError(t, err)
	svc, err := provideraccounts.New(w.env.Config, w.env.Store, append(builtin.All().Providers, fakeFactory), images.FromConfig(w.env.Config.Images), pki.Loader(w.env.Config.PKIFile, w.env.Config.Secret), nil)
	require.NoError(t, err)
	job := svc.Job(w.env.Store, nil, slog.New(slog.DiscardHandler))
	var machine string
	for attempt := 1; attempt <= provideraccounts.MaxAttempts; attempt++ {
		_, err = w.env.Store.Pool().Exec(ctx, `update provider_bootstraps set next_attempt_at = now() where bootstrap_id = $1`, res.Data.BootstrapId)
		require.NoError(t, err)
		require.NoError(t, job.Pass(ctx, noFence))
		cur, err := w.owner.ProviderAccountsBootstrap(ctx, in)
		require.NoError(t, err)
		require.False(t, cur.Data.MachineId.Null, "claimed at the first pass")
		machine = cur.Data.MachineId.Value
		assert.Contains(t, cur.Data.Error.Value, "compute-agent join", "attempt %d", attempt)
		if attempt == 1 {
			assert.True(t, vmRuns(t, filepath.Join(provDir, localqemu.Name, machine)), "the claimed VM runs")
		}
		if attempt < provideraccounts.MaxAttempts {
			assert.Equal(t, "installing", cur.Data.State)
		} else {
			assert.Equal(t, "failed", cur.Data.State)
		}
	}
	_, err = os.Stat(filepath.Join(provDir, localqemu.Name, machine))
	assert.ErrorIs(t, err, os.ErrNotExist, "the claimed machine was released")
	var minted, live int
	require.NoError(t, w.env.Store.Pool().QueryRow(ctx, `select count(*), count(*) filter (where not revoked) from join_tokens where pool_id = $1`, in.PoolId).
		Scan(&minted, &live))
	assert.Equal(t, provideraccounts.MaxAttempts, minted, "a token per install attempt")
	assert.Zero(t, live, "every unused token revoked")
	assert.Equal(t, 1, w.events(t, "provider.bootstrap.failed", a.AccountId))
}

func vmRuns(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "vm", "qemu.pid"))
	if err != nil {
		return false
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid > 0 && syscall.Kill(pid, 0) == nil
}
