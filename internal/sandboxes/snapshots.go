package sandboxes

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Snapshot states.
const (
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed"
	SnapshotDeleted  = "deleted"
)

// SnapshotResourceType is a snapshot's type in the authorization
// projection (under its sandbox, owned by who took it).
const SnapshotResourceType = "sandbox-snapshot"

// SnapshotTTL bounds how long a snapshot command may wait for its node.
const SnapshotTTL = 5 * time.Minute

// Snapshots implements api.SandboxSnapshotsService: snapshots are taken
// and deleted on the sandbox's node by signed commands; the command's
// result (applySnapshotResult, registered in nodework) makes a snapshot
// ready or failed.
type Snapshots struct{ S *Service }

var snapshotCreate = api.Lookup("/sandboxSnapshots/create")

func snapshotNotFound(id string) error {
	return api.Errorf(api.CodeNotFound, "snapshot %s not found", id)
}

func snapshotOutput(r db.SandboxSnapshot, sbx db.Sandbox) *api.SandboxSnapshot {
	o := &api.SandboxSnapshot{SnapshotID: r.SnapshotID, TenantID: r.TenantID, SandboxID: r.SandboxID, TemplateID: sbx.TemplateID,
		PoolID: sbx.PoolID, NodeID: r.NodeID, Keep: r.Keep, State: r.State, CreatedAt: wire.Time(r.CreatedAt)}
	if r.Error.Valid {
		o.Error = &r.Error.String
	}
	if r.SizeBytes.Valid {
		o.SizeBytes = &r.SizeBytes.Int64
	}
	if r.PausedMs.Valid {
		o.PausedMs = &r.PausedMs.Int64
	}
	if r.ReadyAt != nil {
		t := wire.Time(*r.ReadyAt)
		o.ReadyAt = &t
	}
	if r.DeletedAt != nil {
		t := wire.Time(*r.DeletedAt)
		o.DeletedAt = &t
	}
	return o
}

func (s Snapshots) output(ctx context.Context, q *db.Queries, r db.SandboxSnapshot) (*api.SandboxSnapshot, error) {
	sbx, err := q.GetSandbox(ctx, r.SandboxID)
	if err != nil {
		return nil, err
	}
	return snapshotOutput(r, sbx), nil
}

// Create answers sandboxSnapshots.create.
func (s Snapshots) Create(ctx context.Context, in *api.SandboxSnapshotsCreateInput) (*api.SandboxSnapshot, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(snapshotCreate, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	existing, err := q.GetSnapshot(ctx, k.ID)
	if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
		return nil, err
	} else if replay {
		return s.waited(ctx, q, existing, in.Wait)
	}
	id, fp := k.ID, k.Fingerprint
	sbx, vm, err := lock(ctx, tx, in.TenantID, in.SandboxID, nil)
	if err != nil {
		return nil, err
	}
	if st := state(sbx, vm); st != StateRunning && st != StatePaused {
		return nil, api.Errorf(api.CodeInvalidState, "sandbox %s is %s; only a running or paused one is snapshotted", sbx.SandboxID, st).
			WithDetails(map[string]any{"state": st})
	}
	// A guest's memory holds its volumes' filesystems mounted (caches,
	// journal): restored later, it would meet the volumes as they are by
	// then, written since by other sandboxes, or attached elsewhere.
	atts, err := q.SandboxAttachments(ctx, sbx.SandboxID)
	if err != nil {
		return nil, err
	}
	if len(atts) > 0 {
		return nil, api.Errorf(api.CodeInvalidState, "sandbox %s has volumes attached (%s first); a memory snapshot of it could not be restored consistently",
			sbx.SandboxID, atts[0].VolumeID).WithDetails(map[string]any{"reason": "volumes-attached", "volumeId": atts[0].VolumeID})
	}
	args, _ := json.Marshal(agentproto.SnapshotArgs{InstanceID: vm.InstanceID, SnapshotID: id})
	cmd, topic, err := nodework.EnqueueCommand(ctx, tx, sbx.NodeID, agentproto.CommandSnapshot, args, "sandboxes", SnapshotTTL, time.Now())
	if err != nil {
		return nil, err
	}
	notify.Later(ctx, topic)
	r, err := q.InsertSnapshot(ctx, db.InsertSnapshotParams{SnapshotID: id, TenantID: in.TenantID, SandboxID: sbx.SandboxID,
		NodeID: sbx.NodeID, Keep: in.Keep, CommandID: cmd.CommandID, CreatedBy: sess.Caller.IdentityID, IdemRequest: fp})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "idempotencyKey: a concurrent create with this key is in progress; retry")
	}
	if err != nil {
		return nil, err
	}
	if err := sess.Projection().Put(ctx, tx, iam.Resource{Type: sess.TypePrefix() + SnapshotResourceType, ID: id, TenantID: in.TenantID,
		Parent: &iam.Ref{Type: sess.TypePrefix() + ResourceType, ID: sbx.SandboxID}, Owner: sess.Caller.IdentityID}); err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxSnapshotCreated, Subject: id, TenantID: in.TenantID,
		Data: api.SandboxSnapshotCreatedPayload{SnapshotID: id, SandboxID: sbx.SandboxID, Keep: in.Keep}}); err != nil {
		return nil, err
	}
	return s.waited(ctx, q, r, in.Wait)
}

func (s Snapshots) waited(ctx context.Context, q *db.Queries, r db.SandboxSnapshot, wait *api.Wait) (*api.SandboxSnapshot, error) {
	out, err := s.output(ctx, q, r)
	if err != nil || wait == nil || wait.TimeoutMs == 0 || r.State != SnapshotCreating {
		return out, err
	}
	id := r.SnapshotID
	rpc.ThenPoll(ctx, rpc.Poll{Timeout: time.Duration(wait.TimeoutMs) * time.Millisecond, Topic: nodework.ResultTopic(r.CommandID), Initial: out}, func(ctx context.Context) (any, bool, error) {
		q := db.New(s.S.Store.Pool())
		r, err := q.GetSnapshot(ctx, id)
		if err != nil {
			return nil, false, nil
		}
		o, err := s.output(ctx, q, r)
		if err != nil {
			return nil, false, nil
		}
		return o, r.State != SnapshotCreating, nil
	})
	return out, nil
}

// Get answers sandboxSnapshots.get.
func (s Snapshots) Get(ctx context.Context, in *api.SandboxSnapshotsGetInput) (*api.SandboxSnapshot, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := q.GetSnapshot(ctx, in.SnapshotID)
	if r, err = store.Visible(r, err, r.TenantID == in.TenantID, snapshotNotFound(in.SnapshotID)); err != nil {
		return nil, err
	}
	return s.output(ctx, q, r)
}

// List answers sandboxSnapshots.list.
func (s Snapshots) List(ctx context.Context, in *api.SandboxSnapshotsListInput) (*api.SandboxSnapshotList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var sbx pgtype.Text
	if in.SandboxID != nil {
		sbx = pgtype.Text{String: *in.SandboxID, Valid: true}
	}
	rows, err := q.ListSnapshots(ctx, db.ListSnapshotsParams{TenantID: in.TenantID, SandboxID: sbx, IncludeDeleted: in.IncludeDeleted})
	if err != nil {
		return nil, err
	}
	out := &api.SandboxSnapshotList{Items: make([]api.SandboxSnapshot, 0, len(rows))}
	for _, r := range rows {
		o, err := s.output(ctx, q, r)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, *o)
	}
	return out, nil
}

// Delete answers sandboxSnapshots.delete.
func (s Snapshots) Delete(ctx context.Context, in *api.SandboxSnapshotsDeleteInput) (*api.SandboxSnapshot, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := q.GetSnapshotForUpdate(ctx, in.SnapshotID)
	if r, err = store.Visible(r, err, r.TenantID == in.TenantID, snapshotNotFound(in.SnapshotID)); err != nil {
		return nil, err
	}
	if r.State != SnapshotDeleted {
		if r, err = deleteSnapshot(ctx, tx, r); err != nil {
			return nil, err
		}
	}
	return s.output(ctx, q, r)
}

// deleteSnapshot marks a snapshot deleted and asks its node to remove its
// files (the command is re-sent until the node answers).
func deleteSnapshot(ctx context.Context, tx pgx.Tx, r db.SandboxSnapshot) (db.SandboxSnapshot, error) {
	r, err := db.New(tx).DeleteSnapshotRow(ctx, r.SnapshotID)
	if err != nil {
		return r, err
	}
	args, _ := json.Marshal(agentproto.SnapshotArgs{SnapshotID: r.SnapshotID})
	_, topic, err := nodework.EnqueueCommand(ctx, tx, r.NodeID, agentproto.CommandDeleteSnapshot, args, "sandboxes", 24*time.Hour, time.Now())
	if err != nil {
		return r, err
	}
	notify.Later(ctx, topic)
	return r, outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxSnapshotDeleted, Subject: r.SnapshotID, TenantID: r.TenantID,
		Data: api.SandboxSnapshotDeletedPayload{SnapshotID: r.SnapshotID}})
}

// RegisterResults makes reg follow the results of snapshot commands.
func RegisterResults(reg *nodework.Registry) {
	reg.RegisterResult(agentproto.CommandSnapshot, applySnapshotResult)
}

// applySnapshotResult makes a snapshot command's snapshot ready (with its
// size) or failed, in the result's transaction.
func applySnapshotResult(ctx context.Context, tx pgx.Tx, _ string, r *agentproto.Result) (bool, error) {
	q := db.New(tx)
	p := db.FinishSnapshotParams{CommandID: r.ID, State: SnapshotFailed, Error: pgtype.Text{String: r.Error, Valid: !r.OK}}
	if r.OK {
		var out agentproto.SnapshotOutput
		if err := json.Unmarshal(r.Output, &out); err != nil {
			p.Error = pgtype.Text{String: "the node's answer: " + err.Error(), Valid: true}
		} else {
			p.State = SnapshotReady
			p.SizeBytes = pgtype.Int8{Int64: out.SizeBytes, Valid: true}
			p.PausedMs = pgtype.Int8{Int64: out.PausedMs, Valid: true}
		}
	}
	_, err := q.FinishSnapshot(ctx, p)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // a command of no snapshot (deleted meanwhile)
	}
	return false, err
}
