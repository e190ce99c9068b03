// Package nodes implements the nodes group: the hosts of a pool and their
// states. A node belongs to its pool's owner. Only ready nodes take new
// work (internal/placement filters on the state); cordoned, draining, down
// and retired ones keep what runs on them.
//
//	joining -> ready <-> cordoned
//	ready, cordoned -> draining -> ready (uncordon)
//	any but retired -> retired (nothing booked)
//	ready <-> down (the daemon's session; daemon-run nodes only)
package nodes

import (
	"context"
	"encoding/json"
	"maps"
	"time"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// States of a node.
const (
	StateJoining  = "joining"
	StateReady    = "ready"
	StateCordoned = "cordoned"
	StateDraining = "draining"
	StateRetired  = "retired"
	StateDown     = "down"
)

// ResourceType is the node's type in the authorization projection, without
// the deployment's prefix.
const ResourceType = "node"

// MaxLabels bounds a node's labels.
const MaxLabels = 64

// Service implements api.NodesService.
type Service struct{}

var _ api.NodesService = Service{}

func formatTimePtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := wire.Time(*t)
	return &s
}

func gpus(model string, n int32) []api.NodeGPU {
	if n == 0 {
		return []api.NodeGPU{}
	}
	return []api.NodeGPU{{Model: model, Count: int64(n)}}
}

// Output is the node as the API shows it.
func Output(n db.Node, owner string) *api.Node {
	labels := map[string]string{}
	_ = json.Unmarshal(n.Labels, &labels)
	out := &api.Node{
		NodeID: n.NodeID, TenantID: owner, PoolID: n.PoolID, SiteID: n.SiteID, Hostname: n.Hostname, State: n.State, Labels: labels,
		Capacity:        api.Capacity{Vcpu: int64(n.CapVcpu), MemoryMiB: n.CapMemoryMib, DiskGiB: n.CapDiskGib, Gpus: gpus(n.GpuModel.String, n.CapGpus)},
		AllocatableVcpu: int64(n.AllocVcpu), VcpuAllocationRatio: n.VcpuAllocationRatio,
		Booked:              api.Capacity{Vcpu: int64(n.BookedVcpu), MemoryMiB: n.BookedMemoryMib, DiskGiB: n.BookedDiskGib, Gpus: gpus(n.GpuModel.String, n.BookedGpus)},
		CertificateNotAfter: formatTimePtr(n.CertNotAfter), Declared: n.Declared, Version: n.Version,
		CreatedAt: wire.Time(n.CreatedAt), UpdatedAt: wire.Time(n.UpdatedAt),
	}
	if n.VolumeReportedAt != nil {
		out.VolumeStore = &api.VolumeStore{
			AvailableBytes: n.VolumeAvailableBytes.Int64, ReservedBytes: n.VolumeReservedBytes.Int64,
			OutstandingBytes: n.VolumeOutstandingBytes.Int64, ReportedAt: wire.Time(*n.VolumeReportedAt),
		}
	}
	if n.AgentVersion.Valid {
		out.Agent = &api.Agent{Version: n.AgentVersion.String, Protocol: int64(n.AgentProtocol.Int32)}
	}
	if n.SessionGateway.Valid && n.SessionSince != nil {
		out.Session = &api.NodeSession{GatewayID: n.SessionGateway.String, Since: wire.Time(*n.SessionSince)}
	}
	return out
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "node %s not found", id) }

// List answers nodes.list; nodes the caller may not read are left out.
func (Service) List(ctx context.Context, in *api.NodesListInput) (*api.NodeList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p := db.ListNodesParams{TenantID: in.TenantID}
	if in.PoolID != nil {
		p.PoolID.String, p.PoolID.Valid = *in.PoolID, true
	}
	if in.State != nil {
		p.State.String, p.State.Valid = *in.State, true
	}
	rows, err := q.ListNodes(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &api.NodeList{Items: make([]api.Node, 0, len(rows))}
	for _, r := range rows {
		if sess.CanRead(ctx, "compute:nodes:read", ResourceType, r.Node.NodeID, r.Owner) {
			out.Items = append(out.Items, *Output(r.Node, r.Owner))
		}
	}
	return out, nil
}

// Get answers nodes.get.
func (Service) Get(ctx context.Context, in *api.NodesGetInput) (*api.Node, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := q.GetNode(ctx, in.NodeID)
	if r, err = store.Visible(r, err, r.Owner == in.TenantID, notFound(in.NodeID)); err != nil {
		return nil, err
	}
	return Output(r.Node, r.Owner), nil
}

// change is one state change: the states it moves from, its target, the
// event it publishes. A node already in the target state is returned
// unchanged, without an event.
type change struct {
	from  []string
	to    string
	event string
}

func (Service) move(ctx context.Context, tenant, id string, c change, reason *string) (*api.Node, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := q.GetNodeForUpdate(ctx, id)
	if r, err = store.Visible(r, err, r.Owner == tenant, notFound(id)); err != nil {
		return nil, err
	}
	n := r.Node
	if n.State == c.to {
		return Output(n, r.Owner), nil
	}
	allowed := false
	for _, s := range c.from {
		allowed = allowed || s == n.State
	}
	if !allowed {
		return nil, api.Errorf(api.CodeInvalidState, "node %s is %s; it cannot become %s", id, n.State, c.to).
			WithDetails(map[string]any{"state": n.State})
	}
	if c.to == StateRetired {
		booked, err := q.CountLiveBookings(ctx, id)
		if err != nil {
			return nil, err
		}
		if booked > 0 {
			return nil, api.Errorf(api.CodeInvalidState, "node %s still holds %d bookings; drain it first", id, booked).
				WithDetails(map[string]any{"bookings": booked})
		}
		// A retired node's certificates are refused from now on; gateways
		// close its session when they next load the revocation set.
		if _, err := q.InsertRevocation(ctx, db.InsertRevocationParams{Kind: "node", Value: id, Reason: "retired"}); err != nil {
			return nil, err
		}
	}
	if n, err = q.SetNodeState(ctx, db.SetNodeStateParams{NodeID: id, State: c.to}); err != nil {
		return nil, err
	}
	var data any = struct {
		NodeID string `json:"nodeId"`
	}{id}
	if c.event == api.EventNodeCordoned {
		data = api.NodeCordonedPayload{NodeID: id, Reason: reason}
	}
	return Output(n, r.Owner), outbox.Write(ctx, tx, outbox.Event{Type: c.event, Subject: id, TenantID: r.Owner, Data: data})
}

// Cordon answers nodes.cordon.
func (s Service) Cordon(ctx context.Context, in *api.NodesCordonInput) (*api.Node, error) {
	return s.move(ctx, in.TenantID, in.NodeID, change{from: []string{StateReady}, to: StateCordoned, event: api.EventNodeCordoned}, in.Reason)
}

// Uncordon answers nodes.uncordon.
func (s Service) Uncordon(ctx context.Context, in *api.NodesUncordonInput) (*api.Node, error) {
	return s.move(ctx, in.TenantID, in.NodeID, change{from: []string{StateCordoned, StateDraining}, to: StateReady, event: api.EventNodeUncordoned}, nil)
}

// Drain answers nodes.drain.
func (s Service) Drain(ctx context.Context, in *api.NodesDrainInput) (*api.Node, error) {
	return s.move(ctx, in.TenantID, in.NodeID, change{from: []string{StateReady, StateCordoned}, to: StateDraining, event: api.EventNodeDraining}, nil)
}

// Retire answers nodes.retire.
func (s Service) Retire(ctx context.Context, in *api.NodesRetireInput) (*api.Node, error) {
	return s.move(ctx, in.TenantID, in.NodeID, change{
		from: []string{StateJoining, StateReady, StateCordoned, StateDraining, StateDown}, to: StateRetired, event: api.EventNodeRetired,
	}, nil)
}

// Label answers nodes.label.
func (Service) Label(ctx context.Context, in *api.NodesLabelInput) (*api.Node, error) {
	for _, k := range in.Remove {
		if _, ok := in.Set[k]; ok {
			return nil, api.Errorf(api.CodeInvalidInput, "remove: %s is also in set", k)
		}
	}
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := q.GetNodeForUpdate(ctx, in.NodeID)
	if r, err = store.Visible(r, err, r.Owner == in.TenantID, notFound(in.NodeID)); err != nil {
		return nil, err
	}
	if r.Node.State == StateRetired {
		return nil, api.Errorf(api.CodeInvalidState, "node %s is retired", in.NodeID)
	}
	labels := map[string]string{}
	_ = json.Unmarshal(r.Node.Labels, &labels)
	before := maps.Clone(labels)
	maps.Copy(labels, in.Set)
	for _, k := range in.Remove {
		delete(labels, k)
	}
	if len(labels) > MaxLabels {
		return nil, api.Errorf(api.CodeInvalidInput, "set: a node has at most %d labels", MaxLabels)
	}
	if maps.Equal(before, labels) {
		return Output(r.Node, r.Owner), nil
	}
	raw, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	n, err := q.SetNodeLabels(ctx, db.SetNodeLabelsParams{NodeID: in.NodeID, Labels: raw})
	if err != nil {
		return nil, err
	}
	return Output(n, r.Owner), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventNodeLabeled, Subject: in.NodeID, TenantID: r.Owner,
		Data: api.NodeLabeledPayload{NodeID: in.NodeID, Labels: labels},
	})
}
