package guest

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"computeplane/internal/guestproto"
)

// netFromCmdline decodes compute.net=<base64url JSON of
// guestproto.Network> from a kernel command line value.
func netFromCmdline(v string) (*guestproto.Network, error) {
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil, fmt.Errorf("compute.net: %w", err)
	}
	var n guestproto.Network
	if err := json.Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("compute.net: %w", err)
	}
	return &n, n.Validate()
}

// configureNetwork addresses the guest's card: its MTU, its one IPv4
// address (others removed: a restored guest gets its own), the default
// route and /etc/resolv.conf (under a.Root). It works in the calling
// thread's network namespace (the guest's; a test's).
func (a *Agent) configureNetwork(n *guestproto.Network) error {
	if err := n.Validate(); err != nil {
		return err
	}
	link, err := findCard(n.MAC, 3*time.Second)
	if err != nil {
		return err
	}
	if n.MTU != 0 {
		if err := netlink.LinkSetMTU(link, n.MTU); err != nil {
			return fmt.Errorf("network: mtu: %w", err)
		}
	}
	addr, err := netlink.ParseAddr(n.Address)
	if err != nil {
		return err
	}
	old, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	has := false
	for _, o := range old {
		if o.IPNet.String() == addr.IPNet.String() {
			has = true
			continue
		}
		if err := netlink.AddrDel(link, &o); err != nil {
			return fmt.Errorf("network: remove %s: %w", o.IPNet, err)
		}
	}
	if !has {
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("network: address %s: %w", n.Address, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network: up: %w", err)
	}
	if n.Gateway != "" {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.ParseIP(n.Gateway)}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("network: default route via %s: %w", n.Gateway, err)
		}
	}
	var conf strings.Builder
	for _, d := range n.DNS {
		fmt.Fprintf(&conf, "nameserver %s\n", d)
	}
	if conf.Len() > 0 {
		if err := os.MkdirAll(a.path("/etc"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(a.path("/etc/resolv.conf"), []byte(conf.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// findCard waits for the network card (virtio_net probes while the guest
// boots): the one with mac, or the first that is not loopback.
func findCard(mac string, wait time.Duration) (netlink.Link, error) {
	hw, _ := net.ParseMAC(mac)
	deadline := time.Now().Add(wait)
	for {
		links, err := netlink.LinkList()
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			at := l.Attrs()
			if at.Flags&net.FlagLoopback != 0 {
				continue
			}
			if hw == nil || strings.EqualFold(at.HardwareAddr.String(), hw.String()) {
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			if hw != nil {
				return nil, fmt.Errorf("network: no card with address %s", mac)
			}
			return nil, errors.New("network: no network card")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
