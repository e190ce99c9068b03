package instances_test

// VM networks through the API (issue 23): what instances.create and
// instances.setEgressPolicy put in the spec a node receives, with the
// recording runtime (no VM: the agent records each spec it applies).

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/agentproto"
	"computeplane/internal/fleettest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
	"computeplane/internal/vmnet"
)

// nodeSpec is the last spec the recording runtime applied.
func nodeSpec(t *testing.T, a *fleettest.Agent) agentproto.Spec {
	t.Helper()
	var s agentproto.Spec
	b, err := os.ReadFile(filepath.Join(a.Dir, "runtime", "spec.json"))
	if err == nil {
		require.NoError(t, json.Unmarshal(b, &s))
	}
	return s
}

// specOf waits for the node to have applied a spec of at least gen and
// returns instance id's entry in it.
func specOf(t *testing.T, a *fleettest.Agent, id string, gen int64) (agentproto.InstanceSpec, int64) {
	t.Helper()
	var found agentproto.InstanceSpec
	var at int64
	require.Eventually(t, func() bool {
		s := nodeSpec(t, a)
		for _, in := range s.Body.Instances {
			if in.ID == id && s.Generation >= gen {
				found, at = in, s.Generation
				return true
			}
		}
		return false
	}, 15*time.Second, 20*time.Millisecond, "instance %s in a spec of generation %d or later", id, gen)
	return found, at
}

func TestNetworksInTheNodeSpec(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "recording", "--vcpu", "8", "--memory-mib", "8192", "--disk-gib", "20")
	c := f.C
	create := func(name string, network client.OptInstancesCreateInputNetwork, egress client.OptEgressPolicy) (client.Instance, error) {
		res, err := c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: "acme", PoolId: pool, Flavor: "small",
			ImageId: "computeplane/minimal", Name: name, IdempotencyKey: name, Network: network, Egress: egress})
		if err != nil {
			return client.Instance{}, err
		}
		return res.Data, nil
	}
	rows := func() (n int) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select count(*) from instances where pool_id = $1`, pool).Scan(&n))
		return n
	}

	// Default egress, with a policy: normalized on the way in.
	a, err := create("a", client.OptInstancesCreateInputNetwork{}, client.NewOptEgressPolicy(client.EgressPolicy{
		Allow: []string{"203.0.113.9/24", "PyPI.org", "*.github.com"}, Deny: []string{"198.51.100.7"}}))
	require.NoError(t, err)
	assert.Equal(t, "egress", string(a.Network))
	assert.Equal(t, "10.200.0.2/24", a.Address.Value)
	assert.Equal(t, vmnet.MAC(a.InstanceId), a.MAC.Value)
	assert.Equal(t, []string{"203.0.113.0/24", "pypi.org", "*.github.com"}, a.Egress.Allow)
	assert.Equal(t, []string{"198.51.100.7/32"}, a.Egress.Deny)
	priv, err := create("p", client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkPrivate), client.OptEgressPolicy{})
	require.NoError(t, err)
	assert.Equal(t, "10.201.0.2/24", priv.Address.Value)
	none, err := create("n", client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkNone), client.OptEgressPolicy{})
	require.NoError(t, err)
	assert.True(t, none.Address.Null)
	assert.True(t, none.MAC.Null)
	assert.Empty(t, none.Egress.Allow)

	// The spec the node applied carries each VM's network.
	spec, _ := specOf(t, agent, a.InstanceId, 0)
	require.NotNil(t, spec.Network)
	mac := spec.Network.MAC
	assert.Equal(t, agentproto.VMNetwork{Mode: "egress", Tenant: "acme", MAC: a.MAC.Value,
		Address: netip.MustParsePrefix("10.200.0.2/24"), Gateway: netip.MustParseAddr("10.200.0.1"),
		Policy: agentproto.EgressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
			Deny: []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32")}, AllowDomains: []string{"pypi.org", "*.github.com"}}}, *spec.Network)
	assert.Equal(t, byte(0x02), parseMAC(t, mac)[0]&0x03, "locally administered, unicast")
	spec, _ = specOf(t, agent, priv.InstanceId, 0)
	require.NotNil(t, spec.Network)
	assert.Equal(t, "private", spec.Network.Mode)
	assert.Equal(t, netip.MustParsePrefix("10.201.0.2/24"), spec.Network.Address)
	assert.False(t, spec.Network.Gateway.IsValid())
	assert.Equal(t, vmnet.PrivateNetworkID(pool, "acme"), spec.Network.NetworkID)
	spec, _ = specOf(t, agent, none.InstanceId, 0)
	assert.Equal(t, &agentproto.VMNetwork{Mode: "none"}, spec.Network)

	// Bad input names the field and leaves no row.
	before := rows()
	for _, bad := range []struct {
		name    string
		network client.OptInstancesCreateInputNetwork
		egress  client.EgressPolicy
		says    string
	}{
		{"deny-domain", client.OptInstancesCreateInputNetwork{}, client.EgressPolicy{Deny: []string{"10.9.0.0/16", "example.com"}}, "egress.deny[1]: \"example.com\""},
		{"not-cidr", client.OptInstancesCreateInputNetwork{}, client.EgressPolicy{Allow: []string{"10.0.0.0/33"}}, "egress.allow[0]"},
		{"ipv6", client.OptInstancesCreateInputNetwork{}, client.EgressPolicy{Deny: []string{"2001:db8::/32"}}, "egress.deny[0]"},
		{"junk", client.OptInstancesCreateInputNetwork{}, client.EgressPolicy{Allow: []string{"not a name"}}, "egress.allow[0]"},
		{"too-many", client.OptInstancesCreateInputNetwork{}, client.EgressPolicy{Allow: make([]string, 65)}, "egress.allow"},
		{"policy-private", client.NewOptInstancesCreateInputNetwork(client.InstancesCreateInputNetworkPrivate), client.EgressPolicy{Allow: []string{"1.1.1.1"}}, "egress:"},
	} {
		if bad.name == "too-many" {
			for i := range bad.egress.Allow {
				bad.egress.Allow[i] = fmt.Sprintf("192.0.2.%d", i)
			}
		}
		_, err := create(bad.name, bad.network, client.NewOptEgressPolicy(bad.egress))
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code, bad.name)
		assert.Contains(t, e.Message, bad.says, bad.name)
	}
	assert.Equal(t, before, rows(), "refused creates leave no row")

	// setEgressPolicy rewrites the spec with a new generation.
	_, gen := specOf(t, agent, a.InstanceId, 0)
	res, err := c.InstancesSetEgressPolicy(t.Context(), &client.InstancesSetEgressPolicyInput{TenantId: "acme", InstanceId: a.InstanceId,
		Egress: client.EgressPolicy{Allow: []string{"192.0.2.0/25"}}})
	require.NoError(t, err)
	assert.Equal(t, a.Version+1, res.Data.Version)
	assert.Equal(t, []string{"192.0.2.0/25"}, res.Data.Egress.Allow)
	assert.Empty(t, res.Data.Egress.Deny)
	require.Eventually(t, func() bool {
		s, g := specOf(t, agent, a.InstanceId, gen+1)
		return g > gen && len(s.Network.Policy.Allow) == 1 && s.Network.Policy.Allow[0] == netip.MustParsePrefix("192.0.2.0/25") &&
			len(s.Network.Policy.AllowDomains) == 0 && len(s.Network.Policy.Deny) == 0 && s.Network.Address == netip.MustParsePrefix("10.200.0.2/24")
	}, 15*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1, f.Events("instance.egress.changed", a.InstanceId))
	// Under another network, it is INVALID_STATE; bad entries INVALID_INPUT; both change nothing.
	_, err = c.InstancesSetEgressPolicy(t.Context(), &client.InstancesSetEgressPolicyInput{TenantId: "acme", InstanceId: priv.InstanceId,
		Egress: client.EgressPolicy{Allow: []string{"192.0.2.0/25"}}})
	assert.Equal(t, "INVALID_STATE", testenv.APIError(t, err).Code)
	_, err = c.InstancesSetEgressPolicy(t.Context(), &client.InstancesSetEgressPolicyInput{TenantId: "acme", InstanceId: a.InstanceId,
		Egress: client.EgressPolicy{Deny: []string{"evil.example"}}})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_INPUT", e.Code)
	assert.Contains(t, e.Message, "egress.deny[0]")
	got, err := c.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: "acme", InstanceId: a.InstanceId})
	require.NoError(t, err)
	assert.Equal(t, res.Data.Version, got.Data.Version)
	assert.Equal(t, []string{"192.0.2.0/25"}, got.Data.Egress.Allow)

	// Addresses are unique among live VMs, and free again once a VM is gone.
	b, err := create("b", client.OptInstancesCreateInputNetwork{}, client.OptEgressPolicy{})
	require.NoError(t, err)
	assert.Equal(t, "10.200.0.3/24", b.Address.Value)
	_, err = c.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: "acme", InstanceId: a.InstanceId})
	require.NoError(t, err)
	// Asked deleted but still on the node: its address stays taken.
	c2, err := create("c", client.OptInstancesCreateInputNetwork{}, client.OptEgressPolicy{})
	require.NoError(t, err)
	if c2.Address.Value != "10.200.0.4/24" {
		// The node already reported a's VM gone: its address was free.
		assert.Equal(t, "10.200.0.2/24", c2.Address.Value)
	}
	require.Eventually(t, func() bool {
		got, err := c.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: "acme", InstanceId: a.InstanceId})
		return err == nil && string(got.Data.State) == "deleted"
	}, 15*time.Second, 20*time.Millisecond)
	d, err := create("d", client.OptInstancesCreateInputNetwork{}, client.OptEgressPolicy{})
	require.NoError(t, err)
	var live []string
	for _, id := range []string{b.InstanceId, c2.InstanceId, d.InstanceId} {
		got, err := c.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: "acme", InstanceId: id})
		require.NoError(t, err)
		live = append(live, got.Data.Address.Value)
	}
	assert.ElementsMatch(t, []string{"10.200.0.2/24", "10.200.0.3/24", "10.200.0.4/24"}, live, "a's address reused once it was gone, never twice")
	var dup int
	require.NoError(t, f.DB.QueryRow(t.Context(), `select count(*) from (select net_address from instances
		where pool_id = $1 and state <> 'deleted' and net_address is not null group by network, net_address having count(*) > 1) x`, pool).Scan(&dup))
	assert.Zero(t, dup)
	assert.NotEqual(t, vmnet.MAC(b.InstanceId), vmnet.MAC(d.InstanceId))
}

func parseMAC(t *testing.T, s string) []byte {
	t.Helper()
	var b [6]byte
	_, err := fmt.Sscanf(s, "%02x:%02x:%02x:%02x:%02x:%02x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5])
	require.NoError(t, err, s)
	return b[:]
}
