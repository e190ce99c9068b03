package nodework

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/vmnet"
)

// The private networks' overlay (docs/networking.md): a node's spec lists
// each private network of its VMs with the pool's other nodes carrying it
// (their underlay addresses, from their hello). A node carries a network
// while one of its VMs on it lives and is not asked deleted. When a
// node's list of networks changes, the other nodes of each network that
// came or went get a new spec too; a node whose underlay address changed
// has its peers' specs pushed (PushPeers).

// privateNetworks is the spec's Networks for node's instances (rows of
// NodeInstances), sorted by id.
func privateNetworks(ctx context.Context, q *db.Queries, node string, instances []db.Instance) ([]agentproto.NetworkSpec, error) {
	byTenant := map[string]*agentproto.NetworkSpec{}
	for _, r := range instances {
		if r.Network != vmnet.Private || r.DesiredState == agentproto.StateDeleted || byTenant[r.TenantID] != nil {
			continue
		}
		addr, err := netip.ParsePrefix(r.NetAddress.String)
		if err != nil {
			return nil, err
		}
		byTenant[r.TenantID] = &agentproto.NetworkSpec{ID: vmnet.PrivateNetworkID(r.PoolID, r.TenantID), Tenant: r.TenantID, VNI: vmnet.VNI(addr)}
	}
	if len(byTenant) == 0 {
		return nil, nil
	}
	peers, err := q.NodePrivatePeers(ctx, pgtype.Text{String: node, Valid: true})
	if err != nil {
		return nil, err
	}
	for _, p := range peers {
		n := byTenant[p.TenantID]
		a, err := netip.ParseAddr(p.Underlay)
		if n == nil || err != nil || slices.Contains(n.Peers, a) {
			continue // a node without an underlay takes part in no overlay
		}
		n.Peers = append(n.Peers, a)
	}
	out := make([]agentproto.NetworkSpec, 0, len(byTenant))
	for _, n := range byTenant {
		slices.SortFunc(n.Peers, func(a, b netip.Addr) int { return a.Compare(b) })
		out = append(out, *n)
	}
	slices.SortFunc(out, func(a, b agentproto.NetworkSpec) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// pushMembers pushes the spec of every other node carrying a network
// that node joined or left (before: its spec's networks until now).
func pushMembers(ctx context.Context, tx pgx.Tx, node, pool string, before, after []agentproto.NetworkSpec) error {
	q := db.New(tx)
	ids := func(ns []agentproto.NetworkSpec) map[string]string {
		m := make(map[string]string, len(ns))
		for _, n := range ns {
			m[n.ID] = n.Tenant
		}
		return m
	}
	was, is := ids(before), ids(after)
	changed := map[string]bool{} // tenants
	for id, tenant := range was {
		if _, ok := is[id]; !ok {
			changed[tenant] = true
		}
	}
	for id, tenant := range is {
		if _, ok := was[id]; !ok {
			changed[tenant] = true
		}
	}
	pushed := map[string]bool{node: true}
	if len(changed) == 0 {
		return nil
	}
	if pool == "" {
		n, err := q.GetNode(ctx, node)
		if err != nil {
			return err
		}
		pool = n.Node.PoolID
	}
	for _, tenant := range slices.Sorted(maps.Keys(changed)) {
		nodes, err := q.PrivateNetworkNodes(ctx, db.PrivateNetworkNodesParams{PoolID: pool, TenantID: tenant, Exclude: node})
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if !pushed[n] {
				pushed[n] = true
				if err := pushSpec(ctx, tx, n, false); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// PushPeers pushes the spec of every node sharing a private network with
// node, in tx: node's underlay address changed (its hello).
func PushPeers(ctx context.Context, tx pgx.Tx, node string) error {
	peers, err := db.New(tx).NodePrivatePeers(ctx, pgtype.Text{String: node, Valid: true})
	if err != nil {
		return err
	}
	pushed := map[string]bool{}
	for _, p := range peers {
		if !pushed[p.NodeID] {
			pushed[p.NodeID] = true
			if err := pushSpec(ctx, tx, p.NodeID, false); err != nil {
				return err
			}
		}
	}
	return nil
}
