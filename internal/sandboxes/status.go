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
	"computeplane/internal/outbox"
)

// RegisterStatus makes reg follow sandboxes' VMs (warm instances publish
// nothing, so they need no handler).
func RegisterStatus(reg *nodework.Registry) { reg.Register(instances.KindSandbox, applyStatus) }

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
	return true, outbox.Write(ctx, tx, e)
}
