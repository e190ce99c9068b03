package sandboxes

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/instances"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
)

// RegisterStatus makes reg follow sandboxes' VMs (warm instances publish
// nothing, so they need no handler).
func RegisterStatus(reg *nodework.Registry) {
	reg.Register(instances.KindSandbox, applyStatus)
	reg.RegisterQueue(instances.KindSandbox, queueStatus)
}

// queueStatus sends, in the status's first round trip, the ready write of
// the sandboxes whose VMs the status reports running for the first time
// (a claim's or a boot's "running": the sandbox's ready_at); the handler
// it returns writes their events from its answer, and follows any other
// sandbox as applyStatus does.
func queueStatus(ctx context.Context, p *store.Pipeline, node string, running []string) nodework.StatusHandler {
	var ready []db.Sandbox
	var readyErr error
	p.Queue(func(q *db.Queries) {
		ready, readyErr = q.SandboxesReadyOfStatus(ctx, db.SandboxesReadyOfStatusParams{InstanceIds: running, NodeID: node})
	})
	return func(ctx context.Context, tx pgx.Tx, node string, r db.Instance, reported agentproto.InstanceStatus) (bool, error) {
		if readyErr != nil {
			return false, readyErr
		}
		if r.State == instances.StateRunning {
			for _, sbx := range ready {
				if sbx.InstanceID == r.InstanceID {
					e := outbox.Event{Type: api.EventSandboxRunning, Data: api.SandboxRunningPayload{SandboxID: sbx.SandboxID, NodeID: sbx.NodeID},
						Subject: sbx.SandboxID, TenantID: sbx.TenantID}
					offer(ctx, tx, sbx, r)
					return true, outbox.Write(ctx, tx, e)
				}
			}
		}
		return applyStatus(ctx, tx, node, r, reported)
	}
}

// applyStatus follows a sandbox's VM: the sandbox is running once the VM
// runs with the identity it was given (its first time sets readyAt),
// failed when the VM failed.
func applyStatus(ctx context.Context, tx pgx.Tx, _ string, r db.Instance, _ agentproto.InstanceStatus) (bool, error) {
	q := db.New(tx)
	// One statement per status that moves the sandbox, none for one that
	// does not (a claimed VM starting).
	var sbx db.Sandbox
	var err error
	var e outbox.Event
	switch {
	case r.State == instances.StateRunning && r.DesiredState == instances.StateRunning && r.ReportedIdentity == r.IdentityGeneration:
		if r.IdentityReadyAt != nil {
			sbx, err = q.SandboxReady(ctx, db.SandboxReadyParams{InstanceID: r.InstanceID, At: r.IdentityReadyAt})
		} else {
			sbx, err = q.SandboxOfInstance(ctx, r.InstanceID)
		}
		e = outbox.Event{Type: api.EventSandboxRunning, Data: api.SandboxRunningPayload{SandboxID: sbx.SandboxID, NodeID: sbx.NodeID}}
	case r.State == instances.StateFailed:
		sbx, err = q.SandboxOfInstance(ctx, r.InstanceID)
		e = outbox.Event{Type: api.EventSandboxFailed, Data: api.SandboxFailedPayload{SandboxID: sbx.SandboxID, Error: r.Error.String}}
	default:
		return false, nil
	}
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && sbx.DeletedAt != nil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	e.Subject, e.TenantID = sbx.SandboxID, sbx.TenantID
	offer(ctx, tx, sbx, r)
	return true, outbox.Write(ctx, tx, e)
}

// moved is a sandbox and its VM as a status's transaction wrote them.
type moved struct {
	sbx db.Sandbox
	vm  db.Instance
}

// offer hands the moved sandbox, once the status committed, to the calls
// of this process waiting on its VM (waited): they answer from it without
// a re-read. A VM that mounts volumes is not offered (its answer reads
// the attachments); a wait in another process re-reads at the wake.
func offer(ctx context.Context, tx pgx.Tx, sbx db.Sandbox, vm db.Instance) {
	if len(vm.Volumes) == 0 {
		notify.OfferLater(ctx, tx, nodework.InstanceTopic(vm.InstanceID), moved{sbx, vm})
	}
}
