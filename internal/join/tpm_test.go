package join_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agent"
	"computeplane/internal/pki"
	"computeplane/internal/testenv"
)

// startSWTPM runs a software TPM (swtpm) on the state in dir and returns
// its command socket as compute-agent's --tpm takes it. The state (and so
// the endorsement key) lives in dir: another dir is another TPM.
func startSWTPM(t *testing.T, dir string) string {
	t.Helper()
	bin, err := exec.LookPath("swtpm")
	require.NoError(t, err, "swtpm is needed (apt-get install swtpm swtpm-tools; .ci/run installs it)")
	sock := filepath.Join(dir, "tpm.sock")
	cmd := exec.Command(bin, "socket", "--tpm2", "--tpmstate", "dir="+dir,
		"--server", "type=unixio,path="+sock, "--ctrl", "type=unixio,path="+filepath.Join(dir, "ctrl.sock"),
		"--flags", "not-need-init,startup-clear")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 30*time.Second, 20*time.Millisecond)
	return "unix:" + sock
}

// Issue 27: a node with an enrolled TPM joins through the TPM attestor
// (over HTTP, against a control plane configured with attestors: [tpm]);
// a node whose TPM is another one (another state: the swapped TPM), or
// that brings no TPM, is refused and leaves no node behind, and its token
// stays unused.
func TestTPMAttestorJoinsOnlyTheEnrolledTPM(t *testing.T) {
	t.Parallel()
	enrolled := startSWTPM(t, t.TempDir())
	swapped := startSWTPM(t, t.TempDir())
	ek, err := agent.TPMEndorsementKey(enrolled)
	require.NoError(t, err)
	otherEK, err := agent.TPMEndorsementKey(swapped)
	require.NoError(t, err)
	require.NotEqual(t, ek, otherEK, "two TPM states, two endorsement keys")

	path := filepath.Join(t.TempDir(), "pki.json")
	_, _, err = pki.Init(path, testenv.TestSecret, "example.org")
	require.NoError(t, err)
	cfg := testenv.ConfigFile(t, fmt.Sprintf("attestors: [tpm]\ntpm:\n  endorsementKeys: [%s]\n", ek))
	env := testenv.Start(t, testenv.WithEnv("SERVICE_PKI", path), testenv.WithEnv("SERVICE_CONFIG", cfg))
	c := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner")))
	site, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "p", Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	mint := func() string {
		res, err := c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: pool.Data.PoolId, TtlSeconds: client.NewOptInt64(600)})
		require.NoError(t, err)
		return res.Data.Token
	}
	count := func(table string) (n int) {
		require.NoError(t, env.Store.Pool().QueryRow(t.Context(), "select count(*) from "+table).Scan(&n))
		return n
	}
	joinWith := func(token, tpm string) (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*agent.JoinTimeout)
		defer cancel()
		return agent.Join(ctx, agent.JoinOptions{APIURL: env.URL, Token: token, Dir: agent.Dir(filepath.Join(t.TempDir(), "agent")), Hostname: "tpm-host", TPM: tpm})
	}
	refusedWith := func(err error, msg string) {
		t.Helper()
		var refused *agent.RefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, "UNAUTHENTICATED", refused.Code)
		assert.Contains(t, refused.Message, msg)
	}

	// The swapped TPM: its endorsement key is not the enrolled one.
	token := mint()
	_, err = joinWith(token, swapped)
	refusedWith(err, "endorsement key "+otherEK+" is not enrolled")
	// No TPM at all.
	_, err = joinWith(token, "")
	refusedWith(err, "carries no TPM quote")
	assert.Zero(t, count("nodes"), "a refused attestation leaves no node")
	assert.Zero(t, count("node_attestations"))
	var used int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), "select count(*) from join_tokens where used_at is not null").Scan(&used))
	assert.Zero(t, used, "nor a used token")

	// The enrolled TPM joins with the same token; the node's key is the
	// one its quote bound.
	node, err := joinWith(token, enrolled)
	require.NoError(t, err)
	var poolID, attestor, attestedEK string
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), `select n.pool_id, a.attestor, a.endorsement_key_sha256
		from nodes n join node_attestations a using (node_id) where n.node_id = $1`, node).Scan(&poolID, &attestor, &attestedEK))
	assert.Equal(t, pool.Data.PoolId, poolID)
	assert.Equal(t, "tpm", attestor)
	assert.Equal(t, ek, attestedEK)
	assert.Equal(t, 1, count("nodes"))
	assert.Len(t, env.LogLines("join refused"), 2)
}
