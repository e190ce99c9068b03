// Package instances implements the instances group: VPS virtual machines
// of a flavor and an image, placed and charged at creation through the
// placement engine, carried to their node's daemon in its desired spec
// (nodework.PushSpec) and run by its VM runtime; the daemon's reports move
// their state (nodework.Registry, RegisterStatus).
//
//	desiredState: running <-> stopped, running <-> paused, any -> deleted
//	state: pending -> starting -> running | failed; stopped; paused; deleted
package instances

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/flavors"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/images"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/placement"
	"computeplane/internal/rpc"
	"computeplane/internal/secrets"
	"computeplane/internal/store"
	"computeplane/internal/usage"
	"computeplane/internal/vmnet"
	"computeplane/internal/wire"
)

// States.
const (
	StatePending  = "pending"
	StateStarting = "starting"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StatePaused   = "paused"
	StateFailed   = "failed"
	StateDeleted  = "deleted"
)

// Kinds of instances rows.
const (
	KindVPS     = "vps"     // an instance of this group
	KindWarm    = "warm"    // a sandbox template's warm instance
	KindSandbox = "sandbox" // a sandbox's VM
)

// ResourceType is the instance's type in the authorization projection.
const ResourceType = "instance"

// Service implements api.InstancesService.
type Service struct {
	Placer *placement.Engine
	Images images.Source
	Store  *store.Store // the waits re-read through it
	// Providers checks that a provider pool's account can launch
	// instances (provideraccounts); nil refuses provider pools.
	Providers Launchers
}

// Launchers answers whether the provider account of a provider pool can
// launch instances: nil, or the error to answer (UNSUPPORTED when its
// provider cannot, NOT_FOUND or INVALID_CONFIG when the account is gone or
// its provider no longer registered).
type Launchers interface {
	CheckLaunch(ctx context.Context, q *db.Queries, accountID string) error
}

// Provider reports whether r is an instance of a provider pool: it has no
// node and runs in no reservation (hosted ones are placed at creation).
func Provider(r db.Instance) bool {
	return r.Kind == KindVPS && !r.NodeID.Valid && !r.ReservationID.Valid
}

// ProviderCharge is what an instance of a provider pool is charged: its
// shape and one instance, with no node booking.
func ProviderCharge(r db.Instance) map[string]int64 {
	return map[string]int64{placement.ResourceVCPU: int64(r.Vcpu), placement.ResourceMemoryMiB: r.MemoryMib,
		placement.ResourceDiskGiB: r.DiskGib, placement.ResourceInstances: 1}
}

var _ api.InstancesService = (*Service)(nil)

var createMethod = api.Lookup("/instances/create")

// BootOf is what an instance keeps of its image (resolved at creation,
// so a later change in the image source never changes it).
func BootOf(im *images.Image) []byte {
	b, _ := json.Marshal(agentproto.Boot{Format: im.Format, Location: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline, SHA256: im.SHA256})
	return b
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "instance %s not found", id) }

func output(r db.Instance) *api.Instance {
	o := &api.Instance{
		InstanceID: r.InstanceID, TenantID: r.TenantID, PoolID: r.PoolID, Flavor: r.Flavor, ImageID: r.ImageID, Name: r.Name,
		DesiredState: r.DesiredState, State: r.State, HasUserData: r.UserData.Valid,
		Vcpu: int64(r.Vcpu), MemoryMiB: r.MemoryMib, DiskGiB: r.DiskGib, Reboots: int64(r.Reboots), Version: r.Version,
		CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt), Conditions: conditions(r),
	}
	o.Network, o.Address, o.Mac, o.Egress = vmnet.Output(r)
	if r.NodeID.Valid {
		o.NodeID = &r.NodeID.String
	}
	if r.ProviderMachine.Valid {
		o.MachineID = &r.ProviderMachine.String
	}
	if r.ReservationID.Valid {
		o.ReservationID = &r.ReservationID.String
	}
	if r.Error.Valid {
		o.Error = &r.Error.String
	}
	if r.ReadyAt != nil {
		t := wire.Time(*r.ReadyAt)
		o.ReadyAt = &t
	}
	return o
}

// conditions say where the instance stands against what was asked.
func conditions(r db.Instance) []api.InstanceCondition {
	converged := r.State == r.DesiredState
	reason, msg := "Converged", "the instance is "+r.State
	if !converged {
		reason, msg = "Pending", fmt.Sprintf("the instance is %s; %s was asked", r.State, r.DesiredState)
		if r.State == StateFailed {
			reason, msg = "Failed", r.Error.String
		}
	}
	return []api.InstanceCondition{
		{Type: "Converged", Status: converged, Reason: reason, Message: msg},
		{Type: "Ready", Status: r.State == StateRunning, Reason: map[bool]string{true: "GuestAnswered", false: "NotRunning"}[r.State == StateRunning],
			Message: map[bool]string{true: "the guest agent answered", false: "the instance is not running"}[r.State == StateRunning]},
	}
}

// Create answers instances.create.
func (s *Service) Create(ctx context.Context, in *api.InstancesCreateInput) (*api.Instance, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	// What exists under the key, and the pool with its flavor, in one
	// round trip (with BEGIN).
	var p store.Pipeline
	var existing db.Instance
	var existingErr error
	p.Queue(func(q *db.Queries) { existing, existingErr = q.GetInstance(ctx, k.ID) })
	poolRead := flavors.QueueInPool(ctx, &p, in.TenantID, in.PoolID, in.Flavor)
	// The placement's candidates for the flavor too, unless the instance
	// runs in a reservation's unit (read for nothing when the pool turns
	// out to be a provider's or not the caller's: it has no node to offer).
	var candidates *placement.Candidates
	var unit *unitReads
	if in.ReservationID != nil {
		unit = queueUnit(ctx, &p, *in.ReservationID)
	} else {
		mode := in.Network
		if mode == "" {
			mode = vmnet.Egress
		}
		candidates = s.Placer.QueueCandidates(ctx, &p, in.PoolID, in.Flavor, mode)
	}
	if err := p.Send(ctx, tx); err != nil {
		return nil, err
	}
	if replay, err := k.Replay(existing.IdemRequest, existingErr); err != nil {
		return nil, err
	} else if replay {
		return s.waited(ctx, existing, in.Wait, StateRunning)
	}
	id, fp := k.ID, k.Fingerprint
	pool, flavor, _, err := poolRead.Result(ctx, q)
	if err != nil {
		return nil, err
	}
	switch {
	case pool.Archived:
		return nil, api.Errorf(api.CodeInvalidState, "pool %s is archived", pool.PoolID)
	case pool.Class != "vps-host":
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: pool %s is a %s pool; instances run in vps-host pools", pool.PoolID, pool.Class)
	case pool.Hosting == "provider" && s.Providers == nil:
		return nil, api.Errorf(api.CodeUnsupported, "poolId: this service runs no instances in provider pools")
	case pool.Hosting == "provider" && in.ReservationID != nil:
		return nil, api.Errorf(api.CodeInvalidInput, "reservationId: pool %s is a provider pool; reservations hold hosted capacity", pool.PoolID)
	case pool.Hosting == "provider":
		if err := s.Providers.CheckLaunch(ctx, q, pool.AccountID.String); err != nil {
			return nil, err
		}
	}
	if flavor == nil {
		return nil, flavors.NotFound(in.PoolID, in.Flavor)
	}
	if flavor.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "flavor: %s is archived", in.Flavor)
	}
	im, err := s.Images.Get(ctx, in.ImageID)
	if errors.Is(err, images.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "imageId: image %s not found", in.ImageID)
	}
	if err != nil {
		return nil, err
	}
	runtime := pool.Runtime.String
	if runtime == "" {
		runtime = "qemu"
	}
	if pool.Hosting != "provider" && !images.Boots(runtime, im.Format) { // a provider boots what it can
		return nil, api.Errorf(api.CodeInvalidInput, "imageId: the pool's runtime %s does not boot %s images", runtime, im.Format)
	}
	network, policy, err := networkOf(in, pool.Hosting == "provider")
	if err != nil {
		return nil, err
	}
	// Other URIs are the user's business: a script may fetch what it likes.
	if err := secrets.CheckUserData(ctx, q, in.TenantID, in.UserData, false); err != nil {
		return nil, err
	}
	var userData pgtype.Text
	if in.UserData != nil {
		userData = pgtype.Text{String: *in.UserData, Valid: true}
	}
	boot := BootOf(im)
	if pool.Hosting == "provider" {
		return s.createOnProvider(ctx, tx, q, sess, in, id, fp, flavor, boot, userData)
	}
	shape := placement.Shape{VCPU: int32(flavor.Vcpu), MemoryMiB: flavor.MemoryMiB, DiskGiB: flavor.DiskGiB}
	if flavor.Gpus != nil {
		shape.GPUs, shape.GPUModel = int32(flavor.Gpus.Count), flavor.Gpus.Model
	}
	var row db.Instance
	var insertErr error
	var spec *nodework.SpecReads
	var inReservation *reservationUnit
	// The insert, and when the row needs no network of its own the node's
	// spec reads after it, in the pipeline of the booking and charges.
	queueInsert := func(p *store.Pipeline, b *placement.Booking) {
		params := db.InsertInstanceParams{
			InstanceID: id, TenantID: in.TenantID, PoolID: in.PoolID, NodeID: pgtype.Text{String: b.NodeID, Valid: true},
			BookingID: pgtype.Text{String: b.ID, Valid: b.ID != ""}, Flavor: in.Flavor, ImageID: in.ImageID, Boot: boot, Name: in.Name,
			UserData: userData, Vcpu: int32(flavor.Vcpu), MemoryMib: flavor.MemoryMiB, DiskGib: flavor.DiskGiB,
			CreatedBy: sess.Caller.IdentityID, IdemRequest: fp,
		}
		if inReservation != nil {
			params.ReservationID = pgtype.Text{String: *in.ReservationID, Valid: true}
			params.ReservationBookingID = pgtype.Text{String: inReservation.booking, Valid: true}
		}
		p.Queue(func(q *db.Queries) { row, insertErr = q.InsertInstance(ctx, params) })
		spec = nil
		if !vmnet.Assigns(network, policy) {
			spec = nodework.QueueSpec(ctx, p, b.NodeID)
		}
	}
	var booking *placement.Booking
	if in.ReservationID != nil {
		if inReservation, err = unit.take(in, shape); err != nil {
			return nil, err
		}
		if err := placement.CheckNodeNetwork(ctx, q, inReservation.node, network); err != nil {
			return nil, err
		}
		booking = &placement.Booking{NodeID: inReservation.node}
		// The instances quota's charge with the insert: a refusal rolls
		// it all back.
		charged := s.Placer.QueueChargeCount(ctx, &p, tx, in.TenantID, in.PoolID, map[string]int64{placement.ResourceInstances: 1})
		queueInsert(&p, booking)
		err = p.Send(ctx, tx)
		if err := charged(err); err != nil {
			return nil, err
		}
	} else {
		booking, err = s.Placer.AdmitPipelined(ctx, tx, placement.Request{
			TenantID: in.TenantID, PoolID: in.PoolID, Owner: placement.Owner{Type: ResourceType, ID: id}, Shape: shape,
			Count: map[string]int64{placement.ResourceInstances: 1}, Network: network,
		}, candidates, queueInsert)
		if booking == nil {
			return nil, err // refused: nothing of queueInsert's ran
		}
	}
	if errors.Is(insertErr, pgx.ErrNoRows) {
		// A concurrent call with the same key won: answer as its retry.
		return nil, api.Errorf(api.CodeConflict, "idempotencyKey: a concurrent create with this key is in progress; retry")
	}
	if insertErr != nil {
		return nil, insertErr
	}
	if err != nil {
		return nil, err
	}
	if row, err = vmnet.Assign(ctx, q, row, network, policy); err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, map[string]string{"poolId": in.PoolID}); err != nil {
		return nil, err
	}
	if inReservation == nil { // a reservation meters the capacity its instances run in
		if err := openUsage(ctx, tx, row); err != nil {
			return nil, err
		}
	}
	if spec != nil {
		err = spec.Push(ctx, tx)
	} else {
		err = nodework.PushSpec(ctx, tx, booking.NodeID)
	}
	if err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventInstanceCreated, Subject: id, TenantID: in.TenantID,
		Data: api.InstanceCreatedPayload{InstanceID: id, PoolID: in.PoolID, NodeID: &booking.NodeID, Flavor: in.Flavor}}); err != nil {
		return nil, err
	}
	return s.waited(ctx, row, in.Wait, StateRunning)
}

// networkOf checks create's network and egress policy: the mode (egress
// by default) and the policy as stored. A provider's machine has the
// provider's network: its row has none of ours and takes no policy.
func networkOf(in *api.InstancesCreateInput, provider bool) (string, []byte, error) {
	mode := in.Network
	if mode == "" {
		mode = vmnet.Egress
	}
	if in.Egress == nil {
		return mode, nil, nil
	}
	p, err := vmnet.CheckPolicy("egress", *in.Egress)
	if err != nil {
		return "", nil, err
	}
	if provider && len(p.Allow)+len(p.Deny) > 0 {
		return "", nil, api.Errorf(api.CodeInvalidInput, "egress: the pool is a provider pool; its machines have the provider's network")
	}
	if err := vmnet.CheckMode("egress", mode, p); err != nil {
		return "", nil, err
	}
	return mode, vmnet.Encode(p), nil
}

// SetEgressPolicy answers instances.setEgressPolicy: the policy goes into
// the instance's row and its node's spec, which the daemon applies to the
// VM as it runs.
func (s *Service) SetEgressPolicy(ctx context.Context, in *api.InstancesSetEgressPolicyInput) (*api.Instance, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.InstanceID, true)
	if err != nil {
		return nil, err
	}
	switch {
	case r.DesiredState == StateDeleted:
		return nil, api.Errorf(api.CodeInvalidState, "instance %s is deleted", r.InstanceID).WithDetails(map[string]any{"state": r.State})
	case r.Network != vmnet.Egress:
		return nil, api.Errorf(api.CodeInvalidState, "instance %s has network %s; an egress policy applies only under network egress", r.InstanceID, r.Network).
			WithDetails(map[string]any{"network": r.Network})
	}
	p, err := vmnet.CheckPolicy("egress", in.Egress)
	if err != nil {
		return nil, err
	}
	r, err = SetEgress(ctx, tx, r, p)
	if err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventInstanceEgressChanged, Subject: r.InstanceID, TenantID: r.TenantID,
		Data: api.InstanceEgressChangedPayload{InstanceID: r.InstanceID, Allow: int64(len(p.Allow)), Deny: int64(len(p.Deny))}}); err != nil {
		return nil, err
	}
	return output(r), nil
}

// SetEgress writes a checked policy on a live row of any kind and pushes
// its node's spec (a new generation) so the daemon applies it.
func SetEgress(ctx context.Context, tx pgx.Tx, r db.Instance, p api.EgressPolicy) (db.Instance, error) {
	r, err := db.New(tx).SetInstanceEgressPolicy(ctx, db.SetInstanceEgressPolicyParams{InstanceID: r.InstanceID, EgressPolicy: vmnet.Encode(p)})
	if err != nil {
		return db.Instance{}, err
	}
	if r.NodeID.Valid {
		if err := nodework.PushSpec(ctx, tx, r.NodeID.String); err != nil {
			return db.Instance{}, err
		}
	}
	return r, nil
}

// createOnProvider creates an instance of a provider pool: charged to
// quota now, its machine launched after the commit by the
// provider-instances job (provideraccounts).
func (s *Service) createOnProvider(ctx context.Context, tx pgx.Tx, q *db.Queries, sess *iam.Session, in *api.InstancesCreateInput,
	id string, fp []byte, flavor *api.Flavor, boot []byte, userData pgtype.Text) (*api.Instance, error) {
	if flavor.Gpus != nil && flavor.Gpus.Count > 0 {
		return nil, api.Errorf(api.CodeUnsupported, "flavor: %s has GPUs; instances of provider pools are launched without", in.Flavor)
	}
	row, err := q.InsertProviderInstance(ctx, db.InsertProviderInstanceParams{
		InstanceID: id, TenantID: in.TenantID, PoolID: in.PoolID, Flavor: in.Flavor, ImageID: in.ImageID, Boot: boot, Name: in.Name,
		UserData: userData, Vcpu: int32(flavor.Vcpu), MemoryMib: flavor.MemoryMiB, DiskGib: flavor.DiskGiB,
		CreatedBy: sess.Caller.IdentityID, IdemRequest: fp,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "idempotencyKey: a concurrent create with this key is in progress; retry")
	}
	if err != nil {
		return nil, err
	}
	if err := s.Placer.ChargeCount(ctx, tx, in.TenantID, in.PoolID, ProviderCharge(row)); err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, map[string]string{"poolId": in.PoolID}); err != nil {
		return nil, err
	}
	if err := openUsage(ctx, tx, row); err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventInstanceCreated, Subject: id, TenantID: in.TenantID,
		Data: api.InstanceCreatedPayload{InstanceID: id, PoolID: in.PoolID, Flavor: in.Flavor}}); err != nil {
		return nil, err
	}
	notify.Later(ctx, TopicProviderInstances)
	return s.waited(ctx, row, in.Wait, StateRunning)
}

// TopicProviderInstances wakes the provider-instances job.
const TopicProviderInstances = "provider-instances"

// openUsage starts the instance's metering: vCPU-hours and GiB-hours of
// memory (and GPU-hours) while it holds them.
func openUsage(ctx context.Context, tx pgx.Tx, r db.Instance) error {
	owner := usage.Owner{Type: ResourceType, ID: r.InstanceID}
	_, err := usage.OpenAll(ctx, tx,
		usage.Allocation{TenantID: r.TenantID, Meter: "instance.vcpu.hours", PerHour: int64(r.Vcpu) * 1_000_000, Owner: owner},
		usage.Allocation{TenantID: r.TenantID, Meter: "instance.memory.gib.hours", PerHour: r.MemoryMib * 1_000_000 / 1024, Owner: owner})
	return err
}

// load reads an instance of tenant.
func load(ctx context.Context, q *db.Queries, tenant, id string, forUpdate bool) (db.Instance, error) {
	get := q.GetInstance
	if forUpdate {
		get = q.GetInstanceForUpdate
	}
	r, err := get(ctx, id)
	// Warm instances and sandboxes' VMs are the sandboxes group's.
	return store.Visible(r, err, r.TenantID == tenant && r.Kind == KindVPS, notFound(id))
}

// Get answers instances.get.
func (s *Service) Get(ctx context.Context, in *api.InstancesGetInput) (*api.Instance, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.InstanceID, false)
	if err != nil {
		return nil, err
	}
	return output(r), nil
}

// List answers instances.list.
func (s *Service) List(ctx context.Context, in *api.InstancesListInput) (*api.InstanceList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var pool pgtype.Text
	if in.PoolID != nil {
		pool = pgtype.Text{String: *in.PoolID, Valid: true}
	}
	rows, err := q.ListInstances(ctx, db.ListInstancesParams{TenantID: in.TenantID, PoolID: pool, IncludeDeleted: in.IncludeDeleted})
	if err != nil {
		return nil, err
	}
	out := &api.InstanceList{Items: make([]api.Instance, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, *output(r))
	}
	return out, nil
}

// desire moves an instance's desired state and pushes its node's spec.
func (s *Service) desire(ctx context.Context, tenant, id, desired string, reboot bool, wait *api.Wait, until string) (*api.Instance, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, tenant, id, true)
	if err != nil {
		return nil, err
	}
	switch {
	case r.DesiredState == StateDeleted:
		return nil, api.Errorf(api.CodeInvalidState, "instance %s is deleted", id).WithDetails(map[string]any{"state": r.State})
	case Provider(r):
		return nil, api.Errorf(api.CodeUnsupported, "instance %s runs on a provider's machine, which is launched and released only; delete it instead", id)
	case reboot && (r.DesiredState != StateRunning || r.State != StateRunning):
		return nil, api.Errorf(api.CodeInvalidState, "instance %s is %s; only a running instance reboots", id, r.State).
			WithDetails(map[string]any{"state": r.State})
	case !reboot && r.DesiredState == desired:
		return s.waited(ctx, r, wait, until)
	}
	n := int32(0)
	if reboot {
		n = 1
	}
	if r, err = q.SetInstanceDesired(ctx, db.SetInstanceDesiredParams{InstanceID: id, DesiredState: desired, Reboot: n}); err != nil {
		return nil, err
	}
	if r.NodeID.Valid {
		if err := nodework.PushSpec(ctx, tx, r.NodeID.String); err != nil {
			return nil, err
		}
	}
	return s.waited(ctx, r, wait, until)
}

// Start answers instances.start.
func (s *Service) Start(ctx context.Context, in *api.InstancesStartInput) (*api.Instance, error) {
	return s.desire(ctx, in.TenantID, in.InstanceID, StateRunning, false, in.Wait, StateRunning)
}

// Stop answers instances.stop.
func (s *Service) Stop(ctx context.Context, in *api.InstancesStopInput) (*api.Instance, error) {
	return s.desire(ctx, in.TenantID, in.InstanceID, StateStopped, false, in.Wait, StateStopped)
}

// Reboot answers instances.reboot.
func (s *Service) Reboot(ctx context.Context, in *api.InstancesRebootInput) (*api.Instance, error) {
	return s.desire(ctx, in.TenantID, in.InstanceID, StateRunning, true, nil, "")
}

// Delete answers instances.delete: the booking, quota and usage are
// returned at once; the VM ends when the daemon applies the spec.
func (s *Service) Delete(ctx context.Context, in *api.InstancesDeleteInput) (*api.Instance, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.InstanceID, true)
	if err != nil {
		return nil, err
	}
	if r.DesiredState == StateDeleted {
		return output(r), nil
	}
	if r, err = End(ctx, tx, s.Placer, r); err != nil {
		return nil, err
	}
	return output(r), nil
}

// End asks for a live instance's deletion in tx: its booking (or its
// reservation unit), quota and usage are returned at once, its node's spec
// drops it, instance.deleted is written (for instances of this group).
//
// The booking's release, the desired state and the node's spec reads go
// in one pipeline; the refunds and the usage's end are held and travel
// with the spec's write.
func End(ctx context.Context, tx pgx.Tx, placer *placement.Engine, r db.Instance) (db.Instance, error) {
	counted := map[string]int64{placement.ResourceInstances: 1}
	if r.Kind != KindVPS {
		counted = map[string]int64{placement.ResourceSandboxes: 1}
	}
	var p store.Pipeline
	var released *placement.Released
	switch {
	case Provider(r):
		if err := placer.RefundCount(ctx, tx, r.TenantID, r.PoolID, ProviderCharge(r)); err != nil {
			return r, err
		}
	case r.BookingID.Valid:
		released = placer.QueueRelease(ctx, &p, r.BookingID.String, counted)
	case r.ReservationBookingID.Valid:
		if err := placer.RefundCount(ctx, tx, r.TenantID, r.PoolID, counted); err != nil {
			return r, err
		}
	}
	if err := usage.CloseOwner(ctx, tx, usage.Owner{Type: ResourceType, ID: r.InstanceID}, time.Time{}); err != nil {
		return r, err
	}
	var ended db.Instance
	var endErr error
	p.Queue(func(q *db.Queries) {
		ended, endErr = q.SetInstanceDesired(ctx, db.SetInstanceDesiredParams{InstanceID: r.InstanceID, DesiredState: StateDeleted})
	})
	var spec *nodework.SpecReads
	queued := r.NodeID // its node's spec, read after the desired state
	if queued.Valid {
		spec = nodework.QueueSpec(ctx, &p, queued.String)
	}
	if err := p.Send(ctx, tx); err != nil {
		return r, err
	}
	if released != nil {
		if err := released.Refund(ctx, tx); err != nil {
			return r, err
		}
	}
	if endErr != nil {
		return r, endErr
	}
	r = ended
	switch {
	case r.NodeID.Valid && r.NodeID == queued:
		if err := spec.Push(ctx, tx); err != nil {
			return r, err
		}
	case r.NodeID.Valid: // the row the caller read named another node
		if err := nodework.PushSpec(ctx, tx, r.NodeID.String); err != nil {
			return r, err
		}
	}
	if r.Kind != KindVPS {
		return r, nil // the sandboxes group publishes its own events
	}
	return r, outbox.Write(ctx, tx, outbox.Event{Type: api.EventInstanceDeleted, Subject: r.InstanceID, TenantID: r.TenantID,
		Data: api.InstanceDeletedPayload{InstanceID: r.InstanceID}})
}

// reservationUnit is the unit of a reservation an instance takes.
type reservationUnit struct{ booking, node string }

// unitReads are the reads that take a unit of a reservation: its row,
// locked (the lock serializes the creates that take its units), and its
// first free unit, read after the lock in the same pipeline.
type unitReads struct {
	id      string
	rsv     db.Reservation
	rsvErr  error
	unit    db.FreeReservationUnitRow
	unitErr error
}

func queueUnit(ctx context.Context, p *store.Pipeline, id string) *unitReads {
	u := &unitReads{id: id}
	p.Queue(func(q *db.Queries) { u.rsv, u.rsvErr = q.GetReservationForUpdate(ctx, id) })
	p.Queue(func(q *db.Queries) { u.unit, u.unitErr = q.FreeReservationUnit(ctx, id) })
	return u
}

// take checks that the unit read is a free unit of the active reservation
// (of the tenant, in the same pool) that shape fits; the caller charges
// the instances quota.
func (u *unitReads) take(in *api.InstancesCreateInput, shape placement.Shape) (*reservationUnit, error) {
	id := u.id
	rsv, err := store.Visible(u.rsv, u.rsvErr, u.rsv.TenantID == in.TenantID, api.Errorf(api.CodeNotFound, "reservationId: reservation %s not found", id))
	if err != nil {
		return nil, err
	}
	switch {
	case rsv.PoolID != in.PoolID:
		return nil, api.Errorf(api.CodeInvalidInput, "reservationId: reservation %s holds capacity in pool %s, not %s", id, rsv.PoolID, in.PoolID)
	case rsv.Whole:
		return nil, api.Errorf(api.CodeInvalidInput, "reservationId: reservation %s holds whole nodes; instances run in slices", id)
	case rsv.State != "active":
		return nil, api.Errorf(api.CodeInvalidState, "reservationId: reservation %s is %s; instances run in an active reservation", id, rsv.State).
			WithDetails(map[string]any{"state": rsv.State})
	}
	un, err := u.unit, u.unitErr
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeCapacityUnavailable, "reservation %s has no free unit: each of its %d runs an instance", id, rsv.Count).
			WithDetails(map[string]any{"reason": "reservation-full", "reservationId": id})
	}
	if err != nil {
		return nil, err
	}
	if shape.VCPU > un.Vcpu || shape.MemoryMiB > un.MemoryMib || shape.DiskGiB > un.DiskGib || shape.GPUs > un.Gpus {
		return nil, api.Errorf(api.CodeInvalidInput, "flavor: %s (%d vCPU, %d MiB, %d GiB) does not fit a unit of reservation %s (%d vCPU, %d MiB, %d GiB)",
			in.Flavor, shape.VCPU, shape.MemoryMiB, shape.DiskGiB, id, un.Vcpu, un.MemoryMib, un.DiskGib)
	}
	return &reservationUnit{booking: un.BookingID, node: un.NodeID}, nil
}

// Topic is woken after a commit that changed instance id's reported
// state: the waits on it re-read at once.
func Topic(id string) string { return nodework.InstanceTopic(id) }

// waited follows the Waiting convention: after commit, until the state is
// until (or failed, or deleted).
func (s *Service) waited(ctx context.Context, r db.Instance, wait *api.Wait, until string) (*api.Instance, error) {
	if wait == nil || wait.TimeoutMs == 0 || until == "" || r.State == until {
		return output(r), nil
	}
	id, tenant := r.InstanceID, r.TenantID
	rpc.ThenWait(ctx, time.Duration(wait.TimeoutMs)*time.Millisecond, Topic(id), output(r), func(ctx context.Context) (any, bool) {
		row, err := db.New(s.Store.Pool()).GetInstance(ctx, id)
		if err != nil || row.TenantID != tenant {
			return nil, false
		}
		return output(row), row.State == until || row.State == StateFailed || row.State == StateDeleted
	})
	return output(r), nil
}

// RegisterStatus makes reg follow this group's instances: a daemon's
// report that moves one writes its event.
func RegisterStatus(reg *nodework.Registry) { reg.Register(KindVPS, applyStatus) }

func applyStatus(ctx context.Context, tx pgx.Tx, node string, r db.Instance, reported agentproto.InstanceStatus) (bool, error) {
	var e *outbox.Event
	switch r.State {
	case StateRunning:
		e = &outbox.Event{Type: api.EventInstanceRunning, Data: api.InstanceRunningPayload{InstanceID: r.InstanceID, NodeID: &node}}
	case StateStopped:
		e = &outbox.Event{Type: api.EventInstanceStopped, Data: api.InstanceStoppedPayload{InstanceID: r.InstanceID}}
	case StateFailed:
		e = &outbox.Event{Type: api.EventInstanceFailed, Data: api.InstanceFailedPayload{InstanceID: r.InstanceID, Error: reported.Error}}
	default:
		return false, nil
	}
	e.Subject, e.TenantID = r.InstanceID, r.TenantID
	return true, outbox.Write(ctx, tx, *e)
}

// Resolver reads secrets for hosts (secrets.Service.Resolve).
type Resolver interface {
	Resolve(ctx context.Context, q *db.Queries, tenantID, reference string) ([]byte, int64, error)
}

// ResolveUserData resolves, for node's daemon, the secret references refs
// of the user data of instance id: only an instance placed on that node
// and not deleted, only references its user data holds, each resolved as
// the instance's tenant. The values go back over the daemon's session and
// nowhere else.
func ResolveUserData(ctx context.Context, q *db.Queries, resolver Resolver, node, id string, refs []string) (map[string]string, error) {
	r, err := q.GetInstance(ctx, id)
	if r, err = store.Visible(r, err, r.NodeID.String == node && r.DesiredState != StateDeleted,
		fmt.Errorf("instance %s is not placed on node %s", id, node)); err != nil {
		return nil, err
	}
	held := map[string]bool{}
	for _, u := range agentproto.SecretReferences(r.UserData.String) {
		held[u] = true
	}
	out := make(map[string]string, len(refs))
	for _, ref := range refs {
		if !held[ref] {
			return nil, fmt.Errorf("%s is not in the user data of instance %s", ref, id)
		}
		v, _, err := resolver.Resolve(ctx, q, r.TenantID, ref)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		out[ref] = string(v)
	}
	return out, nil
}
