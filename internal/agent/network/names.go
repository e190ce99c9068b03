package network

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// Every interface this package makes is named Prefix + the agent's id +
// a kind letter + a hash, so that an agent's Cleanup removes what it made
// and nothing else (IFNAMSIZ leaves 15 characters):
//
//	cp<id>e<6 hex>   a tenant's egress bridge
//	cp<id>p<6 hex>   a tenant's private bridge
//	cp<id>t<8 hex>   a VM's tap
//	cp<id>x<6 hex>   a tenant's private bridge's VXLAN port (overlay.go)
//
// nftables objects live in the agent's own tables (cp_<id>, families inet
// and bridge) and carry the VM's key (8 hex) in their names.
const Prefix = "cp"

var idRE = regexp.MustCompile(`^[a-z0-9]{4}$`)

// AgentID derives the four-character id an agent names its objects with
// from a longer stable name (the node id).
func AgentID(node string) string {
	sum := sha256.Sum256([]byte(node))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:]))[:4]
}

func checkID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("network: agent id %q is not four characters of [a-z0-9]", id)
	}
	return nil
}

func hash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

type names struct{ id string }

func (n names) ifPrefix() string  { return Prefix + n.id }
func (n names) tapPrefix() string { return Prefix + n.id + "t" }
func (n names) table() string     { return Prefix + "_" + n.id }

// VMKey is the short name of a VM in every object made for it: its tap
// (cp<id>t<key>), its nftables chains, sets and counters (vm_<key>,
// tx_<key>, ...). What an operator or a test looks the VM's objects up by.
func VMKey(vmID string) string { return hash("vm/"+vmID, 8) }

func vmKey(vmID string) string { return VMKey(vmID) }

func (n names) tap(vmID string) string { return n.tapPrefix() + vmKey(vmID) }

func (n names) bridge(mode Mode, tenant string) string {
	kind := "e"
	if mode == ModePrivate {
		kind = "p"
	}
	return n.ifPrefix() + kind + hash(string(mode)+"/"+tenant, 6)
}

// Link aliases say whose an interface is: Cleanup reads a tap's VM id
// from its alias.
const (
	tapAliasPrefix    = "computeplane vm "
	bridgeAliasPrefix = "computeplane bridge "
)
