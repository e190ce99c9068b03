package network

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/agent/egressproxy"
)

// What the network adds to a VM's cold boot on the host (make bench; the
// end-to-end figures are tools/netbench's): wiring an egress VM (tap on
// the tenant's bridge, its rules in one nftables transaction, the domain
// filter told) and removing it, with 20 other VMs on the node; and a live
// policy change.
func BenchmarkNetwork(b *testing.B) {
	if testing.Short() {
		b.Skip("network namespaces")
	}
	requireRoot(b)
	w := newWorld(b)
	cfg := testConfig(w)
	proxy, err := egressproxy.New(egressproxy.Config{NetNS: w.node.path()})
	require.NoError(b, err)
	b.Cleanup(func() { _ = proxy.Close() })
	cfg.Domains = proxy
	m, err := New(cfg)
	require.NoError(b, err)
	b.Cleanup(func() { _ = m.Close() })
	require.NoError(b, m.Cleanup(nil))
	for i := range 20 {
		_, err := m.Add(egressVM(fmt.Sprint("other-", i), "acme", fmt.Sprintf("10.200.1.%d/24", 10+i), "10.200.1.1", fmt.Sprintf("52:54:00:00:02:%02x", i)))
		require.NoError(b, err)
	}
	b.Run("add and remove an egress VM", func(b *testing.B) {
		i := 0
		var add time.Duration
		for b.Loop() {
			id := fmt.Sprint("vm-", i)
			i++
			t0 := time.Now()
			_, err := m.Add(egressVM(id, "acme", "10.200.1.2/24", "10.200.1.1", "52:54:00:00:01:02"))
			add += time.Since(t0)
			require.NoError(b, err)
			require.NoError(b, m.Remove(id))
		}
		b.ReportMetric(float64(add.Milliseconds())/float64(i), "add-ms/op")
	})
	b.Run("set a policy with a domain on a live VM", func(b *testing.B) {
		_, err := m.Add(egressVM("live", "acme", "10.200.1.3/24", "10.200.1.1", "52:54:00:00:01:03"))
		require.NoError(b, err)
		policies := []Policy{{AllowDomains: []string{"upstream.test"}, Deny: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
			{Allow: []netip.Prefix{netip.MustParsePrefix("198.51.100.10/32")}}}
		i := 0
		for b.Loop() {
			require.NoError(b, m.SetPolicy("live", policies[i%2]))
			i++
		}
	})
}
