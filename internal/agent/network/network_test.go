package network

import (
	"computeplane/internal/agentproto"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
)

func testConfig(w *world) Config {
	return Config{
		ID:           randHex(4),
		Uplink:       "up0",
		EgressPool:   netip.MustParsePrefix("10.200.0.0/16"),
		PrivatePool:  netip.MustParsePrefix("10.201.0.0/16"),
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")},
		Deny:         []netip.Prefix{netip.MustParsePrefix(serviceAddr + "/32")},
		NetNS:        w.node.path(),
	}
}

func newManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	require.NoError(t, m.Cleanup(nil))
	return m
}

func egressVM(id, tenant, addr, gw, mac string) VM {
	return VM{ID: id, VMNetwork: agentproto.VMNetwork{Mode: ModeEgress, Tenant: tenant, MAC: mac,
		Address: netip.MustParsePrefix(addr), Gateway: netip.MustParseAddr(gw)}}
}

func privateVM(id, tenant, addr, mac string) VM {
	return VM{ID: id, VMNetwork: agentproto.VMNetwork{Mode: ModePrivate, Tenant: tenant, MAC: mac, Address: netip.MustParsePrefix(addr)}}
}

func blocked(t *testing.T, v *fakeVM, addr string) {
	t.Helper()
	assert.Error(t, v.dial(addr), "%s must not reach %s", v.spec.ID, addr)
}

func reaches(t *testing.T, v *fakeVM, addr string) {
	t.Helper()
	assert.NoError(t, v.dial(addr), "%s must reach %s", v.spec.ID, addr)
}

func TestEgress(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	m := newManager(t, testConfig(w))
	a := w.startVM(t, m, egressVM("vm-a", "acme", "10.200.1.2/24", "10.200.1.1", "52:54:00:00:01:02"))

	t.Run("reaches the upstream by address and name, source-NATed", func(t *testing.T) {
		body, err := a.get("http://" + upstream + "/")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body, "the upstream sees the node's address")
		body, err = a.get("http://upstream.test/")
		require.NoError(t, err)
		assert.Equal(t, nodeAddr, body)
		reaches(t, a, allowedPriv+":80") // a private range the operator allowed
	})

	t.Run("the platform deny set", func(t *testing.T) {
		for _, addr := range []string{
			metadata + ":80",    // link-local metadata
			deniedPriv + ":80",  // a private range
			nodeAddr + ":8080",  // the node's address
			"10.200.1.1:8081",   // the node, as the VM's gateway
			serviceAddr + ":80", // a service of the platform elsewhere (Config.Deny)
			upstream + ":25",    // SMTP
		} {
			blocked(t, a, addr)
		}
	})

	t.Run("nothing inbound, no other VM", func(t *testing.T) {
		b := w.startVM(t, m, egressVM("vm-b", "other", "10.200.2.2/24", "10.200.2.1", "52:54:00:00:02:02"))
		c := w.startVM(t, m, egressVM("vm-c", "acme", "10.200.1.3/24", "10.200.1.1", "52:54:00:00:01:03"))
		b.accept(t, "0.0.0.0:9000")
		c.accept(t, "0.0.0.0:9000")
		a.accept(t, "0.0.0.0:9000")
		reaches(t, b, upstream+":80")
		blocked(t, a, "10.200.2.2:9000") // another tenant's VM
		blocked(t, a, "10.200.1.3:9000") // a VM of the same tenant in egress mode
		assert.Error(t, w.inet.dial("10.200.1.2:9000"), "the internet must not reach a VM")
		assert.Error(t, w.node.dial("10.200.1.2:9000"), "the node does not connect into a VM")
	})

	t.Run("byte counters", func(t *testing.T) {
		before, err := m.Counters()
		require.NoError(t, err)
		body, err := a.get("http://" + upstream + "/big")
		require.NoError(t, err)
		require.Len(t, body, bigBodyBytes)
		after, err := m.Counters()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, after["vm-a"].RxBytes-before["vm-a"].RxBytes, uint64(bigBodyBytes))
		assert.Greater(t, after["vm-a"].TxBytes, before["vm-a"].TxBytes)
		assert.Greater(t, after["vm-a"].TxPackets, before["vm-a"].TxPackets)
	})

	t.Run("a policy change on a live VM", func(t *testing.T) {
		require.NoError(t, m.SetPolicy("vm-a", Policy{Deny: []netip.Prefix{netip.MustParsePrefix(upstream + "/32")}}))
		blocked(t, a, upstream+":80")
		reaches(t, a, upstream2+":80")

		require.NoError(t, m.SetPolicy("vm-a", Policy{Allow: []netip.Prefix{netip.MustParsePrefix(upstream2 + "/32")}}))
		reaches(t, a, upstream2+":80")
		blocked(t, a, upstream+":80")
		blocked(t, a, allowedPriv+":80")

		// The deny set stays above an allow list.
		require.NoError(t, m.SetPolicy("vm-a", Policy{Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}))
		reaches(t, a, upstream+":80")
		blocked(t, a, metadata+":80")
		blocked(t, a, deniedPriv+":80")

		require.NoError(t, m.SetPolicy("vm-a", Policy{}))
		reaches(t, a, upstream+":80")

		assert.ErrorIs(t, m.SetPolicy("vm-a", Policy{AllowDomains: []string{"example.com"}}), ErrDomains)
		reaches(t, a, upstream+":80")
	})

	t.Run("an open connection is cut by a policy change", func(t *testing.T) {
		var conn net.Conn
		a.run(t, func() (err error) { conn, err = net.DialTimeout("tcp", upstream+":80", time.Second); return err })
		defer conn.Close()
		_, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		buf := make([]byte, 4096)
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(buf)
		require.NoError(t, err)
		require.NoError(t, m.SetPolicy("vm-a", Policy{Deny: []netip.Prefix{netip.MustParsePrefix(upstream + "/32")}}))
		_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err = conn.Read(buf)
		assert.Error(t, err, "no answer once the upstream is denied")
		require.NoError(t, m.SetPolicy("vm-a", Policy{}))
	})

	t.Run("anti-spoofing", func(t *testing.T) {
		// Another address inside the VM.
		a.run(t, func() error { return addAddr("eth0", "10.200.1.50/24") })
		assert.Error(t, a.dialFrom("10.200.1.50", upstream+":80"), "a spoofed source address gets nothing through")
		reaches(t, a, upstream+":80")
		// Another MAC address.
		a.run(t, func() error {
			return netlink.LinkSetHardwareAddr(must(netlink.LinkByName("eth0")), must(net.ParseMAC("52:54:00:99:99:99")))
		})
		blocked(t, a, upstream+":80")
		a.run(t, func() error {
			return netlink.LinkSetHardwareAddr(must(netlink.LinkByName("eth0")), must(net.ParseMAC(a.spec.MAC)))
		})
		reaches(t, a, upstream+":80")
	})
}

func TestPrivate(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	m := newManager(t, testConfig(w))
	// Two tenants with the same subnet on bridges of their own.
	p1 := w.startVM(t, m, privateVM("p1", "acme", "10.201.0.2/24", "52:54:00:00:03:02"))
	p2 := w.startVM(t, m, privateVM("p2", "acme", "10.201.0.3/24", "52:54:00:00:03:03"))
	p3 := w.startVM(t, m, privateVM("p3", "other", "10.201.0.4/24", "52:54:00:00:03:04"))
	for _, v := range []*fakeVM{p1, p2, p3} {
		v.accept(t, "0.0.0.0:9000")
	}
	reaches(t, p1, "10.201.0.3:9000")
	reaches(t, p2, "10.201.0.2:9000")
	blocked(t, p3, "10.201.0.2:9000")
	blocked(t, p3, "10.201.0.3:9000")
	blocked(t, p1, "10.201.0.4:9000")
	// No internet, no node: even with a route via a would-be gateway.
	p1.run(t, func() error { return defaultRoute("10.201.0.1") })
	blocked(t, p1, upstream+":80")
	blocked(t, p1, nodeAddr+":8080")
	// Anti-spoofing holds in private mode too: p3 posing as p1.
	p3.run(t, func() error { return addAddr("eth0", "10.201.0.9/24") })
	assert.Error(t, p3.dialFrom("10.201.0.9", "10.201.0.2:9000"))
	reaches(t, p3, "10.201.0.4:9000")
}

// links lists the node's interfaces whose names start with prefix.
func (w *world) links(t *testing.T, prefix string) []string {
	t.Helper()
	var out []string
	w.node.run(t, func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			if strings.HasPrefix(l.Attrs().Name, prefix) {
				out = append(out, l.Attrs().Name)
			}
		}
		return err
	})
	return out
}

// chains lists the chains of the node's tables called table.
func (w *world) chains(t *testing.T, table string) []string {
	t.Helper()
	var out []string
	w.node.run(t, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chs, err := c.ListChains()
		for _, ch := range chs {
			if ch.Table.Name == table {
				out = append(out, ch.Name)
			}
		}
		return err
	})
	return out
}

func TestRemoveAndCleanup(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	cfg := testConfig(w)
	m := newManager(t, cfg)
	prefix := Prefix + cfg.ID
	base := w.chains(t, m.names.table())

	// What another agent made, and someone else's table: never touched.
	foreign := Prefix + "zz" + cfg.ID[:2] + "t0000000"
	w.node.run(t, func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: foreign}}); err != nil {
			return err
		}
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "someone_else"})
		return c.Flush()
	})

	a := w.startVM(t, m, egressVM("vm-a", "acme", "10.200.1.2/24", "10.200.1.1", "52:54:00:00:01:02"))
	_ = w.startVM(t, m, egressVM("vm-b", "acme", "10.200.1.3/24", "10.200.1.1", "52:54:00:00:01:03"))
	_, err := m.Add(privateVM("p1", "acme", "10.201.0.2/24", "52:54:00:00:03:02"))
	require.NoError(t, err)
	reaches(t, a, upstream+":80")
	require.Len(t, w.links(t, prefix), 5, "three taps, an egress and a private bridge")

	// Remove takes the VM's tap and rules; the bridge stays for vm-b.
	require.NoError(t, m.Remove("vm-a"))
	assert.NotContains(t, w.links(t, prefix), m.names.tap("vm-a"))
	assert.Contains(t, w.links(t, prefix), m.names.bridge(ModeEgress, "acme"))
	assert.NotContains(t, w.chains(t, m.names.table()), vmChain(vmKey("vm-a")))
	blocked(t, a, upstream+":80")
	require.NoError(t, m.Remove("vm-a"), "removing twice is no error")
	// The last VM of a bridge takes it along.
	require.NoError(t, m.Remove("p1"))
	assert.NotContains(t, w.links(t, prefix), m.names.bridge(ModePrivate, "acme"))

	// An agent restarting after a crash keeps vm-b (still running) and
	// removes the rest; then Adds vm-b again.
	_, err = m.Add(privateVM("p2", "acme", "10.201.0.3/24", "52:54:00:00:03:03"))
	require.NoError(t, err)
	m2, err := New(cfg)
	require.NoError(t, err)
	defer m2.Close()
	require.NoError(t, m2.Cleanup(func(id string) bool { return id == "vm-b" }))
	assert.ElementsMatch(t, []string{m.names.tap("vm-b"), m.names.bridge(ModeEgress, "acme")}, w.links(t, prefix))
	assert.ElementsMatch(t, base, w.chains(t, m.names.table()), "only the base chains")
	_, err = m2.Add(egressVM("vm-b", "acme", "10.200.1.3/24", "10.200.1.1", "52:54:00:00:01:03"))
	require.NoError(t, err)

	// And after a crash that kept nothing, nothing of this agent is left
	// but its empty base ruleset; what it did not make is still there.
	m3, err := New(cfg)
	require.NoError(t, err)
	defer m3.Close()
	require.NoError(t, m3.Cleanup(nil))
	assert.Empty(t, w.links(t, prefix))
	assert.ElementsMatch(t, base, w.chains(t, m.names.table()))
	assert.Equal(t, []string{foreign}, w.links(t, foreign))
	w.node.run(t, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		_, err = c.ListTableOfFamily("someone_else", nftables.TableFamilyINet)
		return err
	})
}

func TestBandwidthCap(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	cfg := testConfig(w)
	cfg.BandwidthMbps = 8 // 1 MB/s each way
	m := newManager(t, cfg)
	a := w.startVM(t, m, egressVM("vm-a", "acme", "10.200.1.2/24", "10.200.1.1", "52:54:00:00:01:02"))
	start := time.Now()
	body, err := a.get(fmt.Sprintf("http://%s/big?n=%d", upstream, 2<<20))
	require.NoError(t, err)
	require.Len(t, body, 2<<20)
	// nftables' byte limit lets a second's worth plus the burst through at
	// once (1.1 MB), then 1 MB/s: about 1 s for 2 MiB (uncapped, a few ms).
	assert.Greater(t, time.Since(start), 600*time.Millisecond)
}
