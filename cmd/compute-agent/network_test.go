package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agent"
	"computeplane/internal/agent/network"
	"computeplane/internal/agentproto"
)

// joinedDir is an agent directory holding a node's state (no key: the
// network flags are refused before the daemon needs one).
func joinedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, agent.Dir(dir).SaveState(&agent.State{NodeID: "node-1", APIURL: "https://127.0.0.1:8443",
		FallbackURL: "https://192.0.2.8/agent", Gateways: []agentproto.Gateway{{ID: "g1", URL: "https://192.0.2.7:9443"}}}))
	return dir
}

// Every network flag that cannot be honoured is refused at start, named,
// before anything runs.
func TestRunRefusesNetworkFlagsItCannotHonour(t *testing.T) {
	joined := joinedDir(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--net-uplink", "eth0"}, 2, "--net-uplink needs --network nftables"},
		{[]string{"--network", "none", "--net-bandwidth-mbps", "10"}, 2, "--net-bandwidth-mbps needs --network nftables"},
		{[]string{"--network", "cni"}, 2, `--network "cni": use none or nftables`},
		{[]string{"--network", "nftables", "--dir", t.TempDir()}, 1, "holds no joined node"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-egress-pool", "10.200.0.1/16"}, 2, "--net-egress-pool"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-private-pool", "10.200.128.0/17"}, 2, "overlap"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-allow-private", "8.8.8.0/24"}, 2, "--net-allow-private 8.8.8.0/24 is not inside a private range"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-deny", "nope"}, 2, `--net-deny "nope"`},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-deny", "2001:db8::/32"}, 2, "VMs have IPv4 only"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-resolvers", "dns.example"}, 2, "--net-resolvers"},
		// No operator option lifts an IPv6 destination (docs/networking.md, "IPv6").
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-allow-private", "fc00::/7"}, 2, "VMs have IPv4 only"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-resolvers", "fd00::53"}, 2, `--net-resolvers "fd00::53" is not an IPv4 address`},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-mtu", "100"}, 2, "--net-mtu 100"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-bandwidth-mbps", "-1"}, 2, "--net-bandwidth-mbps -1"},
		{[]string{"--network", "nftables", "--net-uplink", "cpnosuch0"}, 2, `--net-uplink "cpnosuch0"`},
		{[]string{"--net-netns", "/var/run/netns/x"}, 2, "--net-netns needs --network nftables"},
		{[]string{"--net-domain-filter=false"}, 2, "--net-domain-filter needs --network nftables"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-netns", "/nonexistent/netns"}, 2, `--net-netns "/nonexistent/netns"`},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-netns", "/etc/hostname"}, 2, `--net-netns "/etc/hostname" is not a network namespace`},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-underlay", "127.0.0.1"}, 2, `--net-underlay "127.0.0.1" is not a unicast IPv4 address`},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-underlay", "192.0.2.250"}, 2, "--net-underlay 192.0.2.250: no interface of the node holds it"},
		{[]string{"--network", "nftables", "--net-uplink", "lo", "--net-vxlan-port", "0"}, 2, "--net-vxlan-port 0"},
		{[]string{"--underlay", "192.0.2.1"}, 2, "flag provided but not defined"},
		{[]string{"--net-underlay", "192.0.2.1"}, 2, "--net-underlay needs --network nftables"},
		{[]string{"--network", "nftables", "--net-uplink", "lo"}, 2, "the recording runtime runs no VMs"},
	} {
		args := append([]string{"run", "--runtime", "recording", "--dir", joined}, tc.args...)
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, stderr.String())
		assert.Contains(t, stderr.String(), tc.want, "%v", tc.args)
	}
}

// The flags make the manager's configuration: the platform's API and
// gateways are denied on top of --net-deny, and the agent's id is the
// node's.
func TestNetworkFlagsMakeTheConfig(t *testing.T) {
	st, err := agent.Dir(joinedDir(t)).LoadState()
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := netFlags{mode: "nftables", uplink: "lo", egressPool: "10.200.0.0/16", privatePool: "10.201.0.0/16",
		allowPrivate: "10.99.0.0/16", deny: "198.51.100.99, 198.51.100.0/30", resolvers: "10.0.0.53", bandwidthMbps: 50, mtu: 1450}
	cfg, err := f.config(map[string]bool{"network": true}, st, log)
	require.NoError(t, err)
	p := netip.MustParsePrefix
	assert.Equal(t, &network.Config{ID: network.AgentID("node-1"), Uplink: "lo", EgressPool: p("10.200.0.0/16"), PrivatePool: p("10.201.0.0/16"),
		AllowPrivate: []netip.Prefix{p("10.99.0.0/16")},
		Deny:         []netip.Prefix{p("198.51.100.99/32"), p("198.51.100.0/30"), p("127.0.0.1/32"), p("192.0.2.8/32"), p("192.0.2.7/32")},
		Resolvers:    []netip.Addr{netip.MustParseAddr("10.0.0.53")}, BandwidthMbps: 50, MTU: 1450}, cfg)
	assert.Equal(t, []string{"egress"}, Networks(cfg), "an uplink without a global address: no underlay, no private networks")
	cfg.Underlay = netip.MustParseAddr("192.0.2.1")
	assert.Equal(t, []string{"egress", "private"}, Networks(cfg))
	assert.Nil(t, Networks(nil))

	none := netFlags{mode: "none"}
	cfg, err = none.config(map[string]bool{"runtime": true}, &agent.State{}, log)
	require.NoError(t, err)
	assert.Nil(t, cfg, "--network none: VMs without a network, as before")
}
