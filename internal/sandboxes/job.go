package sandboxes

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/flavors"
	"computeplane/internal/ids"
	"computeplane/internal/images"
	"computeplane/internal/instances"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/placement"
	"computeplane/internal/store"
	"computeplane/internal/vmnet"
	"computeplane/internal/workers"
)

// JobName is the singleton job that keeps warm pools and ends expired
// sandboxes (the specification's vps.sandboxes reconciler).
const JobName = "sandboxes"

// JobEvery is how often it passes.
const JobEvery = time.Second

// WarmPerPass bounds the warm instances created per template per pass.
const WarmPerPass = 4

// expiredPerPass bounds the expired sandboxes ended per pass.
const expiredPerPass = 50

// Job is the sandboxes reconciler.
type Job struct {
	Service  *Service
	Store    *store.Store
	Notifier *notify.Notifier
	Log      *slog.Logger
}

// Periodic is the job: a pass every JobEvery, bounded to 20 s.
func (j *Job) Periodic() *workers.Periodic {
	return &workers.Periodic{Name: JobName, Interval: JobEvery, PassTimeout: 20 * time.Second, Pass: j.Pass, Log: j.Log}
}

// Pass ends expired sandboxes, then reconciles each template's warm pool,
// each in a transaction of its own fenced by the lease: one template that
// cannot be refilled (no capacity, no quota) is logged and retried on a
// later pass without holding back the others. It first asks, in one
// statement, whether there is anything to do: a pass runs every second on
// the claims' 2 cores, and one with nothing to do (the usual case) costs
// that round trip instead of a fenced transaction per template, each of
// which a claim could land beside.
func (j *Job) Pass(ctx context.Context, fence workers.Fence) error {
	due, err := j.Store.Queries().SandboxesJobDue(ctx)
	if err != nil {
		return err
	}
	if due.Expired {
		if err := j.tx(ctx, fence, j.expire); err != nil {
			return err
		}
	}
	if !due.Warm {
		return nil
	}
	var templates []db.SandboxTemplate
	if err := j.tx(ctx, fence, func(ctx context.Context, tx pgx.Tx) (err error) {
		templates, err = db.New(tx).WarmTemplates(ctx)
		return err
	}); err != nil {
		return err
	}
	for _, t := range templates {
		if err := j.tx(ctx, fence, func(ctx context.Context, tx pgx.Tx) error { return j.warm(ctx, tx, t) }); err != nil {
			if ctx.Err() != nil {
				return err
			}
			j.Log.Warn("warm pool not refilled; retried on a later pass", "template", t.TemplateID, "error", err.Error())
		}
	}
	return nil
}

// tx runs fn in a fenced transaction and wakes what it asked for after
// the commit (gateways of the nodes whose specs changed, event readers).
func (j *Job) tx(ctx context.Context, fence workers.Fence, fn func(context.Context, pgx.Tx) error) error {
	return workers.Tx(ctx, j.Store, j.Notifier, fence, fn)
}

// expire deletes the sandboxes whose TTL passed.
func (j *Job) expire(ctx context.Context, tx pgx.Tx) error {
	q := db.New(tx)
	rows, err := q.ExpiredSandboxes(ctx, expiredPerPass)
	if err != nil {
		return err
	}
	for _, r := range rows {
		vm, err := q.GetInstanceForUpdate(ctx, r.InstanceID)
		if err != nil {
			return err
		}
		snaps, err := q.UnkeptSnapshots(ctx, r.SandboxID)
		if err != nil {
			return err
		}
		if _, _, err := end(ctx, tx, j.Service.Placer, r, vm, snaps, "expired"); err != nil {
			return err
		}
	}
	return nil
}

// warm reconciles one template's warm pool: failed warm instances go (and
// are replaced), those beyond warm.max go newest first, and up to
// WarmPerPass are created towards warm.min. A deleted template loses them
// all.
func (j *Job) warm(ctx context.Context, tx pgx.Tx, t db.SandboxTemplate) error {
	q := db.New(tx)
	live, err := q.WarmInstances(ctx, pgtype.Text{String: t.TemplateID, Valid: true})
	if err != nil {
		return err
	}
	keep := int32(0)
	if !t.Deleted {
		keep = t.WarmMax
	}
	var healthy []db.Instance
	for _, w := range live {
		if w.State == instances.StateFailed {
			j.Log.Warn("a warm instance failed; replacing it", "template", t.TemplateID, "instance", w.InstanceID, "error", w.Error.String)
			if _, err := instances.End(ctx, tx, j.Service.Placer, w); err != nil {
				return err
			}
			continue
		}
		healthy = append(healthy, w)
	}
	for i := 0; i < len(healthy)-int(keep); i++ { // newest first
		if _, err := instances.End(ctx, tx, j.Service.Placer, healthy[i]); err != nil {
			return err
		}
	}
	if t.Deleted {
		return nil
	}
	for n := 0; n < min(WarmPerPass, int(t.WarmMin)-len(healthy)); n++ {
		if err := j.Service.makeWarm(ctx, tx, t); err != nil {
			return err
		}
	}
	return nil
}

// makeWarm places and charges one warm instance of t (owned by the
// template's author): it boots, takes an identity and pauses, ready to be
// claimed.
func (s *Service) makeWarm(ctx context.Context, tx pgx.Tx, t db.SandboxTemplate) error {
	q := db.New(tx)
	flavor, err := flavors.Get(ctx, q, t.TenantID, t.PoolID, t.Flavor)
	if err != nil {
		return err
	}
	if flavor.Archived {
		return api.Errorf(api.CodeInvalidState, "flavor %s is archived", t.Flavor)
	}
	im, err := s.Images.Get(ctx, t.ImageID)
	if errors.Is(err, images.ErrNotFound) {
		return api.Errorf(api.CodeNotFound, "image %s is no longer in the image source", t.ImageID)
	}
	if err != nil {
		return err
	}
	id := ids.New("inst")
	booking, err := s.Placer.Admit(ctx, tx, placement.Request{
		TenantID: t.TenantID, PoolID: t.PoolID, Owner: placement.Owner{Type: ResourceType, ID: id},
		Shape: placement.Shape{VCPU: int32(flavor.Vcpu), MemoryMiB: flavor.MemoryMiB, DiskGiB: flavor.DiskGiB},
		Count: map[string]int64{placement.ResourceSandboxes: 1}, Network: t.Network,
	})
	if err != nil {
		return err
	}
	hostname, machineID := identity("sbx_warm" + id[len("inst_"):])
	row, err := q.InsertSandboxInstance(ctx, db.InsertSandboxInstanceParams{
		InstanceID: id, TenantID: t.TenantID, PoolID: t.PoolID, NodeID: pgtype.Text{String: booking.NodeID, Valid: true},
		BookingID: pgtype.Text{String: booking.ID, Valid: true}, Flavor: t.Flavor, ImageID: t.ImageID, Boot: instances.BootOf(im),
		Name: hostname, UserData: t.UserData, Vcpu: int32(flavor.Vcpu), MemoryMib: flavor.MemoryMiB, DiskGib: flavor.DiskGiB,
		DesiredState: instances.StatePaused, CreatedBy: t.Owner, Kind: instances.KindWarm,
		TemplateID: pgtype.Text{String: t.TemplateID, Valid: true}, Hostname: pgtype.Text{String: hostname, Valid: true},
		MachineID: pgtype.Text{String: machineID, Valid: true}, Env: envOf(t),
	})
	if err != nil {
		return err
	}
	if row, err = vmnet.Assign(ctx, q, row, t.Network, t.EgressPolicy); err != nil {
		return err
	}
	return nodework.PushSpec(ctx, tx, row.NodeID.String)
}

func envOf(t db.SandboxTemplate) []byte {
	if len(t.Env) == 0 {
		b, _ := json.Marshal(map[string]string{})
		return b
	}
	return t.Env
}
