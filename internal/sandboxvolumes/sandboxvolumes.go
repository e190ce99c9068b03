// Package sandboxvolumes implements the sandboxVolumes group: persistent
// single-host disks. A volume is booked as diskGiB on one host of a hosted
// vps-host pool whose reported volume store can hold it, charged to the
// tenant's diskGiB quota, and carried in the host's spec; the daemon keeps
// it as a sparse raw file named by its serial, grows it as soon as the
// spec says so, and deletes it when the spec no longer holds it.
//
//	(none) -> ready -> deleting -> deleted (the host applied the spec)
package sandboxvolumes

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/nodework"
	"computeplane/internal/outbox"
	"computeplane/internal/placement"
	"computeplane/internal/pools"
	"computeplane/internal/store"
	"computeplane/internal/usage"
	"computeplane/internal/wire"
)

// States.
const (
	StateReady    = "ready"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
)

// ResourceType is the volume's type in the projection and its bookings'
// owner type.
const ResourceType = "sandbox-volume"

// Meter is the usage meter of volumes.
const Meter = "vps.volume.gib.hours"

const gib = int64(1) << 30

// Service implements api.SandboxVolumesService.
type Service struct {
	Placer *placement.Engine
}

var _ api.SandboxVolumesService = (*Service)(nil)

var createMethod = api.Lookup("/sandboxVolumes/create")

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "volume %s not found", id) }

func output(v db.SandboxVolume) *api.SandboxVolume {
	return &api.SandboxVolume{TenantID: v.TenantID, VolumeID: v.VolumeID, PoolID: v.PoolID, Name: v.Name, SizeGiB: v.SizeGib,
		Serial: v.Serial, NodeID: v.NodeID, State: v.State, CreatedAt: wire.Time(v.CreatedAt), UpdatedAt: wire.Time(v.UpdatedAt)}
}

// serialOf names a volume's disk: at most 20 characters (virtio-blk).
func serialOf(volumeID string) string {
	return "vol" + strings.TrimPrefix(volumeID, "vol_")[:17]
}

// noStorage is the refusal when no host's volume store has room.
func noStorage(free int64) error {
	return api.Errorf(api.CodeCapacityUnavailable, "no host of the pool has room for the volume in its volume store").
		WithDetails(map[string]any{"reason": "volume-storage", "freeGiB": max(free, 0) / gib})
}

// host picks the host with the most room that can hold bytes (node "" for
// any host of the pool); it returns the most room seen when none can.
func host(ctx context.Context, q *db.Queries, pool, node string, bytes int64) (string, int64, error) {
	rows, err := q.VolumeHosts(ctx, db.VolumeHostsParams{PoolID: pool, NodeID: pgtype.Text{String: node, Valid: node != ""}})
	if err != nil {
		return "", 0, err
	}
	var best int64
	for _, r := range rows {
		if r.FreeBytes >= bytes {
			return r.NodeID, r.FreeBytes, nil
		}
		best = max(best, r.FreeBytes)
	}
	return "", best, nil
}

// Create answers sandboxVolumes.create.
func (s *Service) Create(ctx context.Context, in *api.SandboxVolumesCreateInput) (*api.SandboxVolume, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	existing, err := q.GetSandboxVolume(ctx, k.ID)
	if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
		return nil, err
	} else if replay {
		return output(existing), nil
	}
	pool, err := pools.Readable(ctx, q, in.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	switch {
	case pool.Hosting != "hosted":
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: volumes live on hosted pools; %s is a provider pool", pool.PoolID)
	case pool.Class != "vps-host":
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: volumes live on vps-host pools; %s is a %s pool", pool.PoolID, pool.Class)
	case pool.Archived:
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: pool %s is archived", pool.PoolID)
	}
	taken, err := q.SandboxVolumeNameTaken(ctx, db.SandboxVolumeNameTakenParams{TenantID: in.TenantID, Name: in.Name})
	if err != nil {
		return nil, err
	}
	if taken {
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a volume named %s", in.TenantID, in.Name)
	}
	node, free, err := host(ctx, q, in.PoolID, "", in.SizeGiB*gib)
	if err != nil {
		return nil, err
	}
	if node == "" {
		return nil, noStorage(free)
	}
	if _, err := s.Placer.Admit(ctx, tx, placement.Request{TenantID: in.TenantID, PoolID: in.PoolID, NodeID: node,
		Owner: placement.Owner{Type: ResourceType, ID: k.ID}, Shape: placement.Shape{DiskGiB: in.SizeGiB}}); err != nil {
		return nil, err
	}
	v, err := q.InsertSandboxVolume(ctx, db.InsertSandboxVolumeParams{VolumeID: k.ID, TenantID: in.TenantID, PoolID: in.PoolID, NodeID: node,
		Name: in.Name, SizeGib: in.SizeGiB, Serial: serialOf(k.ID), CreatedBy: sess.Caller.IdentityID, IdemRequest: k.Fingerprint})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "name: a concurrent create took the name %s or the key; retry", in.Name)
	}
	if err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, nil); err != nil {
		return nil, err
	}
	if err := meter(ctx, tx, v); err != nil {
		return nil, err
	}
	if err := nodework.PushSpec(ctx, tx, node); err != nil {
		return nil, err
	}
	return output(v), outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxVolumeCreated, Subject: k.ID, TenantID: in.TenantID,
		Data: api.SandboxVolumeCreatedPayload{VolumeID: k.ID, PoolID: in.PoolID, Name: in.Name, SizeGiB: in.SizeGiB, NodeID: node}})
}

// meter (re)opens the volume's usage at its current size.
func meter(ctx context.Context, tx pgx.Tx, v db.SandboxVolume) error {
	owner := usage.Owner{Type: ResourceType, ID: v.VolumeID}
	if err := usage.CloseOwner(ctx, tx, owner, time.Time{}); err != nil {
		return err
	}
	_, err := usage.Open(ctx, tx, usage.Allocation{TenantID: v.TenantID, Meter: Meter, PerHour: v.SizeGib * 1_000_000, Owner: owner,
		Tags: map[string]string{"poolId": v.PoolID}})
	return err
}

func load(ctx context.Context, q *db.Queries, tenant, id string) (db.SandboxVolume, error) {
	v, err := q.GetSandboxVolume(ctx, id)
	return store.Visible(v, err, v.TenantID == tenant, notFound(id))
}

// Get answers sandboxVolumes.get.
func (s *Service) Get(ctx context.Context, in *api.SandboxVolumesGetInput) (*api.SandboxVolume, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	v, err := load(ctx, q, in.TenantID, in.VolumeID)
	if err != nil {
		return nil, err
	}
	return output(v), nil
}

// List answers sandboxVolumes.list.
func (s *Service) List(ctx context.Context, in *api.SandboxVolumesListInput) (*api.SandboxVolumeList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p := db.ListSandboxVolumesParams{TenantID: in.TenantID, IncludeDeleted: in.IncludeDeleted}
	if in.Scope != "all" {
		p.CreatedBy = pgtype.Text{String: sess.Caller.IdentityID, Valid: true}
	}
	if in.PoolID != nil {
		p.PoolID = pgtype.Text{String: *in.PoolID, Valid: true}
	}
	rows, err := q.ListSandboxVolumes(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &api.SandboxVolumeList{Items: make([]api.SandboxVolume, 0, len(rows))}
	for _, v := range rows {
		out.Items = append(out.Items, *output(v))
	}
	return out, nil
}

// Resize answers sandboxVolumes.resize: one resize per volume at a time.
// Resizes take a lock of their own without waiting (one in flight holds
// it), then wait for the volume's row: a delete or a status report holding
// the row is no resize in flight, and the state it leaves decides.
func (s *Service) Resize(ctx context.Context, in *api.SandboxVolumesResizeInput) (*api.SandboxVolume, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	v, err := q.GetSandboxVolume(ctx, in.VolumeID)
	if v, err = store.Visible(v, err, v.TenantID == in.TenantID, notFound(in.VolumeID)); err != nil {
		return nil, err
	}
	if free, err := q.TryVolumeResizeLock(ctx, v.VolumeID); err != nil {
		return nil, err
	} else if !free {
		return nil, api.Errorf(api.CodeConflict, "volume %s: another resize is in flight; retry", in.VolumeID).
			WithDetails(map[string]any{"reason": "resize-in-flight"})
	}
	if v, err = q.GetSandboxVolumeForUpdate(ctx, v.VolumeID); err != nil {
		return nil, err
	}
	switch {
	case in.SizeGiB < v.SizeGib:
		return nil, api.Errorf(api.CodeInvalidInput, "sizeGiB: a volume never shrinks (it is %d GiB)", v.SizeGib)
	case in.SizeGiB == v.SizeGib:
		return output(v), nil
	case v.State != StateReady:
		return nil, api.Errorf(api.CodeInvalidState, "volume %s is %s; only a ready volume grows", v.VolumeID, v.State).
			WithDetails(map[string]any{"state": v.State})
	}
	growth := in.SizeGiB - v.SizeGib
	node, free, err := host(ctx, q, v.PoolID, v.NodeID, growth*gib)
	if err != nil {
		return nil, err
	}
	if node == "" {
		return nil, noStorage(free)
	}
	if _, err := s.Placer.Admit(ctx, tx, placement.Request{TenantID: v.TenantID, PoolID: v.PoolID, NodeID: v.NodeID,
		Owner: placement.Owner{Type: ResourceType, ID: v.VolumeID}, Shape: placement.Shape{DiskGiB: growth}}); err != nil {
		return nil, err // nothing changes: the transaction rolls the charge back
	}
	previous := v.SizeGib
	if v, err = q.SetSandboxVolumeSize(ctx, db.SetSandboxVolumeSizeParams{VolumeID: v.VolumeID, SizeGib: in.SizeGiB}); err != nil {
		return nil, err
	}
	if err := meter(ctx, tx, v); err != nil {
		return nil, err
	}
	if err := nodework.PushSpec(ctx, tx, v.NodeID); err != nil {
		return nil, err
	}
	return output(v), outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxVolumeResized, Subject: v.VolumeID, TenantID: v.TenantID,
		Data: api.SandboxVolumeResizedPayload{VolumeID: v.VolumeID, NodeID: v.NodeID, SizeGiB: v.SizeGib, PreviousSizeGiB: previous}})
}

// Delete answers sandboxVolumes.delete: out of the host's spec now,
// deleted (booking and quota back) when the host applied it. CONFLICT
// while a live template mounts it or a sandbox not deleted attaches it.
func (s *Service) Delete(ctx context.Context, in *api.SandboxVolumesDeleteInput) (*api.SandboxVolume, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	v, err := q.GetSandboxVolumeForUpdate(ctx, in.VolumeID)
	if v, err = store.Visible(v, err, v.TenantID == in.TenantID, notFound(in.VolumeID)); err != nil {
		return nil, err
	}
	if v.State != StateReady {
		return output(v), nil
	}
	named, err := q.VolumeInTemplates(ctx, v.VolumeID)
	if err != nil {
		return nil, err
	}
	if named {
		return nil, api.Errorf(api.CodeConflict, "volume %s is mounted by a live template; change or delete the template first", v.VolumeID).
			WithDetails(map[string]any{"reason": "volume-in-use"})
	}
	attached, err := q.VolumeAttached(ctx, v.VolumeID)
	if err != nil {
		return nil, err
	}
	if attached {
		return nil, api.Errorf(api.CodeConflict, "volume %s is attached by a sandbox that is not deleted; delete the sandbox first", v.VolumeID).
			WithDetails(map[string]any{"reason": "volume-in-use"})
	}
	if v, err = q.SetSandboxVolumeState(ctx, db.SetSandboxVolumeStateParams{VolumeID: v.VolumeID, State: StateDeleting}); err != nil {
		return nil, err
	}
	if err := nodework.PushSpec(ctx, tx, v.NodeID); err != nil {
		return nil, err
	}
	return output(v), outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxVolumeDeleting, Subject: v.VolumeID, TenantID: v.TenantID,
		Data: api.SandboxVolumeDeletingPayload{VolumeID: v.VolumeID, PoolID: v.PoolID, NodeID: v.NodeID}})
}

// RegisterStatus makes reg follow the volumes daemons report (QueueStatus).
func RegisterStatus(reg *nodework.Registry, placer *placement.Engine) {
	reg.RegisterVolumes(func(ctx context.Context, p *store.Pipeline, node string, reported []agentproto.VolumeStatus) func(context.Context, pgx.Tx) (bool, error) {
		return QueueStatus(ctx, p, placer, node, reported)
	})
}

// QueueStatus finishes the deleting volumes of a node its daemon no
// longer holds: the statement that finds them (and marks them deleted)
// goes in p; then, once it answered, gives their bookings and quota back,
// closes their usage and writes sandbox.volume.deleted. A status without a
// volume list changes nothing (then is nil).
func QueueStatus(ctx context.Context, p *store.Pipeline, placer *placement.Engine, node string, reported []agentproto.VolumeStatus) (then func(context.Context, pgx.Tx) (bool, error)) {
	if reported == nil {
		return nil
	}
	serials := make([]string, 0, len(reported))
	for _, r := range reported {
		serials = append(serials, r.Serial)
	}
	var gone []db.SandboxVolume
	var goneErr error
	p.Queue(func(q *db.Queries) {
		gone, goneErr = q.GoneVolumes(ctx, db.GoneVolumesParams{NodeID: node, Reported: serials})
	})
	return func(ctx context.Context, tx pgx.Tx) (bool, error) {
		if goneErr != nil {
			return false, goneErr
		}
		return finishGone(ctx, tx, placer, gone)
	}
}

// finishGone finishes the volumes the daemon no longer holds.
func finishGone(ctx context.Context, tx pgx.Tx, placer *placement.Engine, gone []db.SandboxVolume) (bool, error) {
	q := db.New(tx)
	for _, v := range gone {
		bookings, err := q.VolumeBookings(ctx, v.VolumeID)
		if err != nil {
			return false, err
		}
		for _, b := range bookings {
			if err := placer.Release(ctx, tx, b, nil); err != nil {
				return false, err
			}
		}
		if err := usage.CloseOwner(ctx, tx, usage.Owner{Type: ResourceType, ID: v.VolumeID}, time.Time{}); err != nil {
			return false, err
		}
		if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxVolumeDeleted, Subject: v.VolumeID, TenantID: v.TenantID,
			Data: api.SandboxVolumeDeletedPayload{VolumeID: v.VolumeID, PoolID: v.PoolID, NodeID: v.NodeID, SizeGiB: v.SizeGib}}); err != nil {
			return false, err
		}
	}
	return len(gone) > 0, nil
}
