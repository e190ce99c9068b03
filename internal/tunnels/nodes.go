package tunnels

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/iam"
	"computeplane/internal/nodes"
)

// TargetNode is the target kind of a tunnel to a node (tunnels.openNode).
const TargetNode = "node"

// nodeAction is what opening a tunnel to a node is decided as
// (catalog/tunnels.yaml, on the fleet): the re-authorizer decides it again.
const nodeAction = "compute:tunnels:node"

// OpenNode answers tunnels.openNode: break-glass access to a node, a
// shell its daemon runs (node-console) or its SSH server (ssh). The
// envelope decided it on the fleet (root owners and admins) and refused
// another tenant than the root (rootTenantOnly); the MFA session is
// checked here, as for a node's certificate.
func (s *Service) OpenNode(ctx context.Context, in *api.TunnelsOpenNodeInput) (*api.TunnelTicket, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if in.Kind == tunnel.KindSSH && s.SSH == nil {
		return nil, api.Errorf(api.CodeUnsupported, "SSH is not enabled on this deployment (tunnels.ssh)")
	}
	if in.Kind == tunnel.KindSSH && in.Size != nil {
		return nil, api.Errorf(api.CodeInvalidInput, "size: the ssh client sends its terminal's size").WithDetails(map[string]any{"field": "size"})
	}
	if s.NodeRequiresMFA && !sess.Caller.MFA {
		return nil, api.Errorf(api.CodeAccessDenied, "a tunnel to a node (break-glass) needs an MFA session (tunnels.sshRequiresMfa)").
			WithDetails(map[string]any{"reason": "mfa-required"})
	}
	n, err := q.GetNode(ctx, in.NodeID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && n.Node.State == nodes.StateRetired) {
		return nil, api.Errorf(api.CodeNotFound, "node %s not found", in.NodeID)
	}
	if err != nil {
		return nil, err
	}
	p := db.InsertTunnelParams{TenantID: in.TenantID, TargetKind: TargetNode, TargetID: in.NodeID, NodeID: in.NodeID,
		Kind: in.Kind, Argv: []byte("[]"), Tty: in.Kind == tunnel.KindNodeConsole}
	return s.issue(ctx, sess, q, p, in.Size)
}

// decision is the action and resource a tunnel's opening was decided on:
// a node's on the fleet, the others' on their tenant.
func decision(row db.Tunnel, prefix string) (string, iam.Resource) {
	if row.TargetKind == TargetNode {
		return nodeAction, iam.Resource{Type: prefix + "fleet", ID: "global", TenantID: row.TenantID}
	}
	return openAction, iam.Resource{Type: prefix + "tenant", ID: row.TenantID, TenantID: row.TenantID}
}
