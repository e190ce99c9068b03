package join_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-attestation/attest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/gen/db"
	"computeplane/internal/agent"
	"computeplane/internal/agentproto"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/join"
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

// A quote is good for one join only: the challenge names the token and
// the node key it was made for, and the quote must verify over the nonce
// the activated secret makes.
func TestTPMQuoteIsBoundToItsTokenAndNodeKey(t *testing.T) {
	t.Parallel()
	sock := startSWTPM(t, t.TempDir())
	ek, err := agent.TPMEndorsementKey(sock)
	require.NoError(t, err)
	w := setup(t)
	tpm := join.NewTPMAttestor([]string{ek})
	srv := httptest.NewServer(&join.Handler{Store: w.st, Bundle: func() (*pki.Bundle, error) { return w.bundle, nil },
		Projection: embedded.New(w.st, "root", "compute-", time.Now).Projection(), TypePrefix: "compute-",
		Gateways: func(context.Context, *db.Queries, string) ([]agentproto.Gateway, error) { return nil, nil },
		Log:      slog.New(slog.DiscardHandler), Now: time.Now, TPM: tpm})
	t.Cleanup(srv.Close)

	csrOf := func(key *ecdsa.PrivateKey) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "host-1"}}, key)
		require.NoError(t, err)
		return der
	}
	post := func(path string, v, out any) (int, string) {
		body, _ := json.Marshal(v)
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK && out != nil {
			require.NoError(t, json.Unmarshal(raw, out))
		}
		return resp.StatusCode, string(raw)
	}
	// The TPM's side, by hand: EK, AK, challenge, activation, quote.
	dev, err := agent.OpenTPM(sock)
	require.NoError(t, err)
	defer dev.Close()
	eks, err := dev.EKs()
	require.NoError(t, err)
	ekDER, err := x509.MarshalPKIXPublicKey(eks[0].Public)
	require.NoError(t, err)
	ak, err := dev.NewAK(nil)
	require.NoError(t, err)
	defer ak.Close(dev)
	p := ak.AttestationParameters()
	key1, key2 := newKey(t), newKey(t)
	token, other := w.mint(t, 0), w.mint(t, 0)
	var ch agentproto.TPMChallenge
	code, body := post(agentproto.JoinTPMChallengePath, agentproto.TPMChallengeRequest{Token: token, CSR: csrOf(key1), EndorsementKey: ekDER,
		AttestationKey: agentproto.TPMAttestationKey{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}}, &ch)
	require.Equal(t, http.StatusOK, code, body)
	secret, err := ak.ActivateCredential(dev, attest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret})
	require.NoError(t, err)
	pub1, err := x509.MarshalPKIXPublicKey(&key1.PublicKey)
	require.NoError(t, err)
	quoteFor := func(nonce []byte) *agentproto.TPMQuote {
		q, err := ak.Quote(dev, nonce, attest.HashSHA256)
		require.NoError(t, err)
		pcrs, err := dev.PCRs(attest.HashSHA256)
		require.NoError(t, err)
		out := &agentproto.TPMQuote{Challenge: ch.Challenge, AttestationKey: p.Public, Quote: q.Quote, Signature: q.Signature}
		for i := range pcrs {
			for _, pcr := range pcrs {
				if pcr.Index == i {
					out.PCRs = append(out.PCRs, pcr.Digest)
				}
			}
		}
		return out
	}
	good := quoteFor(join.QuoteNonce(secret, join.EndorsementKeyHash(pub1)))
	refused := func(req agentproto.JoinRequest, msg string) {
		t.Helper()
		code, body := post(agentproto.JoinPath, req, nil)
		assert.Equal(t, http.StatusUnauthorized, code, body)
		assert.Contains(t, body, msg)
	}
	refused(agentproto.JoinRequest{Token: token, CSR: csrOf(key2), TPM: good}, "made for another node key")
	refused(agentproto.JoinRequest{Token: other, CSR: csrOf(key1), TPM: good}, "made for another join token")
	refused(agentproto.JoinRequest{Token: token, CSR: csrOf(key1), TPM: quoteFor(join.QuoteNonce([]byte("guessed"), join.EndorsementKeyHash(pub1)))}, "the quote")
	tampered := *good
	tampered.Challenge = append([]byte(nil), good.Challenge...)
	tampered.Challenge[len(tampered.Challenge)-1] ^= 1
	refused(agentproto.JoinRequest{Token: token, CSR: csrOf(key1), TPM: &tampered}, "not a challenge of this deployment")
	var nodes int
	require.NoError(t, w.st.Pool().QueryRow(t.Context(), `select count(*) from nodes`).Scan(&nodes))
	assert.Zero(t, nodes)

	var jr agentproto.JoinResponse
	code, body = post(agentproto.JoinPath, agentproto.JoinRequest{Token: token, CSR: csrOf(key1), TPM: good}, &jr)
	require.Equal(t, http.StatusOK, code, body)
	assert.NotEmpty(t, jr.NodeID)
}
