package guest

import (
	"encoding/base64"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"computeplane/internal/guestproto"
)

func TestNetworkFromCmdline(t *testing.T) {
	raw := `{"mac":"52:54:00:00:01:02","address":"10.200.1.2/24","gateway":"10.200.1.1","dns":["198.51.100.53"],"mtu":1400}`
	n, err := netFromCmdline(base64.RawURLEncoding.EncodeToString([]byte(raw)))
	require.NoError(t, err)
	assert.Equal(t, guestproto.Network{MAC: "52:54:00:00:01:02", Address: "10.200.1.2/24", Gateway: "10.200.1.1",
		DNS: []string{"198.51.100.53"}, MTU: 1400}, *n)
	_, err = netFromCmdline(base64.RawURLEncoding.EncodeToString([]byte(`{"address":"10.200.1.2/24","gateway":"10.9.9.9"}`)))
	assert.Error(t, err, "a gateway outside the subnet")
	_, err = guestproto.DecodeRequest([]byte(`{"id":1,"op":"identity","identity":{"hostname":"h","network":{"address":"nope"}}}`))
	assert.Error(t, err)
}

// TestConfigureNetwork configures a card in a network namespace of its
// own (a veth pair standing in for virtio-net), as identity does in a
// guest: address, MTU, default route, resolv.conf; a second identity
// (a restore) replaces the address.
func TestConfigureNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("!!! SKIPPED: TestConfigureNetwork needs root (a network namespace) !!!")
	}
	a := NewAgent(slog.New(slog.DiscardHandler))
	a.Root, a.Network = t.TempDir(), true
	in := func(f func() error) error {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends in the test's namespace
			h, err := netns.New()
			if err != nil {
				errc <- err
				return
			}
			t.Cleanup(func() { _ = h.Close() })
			errc <- f()
		}()
		return <-errc
	}
	mac := "52:54:00:00:01:02"
	require.NoError(t, in(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: must(net.ParseMAC(mac))}, PeerName: "peer0"}); err != nil {
			return err
		}
		_ = netlink.LinkSetUp(must(netlink.LinkByName("peer0")))
		id := &guestproto.Identity{Hostname: "h1", Network: &guestproto.Network{MAC: mac, Address: "10.200.1.2/24",
			Gateway: "10.200.1.1", DNS: []string{"198.51.100.53", "198.51.100.54"}, MTU: 1400}}
		if err := a.setIdentity(id); err != nil {
			return err
		}
		eth := must(netlink.LinkByName("eth0"))
		assert.Equal(t, 1400, eth.Attrs().MTU)
		addrs := must(netlink.AddrList(eth, netlink.FAMILY_V4))
		require.Len(t, addrs, 1)
		assert.Equal(t, "10.200.1.2/24", addrs[0].IPNet.String())
		routes := must(netlink.RouteList(eth, netlink.FAMILY_V4))
		var gw string
		for _, r := range routes {
			if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
				gw = r.Gw.String()
			}
		}
		assert.Equal(t, "10.200.1.1", gw)

		// A restore gets its own address: the old one goes.
		id.Network = &guestproto.Network{MAC: mac, Address: "10.200.1.9/24", Gateway: "10.200.1.1"}
		if err := a.setIdentity(id); err != nil {
			return err
		}
		addrs = must(netlink.AddrList(eth, netlink.FAMILY_V4))
		require.Len(t, addrs, 1)
		assert.Equal(t, "10.200.1.9/24", addrs[0].IPNet.String())
		return nil
	}))
	conf, err := os.ReadFile(filepath.Join(a.Root, "etc/resolv.conf"))
	require.NoError(t, err)
	assert.Equal(t, "nameserver 198.51.100.53\nnameserver 198.51.100.54\n", string(conf))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
