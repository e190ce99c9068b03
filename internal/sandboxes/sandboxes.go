// Package sandboxes implements the sandboxes group: short-lived microVMs
// of a template (or restored from a snapshot) with a TTL.
//
// A sandbox's VM is an instances row of kind sandbox (guest memory in a
// shared file, an identity generation). A create claims a ready warm
// instance of the template when there is one: the row becomes the
// sandbox's, with a new identity generation (hostname, machine id, env),
// and the host resumes the VM and hands the guest its identity. Otherwise
// it places a cold boot (on the host of the template's volumes, if any),
// or a restore on the node of the snapshot. The host verifies every start
// (the guest agent answers, its root filesystem checks out) before it
// reports the identity: the sandbox is running from then on.
//
// Warm pools (warm.go) and TTL expiry run in the sandboxes job (job.go);
// exec, readFile and writeFile go to the host as signed commands
// (guest.go); snapshots are in snapshots.go.
package sandboxes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
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
	"computeplane/internal/instances"
	"computeplane/internal/nodework"
	"computeplane/internal/outbox"
	"computeplane/internal/placement"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/usage"
	"computeplane/internal/vmnet"
	"computeplane/internal/wire"
)

// ResourceType is the sandbox's type in the authorization projection.
const ResourceType = "sandbox"

// How a sandbox started.
const (
	HowWarm    = "warm"
	HowCold    = "cold"
	HowRestore = "restore"
)

// States of a sandbox as answered (derived from its VM).
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateFailed   = "failed"
	StateDeleted  = "deleted"
)

// Service implements api.SandboxesService and api.SandboxSnapshotsService.
type Service struct {
	Placer *placement.Engine
	Images images.Source
	Store  *store.Store // waits re-read through it
}

var (
	_            api.SandboxesService        = (*Service)(nil)
	_            api.SandboxSnapshotsService = Snapshots{}
	createMethod                             = api.Lookup("/sandboxes/create")
)

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "sandbox %s not found", id) }

// mount is a template's volume entry as sandboxtemplates stores it.
type mount struct {
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly"`
	Resolved  string `json:"resolved"`
}

// identity makes a fresh guest identity: a hostname from the sandbox id
// and a random machine id, so two claims never share them.
func identity(sandboxID string) (hostname, machineID string) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	suffix := sandboxID[len("sbx_"):]
	return "sbx-" + suffix[:min(len(suffix), 16)], hex.EncodeToString(b)
}

// Create answers sandboxes.create.
func (s *Service) Create(ctx context.Context, in *api.SandboxesCreateInput) (*api.Sandbox, error) {
	arrived := time.Now()
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	a := admission{s: s, tx: tx, q: q, in: in, id: k.ID, caller: sess.Caller.IdentityID}
	a.hostname, a.machineID = identity(k.ID)
	// What exists under the key, the template and the claim of one of its
	// warm VMs (none for a replay), in one round trip (with BEGIN).
	var existing db.Sandbox
	var existingErr error
	a.p.Queue(func(q *db.Queries) { existing, existingErr = q.GetSandbox(ctx, k.ID) })
	if in.FromSnapshot == nil && in.TemplateID != nil {
		a.tmplRead = true
		a.p.Queue(func(q *db.Queries) { a.tmpl, a.tmplErr = q.GetSandboxTemplate(ctx, *in.TemplateID) })
		callEnv := []byte("{}")
		if len(in.Env) > 0 {
			callEnv, _ = json.Marshal(in.Env)
		}
		claim := db.ClaimWarmInstanceOfTemplateParams{TemplateID: *in.TemplateID, TenantID: in.TenantID, SandboxID: k.ID,
			Name: a.hostname, Hostname: pgtype.Text{String: a.hostname, Valid: true}, MachineID: pgtype.Text{String: a.machineID, Valid: true},
			Env: callEnv, CreatedBy: sess.Caller.IdentityID}
		a.p.Queue(func(q *db.Queries) { a.claimed, a.claimErr = q.ClaimWarmInstanceOfTemplate(ctx, claim) })
	}
	if err := a.p.Send(ctx, tx); err != nil {
		return nil, err
	}
	if replay, err := k.Replay(existing.IdemRequest, existingErr); err != nil {
		return nil, err
	} else if replay {
		return s.waited(ctx, q, existing, in.Wait, StateRunning)
	}
	id, fp := k.ID, k.Fingerprint

	if err := a.source(ctx); err != nil {
		return nil, err
	}
	ttl := int64(a.tmpl.DefaultTtlSeconds)
	if in.TTLSeconds != nil {
		ttl = *in.TTLSeconds
	}
	if ttl > int64(a.tmpl.MaxTtlSeconds) {
		return nil, api.Errorf(api.CodeInvalidInput, "ttlSeconds: %d is above the template's max TTL of %d s", ttl, a.tmpl.MaxTtlSeconds).
			WithDetails(map[string]any{"maxTtlSeconds": a.tmpl.MaxTtlSeconds})
	}
	env := map[string]string{}
	if len(a.tmpl.Env) > 0 {
		if err := json.Unmarshal(a.tmpl.Env, &env); err != nil {
			return nil, err
		}
	}
	maps.Copy(env, in.Env)
	a.env, _ = json.Marshal(env)

	switch {
	case a.snap != nil:
		err = a.restore(ctx)
	default:
		claimed := false
		if claimed, err = a.claimWarm(ctx); err == nil && !claimed {
			err = a.cold(ctx)
		}
	}
	if err != nil {
		return nil, err
	}
	var from pgtype.Text
	if a.snap != nil {
		from = pgtype.Text{String: a.snap.SnapshotID, Valid: true}
	}
	// The sandbox's row goes in the pipeline that may hold its VM's
	// insert (place); without volumes to attach, the node's spec reads and
	// the answer's attachments follow it there: one round trip for all.
	var row db.Sandbox
	var insertErr error
	a.p.Queue(func(q *db.Queries) {
		row, insertErr = q.InsertSandbox(ctx, db.InsertSandboxParams{
			SandboxID: id, TenantID: in.TenantID, TemplateID: a.tmpl.TemplateID, FromSnapshot: from, InstanceID: a.vm.InstanceID,
			PoolID: a.vm.PoolID, NodeID: a.vm.NodeID.String, How: a.how, MaxTtlSeconds: a.tmpl.MaxTtlSeconds,
			ExpiresAt: arrived.Add(time.Duration(ttl) * time.Second), CreatedBy: sess.Caller.IdentityID, IdemRequest: fp, CreatedAt: arrived,
		})
	})
	var spec *nodework.SpecReads
	var atts []db.SandboxAttachmentsRow
	var attsErr error
	answer := len(a.mounts) == 0 && (in.Wait == nil || in.Wait.TimeoutMs == 0)
	if len(a.mounts) == 0 {
		spec = nodework.QueueSpec(ctx, &a.p, a.vm.NodeID.String)
		if answer {
			a.p.Queue(func(q *db.Queries) { atts, attsErr = q.SandboxAttachments(ctx, id) })
		}
	}
	err = a.p.Send(ctx, tx)
	if a.vmQueued {
		if a.vmErr != nil {
			return nil, a.vmErr
		}
		a.vm = a.inserted
	}
	if errors.Is(insertErr, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "idempotencyKey: a concurrent create with this key is in progress; retry")
	}
	if insertErr != nil {
		return nil, insertErr
	}
	if err != nil {
		return nil, err
	}
	if err := a.attach(ctx); err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, map[string]string{"templateId": a.tmpl.TemplateID}); err != nil {
		return nil, err
	}
	if err := openUsage(ctx, tx, row, a.vm); err != nil {
		return nil, err
	}
	if spec != nil {
		err = spec.Push(ctx, tx)
	} else {
		err = nodework.PushSpec(ctx, tx, a.vm.NodeID.String)
	}
	if err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxCreated, Subject: id, TenantID: in.TenantID,
		Data: api.SandboxCreatedPayload{SandboxID: id, TemplateID: a.tmpl.TemplateID, NodeID: a.vm.NodeID.String, How: a.how}}); err != nil {
		return nil, err
	}
	if answer {
		// The VM is the row this transaction wrote (or locked): as a
		// re-read would find it.
		if attsErr != nil {
			return nil, attsErr
		}
		return outputWith(row, a.vm, atts), nil
	}
	return s.waited(ctx, q, row, in.Wait, StateRunning)
}

// admission is one sandboxes.create being decided.
type admission struct {
	s      *Service
	tx     pgx.Tx
	q      *db.Queries
	in     *api.SandboxesCreateInput
	id     string
	caller string

	tmpl      db.SandboxTemplate
	snap      *db.SandboxSnapshot
	origin    db.Instance // the snapshot's sandbox's VM (restore)
	env       []byte
	hostname  string
	machineID string

	how    string
	vm     db.Instance
	mounts []mount

	// p holds statements for the next round trip: the first reads, then
	// the VM's insert (place) with the sandbox's.
	p        store.Pipeline
	tmplRead bool        // the template was read in the first pipeline
	tmplErr  error       // its read's error
	claimed  db.Instance // the warm VM claimed in the first pipeline (with the template)
	claimErr error       // its error (no rows: none claimed)
	vmQueued bool        // the VM's insert is in p
	inserted db.Instance // its row
	vmErr    error       // its error
}

// source reads the template (or the snapshot and its sandbox's template).
func (a *admission) source(ctx context.Context) error {
	tenant := a.in.TenantID
	if a.in.FromSnapshot != nil {
		snap, err := a.q.GetSnapshot(ctx, *a.in.FromSnapshot)
		if snap, err = store.Visible(snap, err, snap.TenantID == tenant && snap.State != SnapshotDeleted,
			api.Errorf(api.CodeNotFound, "fromSnapshot: snapshot %s not found", *a.in.FromSnapshot)); err != nil {
			return err
		}
		if snap.State != SnapshotReady {
			return api.Errorf(api.CodeInvalidState, "fromSnapshot: snapshot %s is %s; only a ready one restores", snap.SnapshotID, snap.State).
				WithDetails(map[string]any{"state": snap.State})
		}
		sbx, err := a.q.GetSandbox(ctx, snap.SandboxID)
		if err != nil {
			return err
		}
		if a.origin, err = a.q.GetInstance(ctx, sbx.InstanceID); err != nil {
			return err
		}
		if a.tmpl, err = a.q.GetSandboxTemplate(ctx, sbx.TemplateID); err != nil {
			return err
		}
		a.snap = &snap
		return nil
	}
	t, err := a.tmpl, a.tmplErr
	if !a.tmplRead {
		t, err = a.q.GetSandboxTemplate(ctx, *a.in.TemplateID)
	}
	if t, err = store.Visible(t, err, t.TenantID == tenant && !t.Deleted,
		api.Errorf(api.CodeNotFound, "templateId: template %s not found", *a.in.TemplateID)); err != nil {
		return err
	}
	a.tmpl = t
	return json.Unmarshal(t.Volumes, &a.mounts)
}

// claimWarm answers whether the first pipeline claimed a ready warm
// instance of the template: it becomes the sandbox's VM with a new
// identity generation. The warm instance was placed and charged when the
// reconciler made it.
func (a *admission) claimWarm(context.Context) (bool, error) {
	if len(a.mounts) > 0 || !a.tmplRead {
		return false, nil // a template with volumes keeps no warm pool
	}
	if errors.Is(a.claimErr, pgx.ErrNoRows) {
		return false, nil
	}
	if a.claimErr != nil {
		return false, a.claimErr
	}
	a.vm, a.how = a.claimed, HowWarm
	return true, nil
}

// cold places a new VM for the sandbox: on the template's pool, or on the
// host of its volumes.
func (a *admission) cold(ctx context.Context) error {
	node := ""
	for _, m := range a.mounts {
		v, err := a.q.GetSandboxVolume(ctx, m.Resolved)
		if err != nil {
			return err
		}
		node = v.NodeID // every volume of a template is on one host (the template checked it)
	}
	a.how = HowCold
	return a.place(ctx, node, a.tmpl.Flavor, a.tmpl.ImageID, "")
}

// restore places the snapshot's VM again, on the snapshot's node (where
// its files are), with the shape and image of the sandbox it was taken of.
func (a *admission) restore(ctx context.Context) error {
	a.how = HowRestore
	return a.place(ctx, a.snap.NodeID, a.origin.Flavor, a.origin.ImageID, a.snap.SnapshotID)
}

// candidatesFor is first when flavor asks no GPUs: a sandbox books none,
// and the candidates were read for the flavor's whole shape.
func candidatesFor(first *placement.Candidates, flavor *api.Flavor) *placement.Candidates {
	if flavor.Gpus != nil {
		return nil
	}
	return first
}

// place books a VM for the sandbox and writes its instances row.
func (a *admission) place(ctx context.Context, node, flavorName, imageID, restore string) error {
	t := a.tmpl
	// A restore keeps its sandbox's network and policy with an address of
	// its own (two restores of one snapshot never share one).
	mode, policy := t.Network, t.EgressPolicy
	if restore != "" {
		mode, policy = a.origin.Network, a.origin.EgressPolicy
	}
	// The pool and flavor, and when the VM may go to any node the
	// placement's candidates for the flavor, in one round trip.
	var p store.Pipeline
	poolRead := flavors.QueueInPool(ctx, &p, t.TenantID, t.PoolID, flavorName)
	var first *placement.Candidates
	if node == "" {
		first = a.s.Placer.QueueCandidates(ctx, &p, t.PoolID, flavorName, mode)
	}
	if err := p.Send(ctx, a.tx); err != nil {
		return err
	}
	_, flavor, _, err := poolRead.Result(ctx, a.q)
	if err == nil && flavor == nil {
		err = flavors.NotFound(t.PoolID, flavorName)
	}
	if err != nil {
		return err
	}
	if flavor.Archived {
		return api.Errorf(api.CodeInvalidState, "the template's flavor %s is archived", flavorName)
	}
	var boot []byte
	if restore != "" {
		boot = a.origin.Boot
	} else {
		im, err := a.s.Images.Get(ctx, imageID)
		if errors.Is(err, images.ErrNotFound) {
			return api.Errorf(api.CodeNotFound, "the template's image %s is no longer in the image source", imageID)
		}
		if err != nil {
			return err
		}
		boot = instances.BootOf(im)
	}
	vmID := iam.DerivedID(api.Lookup("/instances/create"), t.TenantID, a.id, "sandbox")
	// The booking and the quota charges in one round trip (the VM's insert
	// goes with the sandbox's, next).
	booking, err := a.s.Placer.AdmitPipelined(ctx, a.tx, placement.Request{
		TenantID: t.TenantID, PoolID: t.PoolID, Owner: placement.Owner{Type: ResourceType, ID: vmID}, NodeID: node, Network: mode,
		Shape: placement.Shape{VCPU: int32(flavor.Vcpu), MemoryMiB: flavor.MemoryMiB, DiskGiB: flavor.DiskGiB},
		Count: map[string]int64{placement.ResourceSandboxes: 1},
	}, candidatesFor(first, flavor), func(*store.Pipeline, *placement.Booking) {})
	if err != nil {
		return err
	}
	var volumes []byte
	if len(a.mounts) > 0 {
		specs := make([]agentproto.SpecVolume, 0, len(a.mounts))
		for _, m := range a.mounts {
			v, err := a.q.GetSandboxVolume(ctx, m.Resolved)
			if err != nil {
				return err
			}
			specs = append(specs, agentproto.SpecVolume{Serial: v.Serial, MountPath: m.MountPath, ReadOnly: m.ReadOnly})
		}
		volumes, _ = json.Marshal(specs)
	}
	params := db.InsertSandboxInstanceParams{
		InstanceID: vmID, TenantID: t.TenantID, PoolID: t.PoolID, NodeID: pgtype.Text{String: booking.NodeID, Valid: true},
		BookingID: pgtype.Text{String: booking.ID, Valid: true}, Flavor: flavorName, ImageID: imageID, Boot: boot, Name: a.hostname,
		UserData: t.UserData, Vcpu: int32(flavor.Vcpu), MemoryMib: flavor.MemoryMiB, DiskGib: flavor.DiskGiB,
		DesiredState: instances.StateRunning, CreatedBy: a.caller, Kind: instances.KindSandbox,
		TemplateID: pgtype.Text{String: t.TemplateID, Valid: true}, Hostname: pgtype.Text{String: a.hostname, Valid: true},
		MachineID: pgtype.Text{String: a.machineID, Valid: true}, Env: a.env,
		RestoreSnapshot: pgtype.Text{String: restore, Valid: restore != ""}, Volumes: volumes,
	}
	if !vmnet.Assigns(mode, policy) {
		// Nothing follows the insert here: it travels with the sandbox's
		// (Create), and the row is what it will return.
		a.vm = db.Instance{InstanceID: vmID, PoolID: t.PoolID, NodeID: params.NodeID}
		a.vmQueued = true
		a.p.Queue(func(q *db.Queries) { a.inserted, a.vmErr = q.InsertSandboxInstance(ctx, params) })
		return nil
	}
	if a.vm, err = a.q.InsertSandboxInstance(ctx, params); err != nil {
		return err
	}
	a.vm, err = vmnet.Assign(ctx, a.q, a.vm, mode, policy)
	return err
}

// attach records the sandbox's volume attachments: a read-write one
// excludes every other live attachment of its volume, a read-only one a
// live read-write one ('volume-in-use'). The volumes' rows are locked in
// id order so concurrent creates decide one after the other.
func (a *admission) attach(ctx context.Context) error {
	for i, m := range a.mounts {
		v, err := a.q.GetSandboxVolumeForUpdate(ctx, m.Resolved)
		if err != nil {
			return err
		}
		if v.State != "ready" {
			return api.Errorf(api.CodeInvalidState, "volume %s of the template is %s", v.VolumeID, v.State).WithDetails(map[string]any{"state": v.State})
		}
		live, err := a.q.LiveAttachments(ctx, v.VolumeID)
		if err != nil {
			return err
		}
		for _, l := range live {
			if !m.ReadOnly || !l.ReadOnly {
				return api.Errorf(api.CodeConflict, "volumes[%d]: volume %s is attached read-write or is attached by sandbox %s while this one would write it", i, v.VolumeID, l.SandboxID).
					WithDetails(map[string]any{"reason": "volume-in-use", "volumeId": v.VolumeID, "sandboxId": l.SandboxID})
			}
		}
		if err := a.q.InsertAttachment(ctx, db.InsertAttachmentParams{SandboxID: a.id, VolumeID: v.VolumeID, MountPath: m.MountPath, ReadOnly: m.ReadOnly}); err != nil {
			return err
		}
	}
	return nil
}

// openUsage starts a sandbox's metering while it holds its VM.
func openUsage(ctx context.Context, tx pgx.Tx, sbx db.Sandbox, vm db.Instance) error {
	owner := usage.Owner{Type: ResourceType, ID: sbx.SandboxID}
	_, err := usage.OpenAll(ctx, tx,
		usage.Allocation{TenantID: sbx.TenantID, Meter: "sandbox.vcpu.hours", PerHour: int64(vm.Vcpu) * 1_000_000, Owner: owner},
		usage.Allocation{TenantID: sbx.TenantID, Meter: "sandbox.memory.gib.hours", PerHour: vm.MemoryMib * 1_000_000 / 1024, Owner: owner})
	return err
}

// load reads a sandbox of tenant with its VM.
func load(ctx context.Context, q *db.Queries, tenant, id string) (db.Sandbox, db.Instance, error) {
	r, err := q.GetSandbox(ctx, id)
	if r, err = store.Visible(r, err, r.TenantID == tenant, notFound(id)); err != nil {
		return db.Sandbox{}, db.Instance{}, err
	}
	vm, err := q.GetInstance(ctx, r.InstanceID)
	return r, vm, err
}

// lock reads a sandbox of tenant and its VM's row, both locked (the
// sandbox's first), in one pipeline; then queues in it what the caller
// reads after them (nil: nothing).
func lock(ctx context.Context, tx pgx.Tx, tenant, id string, then func(*store.Pipeline)) (db.Sandbox, db.Instance, error) {
	var p store.Pipeline
	var r db.Sandbox
	var vm db.Instance
	var err, vmErr error
	p.Queue(func(q *db.Queries) { r, err = q.GetSandboxForUpdate(ctx, id) })
	p.Queue(func(q *db.Queries) { vm, vmErr = q.GetSandboxVMForUpdate(ctx, id) })
	if then != nil {
		then(&p)
	}
	if err := p.Send(ctx, tx); err != nil {
		return db.Sandbox{}, db.Instance{}, err
	}
	if r, err = store.Visible(r, err, r.TenantID == tenant, notFound(id)); err != nil {
		return db.Sandbox{}, db.Instance{}, err
	}
	return r, vm, vmErr
}

// state is what a sandbox is, from its row and its VM's: creating until
// its guest runs with the identity it was given.
func state(r db.Sandbox, vm db.Instance) string {
	mine := vm.ReportedIdentity == vm.IdentityGeneration // the guest took the sandbox's identity
	switch {
	case r.DeletedAt != nil:
		return StateDeleted
	case vm.State == instances.StateFailed:
		return StateFailed
	case vm.State == instances.StatePaused && mine:
		return StatePaused
	case vm.State == instances.StateRunning && mine:
		return StateRunning
	}
	return StateCreating
}

func ms(d time.Duration) int64 { return max(d.Milliseconds(), 0) }

func output(ctx context.Context, q *db.Queries, r db.Sandbox, vm db.Instance) (*api.Sandbox, error) {
	if len(vm.Volumes) == 0 {
		// A sandbox attaches volumes only with a VM that mounts them
		// (place): no read for the others (a wait re-reads often).
		return outputWith(r, vm, nil), nil
	}
	atts, err := q.SandboxAttachments(ctx, r.SandboxID)
	if err != nil {
		return nil, err
	}
	return outputWith(r, vm, atts), nil
}

// outputWith is output from the sandbox's attachments already read.
func outputWith(r db.Sandbox, vm db.Instance, atts []db.SandboxAttachmentsRow) *api.Sandbox {
	o := &api.Sandbox{
		SandboxID: r.SandboxID, TenantID: r.TenantID, TemplateID: r.TemplateID, PoolID: r.PoolID, NodeID: r.NodeID,
		Hostname: vm.Hostname.String, State: state(r, vm), ExpiresAt: wire.Time(r.ExpiresAt), CreatedAt: wire.Time(r.CreatedAt),
		Volumes: []api.SandboxAttachment{},
		Timings: api.SandboxTimings{How: r.How, PlacedMs: ms(r.PlacedAt.Sub(r.CreatedAt))},
	}
	o.Network, o.Address, o.Mac, o.Egress = vmnet.Output(vm)
	if r.FromSnapshot.Valid {
		o.FromSnapshot = &r.FromSnapshot.String
	}
	if vm.Error.Valid && o.State == StateFailed {
		o.Error = &vm.Error.String
	}
	if r.ReadyAt != nil {
		t := wire.Time(*r.ReadyAt)
		o.ReadyAt = &t
		d := ms(r.ReadyAt.Sub(r.CreatedAt))
		o.Timings.ReadyMs = &d
	}
	if r.DeletedAt != nil {
		t := wire.Time(*r.DeletedAt)
		o.DeletedAt = &t
	}
	var ht agentproto.HostTimings
	if len(vm.HostTimings) > 0 && json.Unmarshal(vm.HostTimings, &ht) == nil {
		start, ready := ht.GuestMs-ht.StartMs, ht.IdentityMs-ht.StartMs
		o.Timings.HostStartMs, o.Timings.HostReadyMs = &start, &ready
	}
	for _, a := range atts {
		o.Volumes = append(o.Volumes, api.SandboxAttachment{VolumeID: a.VolumeID, Serial: a.Serial, MountPath: a.MountPath, ReadOnly: a.ReadOnly})
	}
	return o
}

// Get answers sandboxes.get.
func (s *Service) Get(ctx context.Context, in *api.SandboxesGetInput) (*api.Sandbox, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, vm, err := load(ctx, q, in.TenantID, in.SandboxID)
	if err != nil {
		return nil, err
	}
	return output(ctx, q, r, vm)
}

// List answers sandboxes.list.
func (s *Service) List(ctx context.Context, in *api.SandboxesListInput) (*api.SandboxList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var tmpl pgtype.Text
	if in.TemplateID != nil {
		tmpl = pgtype.Text{String: *in.TemplateID, Valid: true}
	}
	rows, err := q.ListSandboxes(ctx, db.ListSandboxesParams{TenantID: in.TenantID, TemplateID: tmpl, IncludeDeleted: in.IncludeDeleted})
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.InstanceID
	}
	vms, err := q.SandboxInstances(ctx, ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]db.Instance, len(vms))
	for _, vm := range vms {
		byID[vm.InstanceID] = vm
	}
	out := &api.SandboxList{Items: make([]api.Sandbox, 0, len(rows))}
	for _, r := range rows {
		o, err := output(ctx, q, r, byID[r.InstanceID])
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, *o)
	}
	return out, nil
}

// Pause answers sandboxes.pause.
func (s *Service) Pause(ctx context.Context, in *api.SandboxesPauseInput) (*api.Sandbox, error) {
	return s.desire(ctx, in.TenantID, in.SandboxID, instances.StatePaused, in.Wait)
}

// Resume answers sandboxes.resume.
func (s *Service) Resume(ctx context.Context, in *api.SandboxesResumeInput) (*api.Sandbox, error) {
	return s.desire(ctx, in.TenantID, in.SandboxID, instances.StateRunning, in.Wait)
}

// desire moves a sandbox's VM between running and paused.
func (s *Service) desire(ctx context.Context, tenant, id, desired string, wait *api.Wait) (*api.Sandbox, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, vm, err := lock(ctx, tx, tenant, id, nil)
	if err != nil {
		return nil, err
	}
	until := StateRunning
	if desired == instances.StatePaused {
		until = StatePaused
	}
	now := state(r, vm)
	switch {
	case vm.DesiredState == desired:
		return s.waited(ctx, q, r, wait, until)
	case now == StateDeleted || now == StateFailed || (desired == instances.StatePaused && now != StateRunning) ||
		(desired == instances.StateRunning && now != StatePaused):
		return nil, api.Errorf(api.CodeInvalidState, "sandbox %s is %s", id, now).WithDetails(map[string]any{"state": now})
	}
	if _, err := q.SetInstanceDesired(ctx, db.SetInstanceDesiredParams{InstanceID: vm.InstanceID, DesiredState: desired}); err != nil {
		return nil, err
	}
	if err := nodework.PushSpec(ctx, tx, r.NodeID); err != nil {
		return nil, err
	}
	e := outbox.Event{Type: api.EventSandboxPaused, Subject: id, TenantID: tenant, Data: api.SandboxPausedPayload{SandboxID: id}}
	if desired == instances.StateRunning {
		e = outbox.Event{Type: api.EventSandboxResumed, Subject: id, TenantID: tenant, Data: api.SandboxResumedPayload{SandboxID: id}}
	}
	if err := outbox.Write(ctx, tx, e); err != nil {
		return nil, err
	}
	return s.waited(ctx, q, r, wait, until)
}

// Extend answers sandboxes.extend.
func (s *Service) Extend(ctx context.Context, in *api.SandboxesExtendInput) (*api.Sandbox, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, vm, err := lock(ctx, tx, in.TenantID, in.SandboxID, nil)
	if err != nil {
		return nil, err
	}
	if r.DeletedAt != nil {
		return nil, api.Errorf(api.CodeInvalidState, "sandbox %s is deleted", r.SandboxID).WithDetails(map[string]any{"state": StateDeleted})
	}
	until := time.Now().Add(time.Duration(in.TTLSeconds) * time.Second)
	limit := r.CreatedAt.Add(time.Duration(r.MaxTtlSeconds) * time.Second)
	if until.After(limit) {
		return nil, api.Errorf(api.CodeInvalidInput, "ttlSeconds: the sandbox would live past %s, its template's max TTL of %d s from its creation",
			wire.Time(limit), r.MaxTtlSeconds).WithDetails(map[string]any{"maxExpiresAt": wire.Time(limit)})
	}
	if r, err = q.SetSandboxExpiry(ctx, db.SetSandboxExpiryParams{SandboxID: r.SandboxID, ExpiresAt: until}); err != nil {
		return nil, err
	}
	return output(ctx, q, r, vm)
}

// SetEgressPolicy answers sandboxes.setEgressPolicy: the policy goes into
// the sandbox's VM row and its node's spec (the template keeps its own).
func (s *Service) SetEgressPolicy(ctx context.Context, in *api.SandboxesSetEgressPolicyInput) (*api.Sandbox, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, vm, err := lock(ctx, tx, in.TenantID, in.SandboxID, nil)
	if err != nil {
		return nil, err
	}
	switch st := state(r, vm); {
	case st == StateDeleted || st == StateFailed:
		return nil, api.Errorf(api.CodeInvalidState, "sandbox %s is %s", r.SandboxID, st).WithDetails(map[string]any{"state": st})
	case vm.Network != vmnet.Egress:
		return nil, api.Errorf(api.CodeInvalidState, "sandbox %s has network %s; an egress policy applies only under network egress", r.SandboxID, vm.Network).
			WithDetails(map[string]any{"network": vm.Network})
	}
	p, err := vmnet.CheckPolicy("egress", in.Egress)
	if err != nil {
		return nil, err
	}
	if vm, err = instances.SetEgress(ctx, tx, vm, p); err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxEgressChanged, Subject: r.SandboxID, TenantID: r.TenantID,
		Data: api.SandboxEgressChangedPayload{SandboxID: r.SandboxID, Allow: int64(len(p.Allow)), Deny: int64(len(p.Deny))}}); err != nil {
		return nil, err
	}
	return output(ctx, q, r, vm)
}

// Delete answers sandboxes.delete.
func (s *Service) Delete(ctx context.Context, in *api.SandboxesDeleteInput) (*api.Sandbox, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	// The snapshots that go with it are read with the rows it locks.
	var snaps []db.SandboxSnapshot
	var snapsErr error
	r, vm, err := lock(ctx, tx, in.TenantID, in.SandboxID, func(p *store.Pipeline) {
		p.Queue(func(q *db.Queries) { snaps, snapsErr = q.UnkeptSnapshots(ctx, in.SandboxID) })
	})
	if err != nil {
		return nil, err
	}
	if r.DeletedAt == nil {
		if snapsErr != nil {
			return nil, snapsErr
		}
		if r, vm, err = end(ctx, tx, s.Placer, r, vm, snaps, "deleted"); err != nil {
			return nil, err
		}
	}
	return output(ctx, q, r, vm)
}

// end deletes a live sandbox in tx: its VM (capacity and quota back), its
// attachments, its snapshots without keep (snaps, UnkeptSnapshots read
// after its row was locked), its usage; sandbox.deleted. The attachments'
// release and the usage's end are held (store.Later) and travel with the
// sandbox's own write.
func end(ctx context.Context, tx pgx.Tx, placer *placement.Engine, r db.Sandbox, vm db.Instance, snaps []db.SandboxSnapshot, reason string) (db.Sandbox, db.Instance, error) {
	q := db.New(tx)
	var err error
	if vm.DesiredState != instances.StateDeleted {
		if vm, err = instances.End(ctx, tx, placer, vm); err != nil {
			return r, vm, err
		}
	}
	if err := db.New(store.Later(tx)).ReleaseAttachments(ctx, r.SandboxID); err != nil {
		return r, vm, err
	}
	for _, sn := range snaps {
		if _, err := deleteSnapshot(ctx, tx, sn); err != nil {
			return r, vm, err
		}
	}
	if err := usage.CloseOwner(ctx, tx, usage.Owner{Type: ResourceType, ID: r.SandboxID}, time.Time{}); err != nil {
		return r, vm, err
	}
	if r, err = q.DeleteSandbox(ctx, db.DeleteSandboxParams{SandboxID: r.SandboxID, Reason: pgtype.Text{String: reason, Valid: true}}); err != nil {
		return r, vm, err
	}
	return r, vm, outbox.Write(ctx, tx, outbox.Event{Type: api.EventSandboxDeleted, Subject: r.SandboxID, TenantID: r.TenantID,
		Data: api.SandboxDeletedPayload{SandboxID: r.SandboxID, Reason: reason}})
}

// waited follows the Waiting convention: after commit, until the sandbox
// is until (or failed or deleted), at most wait.timeoutMs. A wait reads
// nothing more in the transaction: its answer is read after the commit.
func (s *Service) waited(ctx context.Context, q *db.Queries, r db.Sandbox, wait *api.Wait, until string) (*api.Sandbox, error) {
	if wait == nil || wait.TimeoutMs == 0 {
		vm, err := q.GetInstance(ctx, r.InstanceID)
		if err != nil {
			return nil, err
		}
		return output(ctx, q, r, vm)
	}
	id := r.SandboxID
	done := func(o *api.Sandbox) bool {
		return o.State == until || o.State == StateFailed || o.State == StateDeleted
	}
	rpc.ThenPoll(ctx, rpc.Poll{Timeout: time.Duration(wait.TimeoutMs) * time.Millisecond, Topic: instances.Topic(r.InstanceID),
		// A status written in this process hands over the sandbox it
		// moved (offer): the answer without a re-read.
		Offered: func(v any) (any, bool) {
			m, ok := v.(moved)
			if !ok || m.sbx.SandboxID != id {
				return nil, false
			}
			o := outputWith(m.sbx, m.vm, nil)
			return o, done(o)
		}}, func(ctx context.Context) (any, bool, error) {
		q := db.New(s.Store.Pool())
		row, err := q.GetSandboxWithVM(ctx, id)
		if err != nil {
			return nil, false, nil
		}
		o, err := output(ctx, q, row.Sandbox, row.Instance)
		if err != nil {
			return nil, false, nil
		}
		return o, done(o), nil
	})
	return nil, nil
}
