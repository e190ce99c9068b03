package iam_test

// Matrix rows of the tunnels group (the matrix's env configures tunnels).

import (
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/ids"
	"computeplane/internal/pki"
	"computeplane/internal/testenv"
)

// tunnelRow is an issued ticket of tenant, kept while calls are refused
// (no row written by a refused call) and made again once a close used it.
func (fx *fixture) tunnelRow(t *testing.T, tenant string) string {
	t.Helper()
	return fx.keep("tunnel", tenant, func() string { return fx.newTunnelRow(t, tenant) })
}

// newTunnelRow writes an issued ticket of tenant to a fresh id.
func (fx *fixture) newTunnelRow(t *testing.T, tenant string) string {
	t.Helper()
	id, sbx, vm := ids.New("tun"), ids.New("sbx"), ids.New("inst")
	_, err := fx.env.Store.Pool().Exec(t.Context(), `insert into tunnels (tunnel_id, tenant_id, identity_id, target_kind, target_id, instance_id,
		node_id, kind, argv, ticket_hash, source_ip, expires_at) values ($1, $2, 'fixture', 'sandbox', $5, $6, 'node_x', 'exec', '["true"]',
		$3, '127.0.0.1', $4)`, id, tenant, []byte(id), time.Now().Add(time.Minute), sbx, vm)
	require.NoError(t, err)
	return id
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["sandbox/tunnel/"+tenant] = fx.sandbox(t, tenant, "running", "tunnel")
		objs["tunnel/"+tenant] = fx.tunnelRow(t, tenant)
	})
	operators := []string{owner, admin}
	matrix[api.MethodTunnelsOpen] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.TunnelsOpen(t.Context(), &client.TunnelsOpenInput{TenantId: tenant, Kind: client.TunnelsOpenInputKindExec,
				Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: fx.sandbox(t, tenant, "running", "tunnel")}, Argv: []string{"sh"}})
		},
		tenantRoles: []string{owner, admin, member}, // decided on the tenant, like a create
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.TunnelsOpenResult).Data
			assert.Equal(t, tenant, d.Tunnel.TenantId)
			assert.Equal(t, "issued", string(d.Tunnel.State))
			assert.NotEmpty(t, d.Ticket)
		},
	}}
	matrix[api.MethodTunnelsOpenNode] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.TunnelsOpenNode(t.Context(), &client.TunnelsOpenNodeInput{TenantId: tenant, NodeId: fx.node(t, tenant),
				Kind: client.TunnelsOpenNodeInputKindNodeConsole})
		},
		rootInput: true, // break-glass: the root tenant's, decided on the fleet
		rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.TunnelsOpenNodeResult).Data
			assert.Equal(t, tenant, d.Tunnel.TenantId)
			assert.Equal(t, client.TunnelEndKindNode, d.Tunnel.Target.Kind)
			assert.Equal(t, client.TunnelKindNodeConsole, d.Tunnel.Kind)
		},
	}}
	matrix[api.MethodTunnelsIssueSshCertificate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.TunnelsIssueSshCertificate(t.Context(), &client.TunnelsIssueSshCertificateInput{TenantId: tenant, PublicKey: userKey(t),
				Target: client.NewOptTunnelTarget(client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: fx.sandbox(t, tenant, "running", "tunnel")})})
		},
		tenantRoles: []string{owner, admin, member}, // decided on the tenant, like an open
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.TunnelsIssueSshCertificateResult).Data
			assert.Contains(t, d.Principals, "root@"+tenant)
		},
	}}
	matrix[api.MethodTunnelsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.TunnelsList(t.Context(), &client.TunnelsListInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member, viewer},
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, it := range res.(*client.TunnelsListResult).Data.Items {
				assert.Equal(t, tenant, it.TenantId)
			}
		},
	}}
	matrix[api.MethodTunnelsClose] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			id := fx.tunnelRow(t, tenant)
			res, err := c.TunnelsClose(t.Context(), &client.TunnelsCloseInput{TenantId: tenant, TunnelId: id})
			if err == nil {
				fx.used("tunnel", tenant, id)
			}
			return res, err
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, "closed", string(res.(*client.TunnelsCloseResult).Data.State))
		},
	}}
}

// userKey is a fresh ed25519 public key in authorized_keys form.
func userKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	k, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return string(ssh.MarshalAuthorizedKey(k))
}

// withTunnels configures tunnels with SSH (the group exists only with an
// issuer; certificates need the PKI bundle's SSH CA).
func withTunnels(t *testing.T, more ...string) testenv.Option {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pki.json")
	_, _, err := pki.Init(path, testenv.TestSecret, "")
	require.NoError(t, err)
	return testenv.All(testenv.WithEnv("SERVICE_PKI", path),
		// sshRequiresMfa off: the matrix's keys are not MFA sessions; the
		// MFA rule of node tunnels is shown by internal/tunnels' tests.
		testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "tunnels: {issuer: 'http://localhost:3000', ssh: true, sshRequiresMfa: false}\n"+strings.Join(more, ""))))
}
