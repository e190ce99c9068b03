// Package reservations implements the reservations group: count units of
// a flavor held in a pool over a window, on-demand or spot.
//
//	queued -> placed -> active -> ended
//	queued -> failed; any live -> cancelled
//	placed | active (spot) -> preempting -> preempted
//
// The inline placer books them in the create's transaction; the pool-lease
// placer queues one placement item per unit for the pool's worker. An
// on-demand reservation that does not fit takes capacity back from spot
// reservations: each is told (reservation.preempting, and a notice command
// to the daemons of its nodes) and loses its capacity when
// capacity.spotNoticeMs has passed; the Job then places the waiting one.
package reservations

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/config"
	"computeplane/internal/flavors"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/instances"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/placement"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/usage"
	"computeplane/internal/wire"
)

// States.
const (
	StateQueued     = "queued"
	StatePlaced     = "placed"
	StateActive     = "active"
	StateEnded      = "ended"
	StateCancelled  = "cancelled"
	StateFailed     = "failed"
	StatePreempting = "preempting"
	StatePreempted  = "preempted"
)

// Priorities.
const (
	OnDemand = "on-demand"
	Spot     = "spot"
)

// ResourceType is the reservation's type in the authorization projection
// and its bookings' owner type.
const ResourceType = "reservation"

// TopicJob wakes the reservations job (a queued reservation to look at).
const TopicJob = "reservations"

// Service implements api.ReservationsService.
type Service struct {
	Placer     *placement.Engine
	Store      *store.Store
	PlacerKind config.Placer
	SpotNotice time.Duration
}

var _ api.ReservationsService = (*Service)(nil)

var createMethod = api.Lookup("/reservations/create")

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "reservation %s not found", id) }

func isCode(err error, code api.Code) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Code == code
}

// output renders a reservation with its nodes (read in q).
func output(ctx context.Context, q *db.Queries, r db.Reservation) (*api.Reservation, error) {
	nodes, err := q.ReservationNodes(ctx, r.ReservationID)
	if err != nil {
		return nil, err
	}
	return outputWith(r, nodes), nil
}

// outputWith is output with the nodes of r's live bookings known.
func outputWith(r db.Reservation, nodes []string) *api.Reservation {
	o := &api.Reservation{
		ReservationID: r.ReservationID, TenantID: r.TenantID, PoolID: r.PoolID, Flavor: r.Flavor, Count: int64(r.Count),
		Priority: r.Priority, StartAt: wire.Time(r.StartAt), State: r.State, NodeIDs: nodes,
		CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt), Operation: operation(r),
	}
	if o.NodeIDs == nil {
		o.NodeIDs = []string{}
	}
	if r.EndAt != nil {
		t := wire.Time(*r.EndAt)
		o.EndAt = &t
	}
	if r.Error.Valid {
		o.Error = &r.Error.String
	}
	if r.PreemptAt != nil {
		t := wire.Time(*r.PreemptAt)
		o.PreemptAt = &t
	}
	return o
}

// nodesOf is what ReservationNodes reads of a reservation whose bookings
// are these: their nodes, each once, in order.
func nodesOf(bookings []*placement.Booking) []string {
	nodes := make([]string, 0, len(bookings))
	for _, b := range bookings {
		nodes = append(nodes, b.NodeID)
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}

// operation is the Queued condition while placement is pending.
func operation(r db.Reservation) api.Operation {
	switch r.State {
	case StateQueued:
		msg := "waiting for the pool's worker to place it"
		if r.WaitingForPreemption {
			msg = "waiting for capacity taken back from spot reservations"
		}
		return api.Operation{State: "running", Conditions: []api.ReservationCondition{{Type: "Queued", Status: true, Reason: "PlacementPending", Message: msg}}}
	case StateFailed:
		return api.Operation{State: "failed", Conditions: []api.ReservationCondition{{Type: "Queued", Status: false, Reason: "Failed", Message: r.Error.String}}}
	}
	return api.Operation{State: "succeeded", Conditions: []api.ReservationCondition{{Type: "Queued", Status: false, Reason: "Placed", Message: "placement is done"}}}
}

// shapeOf is one unit of a flavor.
func shapeOf(f *api.Flavor) placement.Shape {
	shape := placement.Shape{VCPU: int32(f.Vcpu), MemoryMiB: f.MemoryMiB, DiskGiB: f.DiskGiB}
	if f.Gpus != nil {
		shape.GPUs, shape.GPUModel = int32(f.Gpus.Count), f.Gpus.Model
	}
	return shape
}

// flavorOf reads a reservation's flavor (whatever its state now).
func flavorOf(ctx context.Context, q *db.Queries, r db.Reservation) (*api.Flavor, error) {
	row, err := q.GetFlavor(ctx, db.GetFlavorParams{PoolID: r.PoolID, Name: r.Flavor})
	if err != nil {
		return nil, err
	}
	f := &api.Flavor{PoolID: row.PoolID, Name: row.Name, Vcpu: int64(row.Vcpu), MemoryMiB: row.MemoryMib, DiskGiB: row.DiskGib}
	if row.GpuModel.Valid {
		f.Gpus = &api.GPUs{Model: row.GpuModel.String, Count: int64(row.Gpus)}
	}
	return f, nil
}

// unit is the placement request of one unit of a reservation.
func unit(r db.Reservation, f *api.Flavor) placement.Request {
	shape := shapeOf(f)
	return placement.Request{TenantID: r.TenantID, PoolID: r.PoolID, Owner: placement.Owner{Type: ResourceType, ID: r.ReservationID},
		Shape: shape, Whole: r.Whole, Until: r.EndAt}
}

// admitAll books every unit in a savepoint: all or none. Each unit's
// booking and charges go in one round trip (AdmitPipelined); the first
// unit's candidates are first's, read with the create's first reads.
func (s *Service) admitAll(ctx context.Context, tx pgx.Tx, req placement.Request, count int, first *placement.Candidates) ([]*placement.Booking, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	var out []*placement.Booking
	for i := 0; i < count; i++ {
		b, err := s.Placer.AdmitPipelined(ctx, sp, req, first, func(*store.Pipeline, *placement.Booking) {})
		first = nil // read for the first unit only
		if err != nil {
			_ = sp.Rollback(ctx)
			return nil, err
		}
		out = append(out, b)
	}
	return out, sp.Commit(ctx)
}

func parseTime(field string, v *string, def time.Time) (time.Time, error) {
	if v == nil {
		return def, nil
	}
	t, err := time.Parse(time.RFC3339Nano, *v)
	if err != nil {
		return time.Time{}, api.Errorf(api.CodeInvalidInput, "%s: not an RFC 3339 time", field)
	}
	return t, nil
}

// Create answers reservations.create.
func (s *Service) Create(ctx context.Context, in *api.ReservationsCreateInput) (*api.Reservation, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	// What exists under the key, and the pool, its flavor and the
	// transaction's time, in one round trip (with BEGIN).
	var p store.Pipeline
	var existing db.Reservation
	var existingErr error
	p.Queue(func(q *db.Queries) { existing, existingErr = q.GetReservation(ctx, k.ID) })
	poolRead := flavors.QueueInPool(ctx, &p, in.TenantID, in.PoolID, in.Flavor)
	// The placement's candidates for the first unit too (read for nothing
	// on a replay or a refusal).
	var first *placement.Candidates
	if s.PlacerKind != config.PlacerPoolLease {
		first = s.Placer.QueueCandidates(ctx, &p, in.PoolID, in.Flavor, "")
	}
	if err := p.Send(ctx, tx); err != nil {
		return nil, err
	}
	if replay, err := k.Replay(existing.IdemRequest, existingErr); err != nil {
		return nil, err
	} else if replay {
		return s.waited(ctx, q, existing, in.Wait)
	}
	// The times are checked before the pool is found.
	pool, f, now, poolErr := poolRead.Result(ctx, q)
	if poolErr != nil && !isCode(poolErr, api.CodeNotFound) {
		return nil, poolErr
	}
	start, err := parseTime("startAt", in.StartAt, now)
	if err != nil {
		return nil, err
	}
	if start.Before(now) {
		start = now
	}
	var end *time.Time
	if in.EndAt != nil {
		e, err := parseTime("endAt", in.EndAt, now)
		if err != nil {
			return nil, err
		}
		if !e.After(start) {
			return nil, api.Errorf(api.CodeInvalidInput, "endAt: must be after startAt")
		}
		end = &e
	}
	if poolErr != nil {
		return nil, poolErr
	}
	if pool.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "pool %s is archived", pool.PoolID)
	}
	if f == nil {
		return nil, flavors.NotFound(in.PoolID, in.Flavor)
	}
	if f.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "flavor: %s is archived", in.Flavor)
	}
	count := int(max(in.Count, 1))
	priority := in.Priority
	if priority == "" {
		priority = OnDemand
	}
	r := db.Reservation{ReservationID: k.ID, TenantID: in.TenantID, PoolID: in.PoolID, Flavor: in.Flavor, Count: int32(count),
		Priority: priority, Whole: pool.Class == "metal-host", StartAt: start, EndAt: end}
	req := unit(r, f)
	state, waiting := StatePlaced, false
	var items []string
	var bookings []*placement.Booking
	if s.PlacerKind == config.PlacerPoolLease {
		state = StateQueued
		for i := 0; i < count; i++ {
			item, err := s.Placer.Enqueue(ctx, tx, req)
			if err != nil {
				return nil, err
			}
			items = append(items, item)
		}
	} else {
		bookings, err = s.admitAll(ctx, tx, req, count, first)
		switch {
		case err != nil && priority == OnDemand && isCode(err, api.CodeCapacityUnavailable):
			// Take capacity back from spot reservations, if they hold enough.
			if perr := s.preempt(ctx, tx, r, f, count, now); perr != nil {
				if errors.Is(perr, errNotEnough) {
					return nil, err
				}
				return nil, perr
			}
			state, waiting = StateQueued, true
		case err != nil:
			return nil, err
		}
	}
	if state == StatePlaced && !start.After(now) {
		state = StateActive
	}
	row, err := q.InsertReservation(ctx, db.InsertReservationParams{
		ReservationID: k.ID, TenantID: in.TenantID, PoolID: in.PoolID, Flavor: in.Flavor, Count: int32(count), Priority: priority,
		Whole: r.Whole, StartAt: start, EndAt: end, State: state, PlacementItems: nonNil(items), WaitingForPreemption: waiting,
		CreatedBy: sess.Caller.IdentityID, IdemRequest: k.Fingerprint,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "idempotencyKey: a concurrent create with this key is in progress; retry")
	}
	if err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, map[string]string{"poolId": in.PoolID}); err != nil {
		return nil, err
	}
	if err := write(ctx, tx, api.EventReservationCreated, row, api.ReservationCreatedPayload{ReservationID: k.ID, PoolID: in.PoolID,
		Flavor: in.Flavor, Count: int64(count), Spot: priority == Spot}); err != nil {
		return nil, err
	}
	nodes := nodesOf(bookings)
	if len(bookings) > 0 {
		if err := placedEvents(ctx, tx, row, f, nodes); err != nil {
			return nil, err
		}
	}
	if state == StateQueued {
		notify.Later(ctx, TopicJob)
		if len(items) > 0 {
			notify.Later(ctx, placement.TopicQueued)
		}
	}
	return s.waitedWith(ctx, row, nodes, in.Wait), nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func write(ctx context.Context, tx pgx.Tx, typ string, r db.Reservation, data any) error {
	return outbox.Write(ctx, tx, outbox.Event{Type: typ, Subject: r.ReservationID, TenantID: r.TenantID, Data: data})
}

// placedEvents writes reservation.placed (and .active when its window
// started) and opens its usage.
// nodes are those of its bookings, nil to read them.
func placedEvents(ctx context.Context, tx pgx.Tx, r db.Reservation, f *api.Flavor, nodes []string) error {
	q := db.New(tx)
	if nodes == nil {
		var err error
		if nodes, err = q.ReservationNodes(ctx, r.ReservationID); err != nil {
			return err
		}
	}
	if err := write(ctx, tx, api.EventReservationPlaced, r, api.ReservationPlacedPayload{ReservationID: r.ReservationID, PoolID: r.PoolID, NodeIDs: nodes}); err != nil {
		return err
	}
	if r.State == StateActive {
		if err := write(ctx, tx, api.EventReservationActive, r, api.ReservationActivePayload{ReservationID: r.ReservationID}); err != nil {
			return err
		}
	}
	meter, perHour := "reservation.vcpu.hours", int64(r.Count)*f.Vcpu*1_000_000
	if r.Whole {
		meter, perHour = "reservation.node.hours", int64(r.Count)*1_000_000
	}
	_, err := usage.Open(ctx, tx, usage.Allocation{TenantID: r.TenantID, Meter: meter, PerHour: perHour,
		Owner: usage.Owner{Type: ResourceType, ID: r.ReservationID}})
	return err
}

var errNotEnough = errors.New("reservations: the spot reservations do not hold enough")

// preempt picks spot reservations of the pool, newest first, until what
// they hold covers count units of f, and starts their notice: state
// preempting until now + SpotNotice, reservation.preempting, and a notice
// command to the daemon of each of their nodes.
func (s *Service) preempt(ctx context.Context, tx pgx.Tx, r db.Reservation, f *api.Flavor, count int, now time.Time) error {
	q := db.New(tx)
	victims, err := q.SpotVictims(ctx, r.PoolID)
	if err != nil {
		return err
	}
	needVCPU, needMem, needNodes := int64(count)*f.Vcpu, int64(count)*f.MemoryMiB, int64(count)
	var chosen []db.SpotVictimsRow
	var vcpu, mem, nodes int64
	for _, v := range victims {
		if (r.Whole && nodes >= needNodes) || (!r.Whole && vcpu >= needVCPU && mem >= needMem) {
			break
		}
		chosen = append(chosen, v)
		vcpu, mem, nodes = vcpu+v.Vcpu, mem+v.MemoryMib, nodes+v.WholeNodes
	}
	if (r.Whole && nodes < needNodes) || (!r.Whole && (vcpu < needVCPU || mem < needMem)) {
		return errNotEnough
	}
	deadline := now.Add(s.SpotNotice)
	for _, v := range chosen {
		row, err := q.SetReservationState(ctx, db.SetReservationStateParams{ReservationID: v.ReservationID, State: StatePreempting, PreemptAt: &deadline})
		if err != nil {
			return err
		}
		if err := write(ctx, tx, api.EventReservationPreempting, row, api.ReservationPreemptingPayload{ReservationID: row.ReservationID, Deadline: wire.Time(deadline)}); err != nil {
			return err
		}
		nodeIDs, err := q.ReservationNodes(ctx, row.ReservationID)
		if err != nil {
			return err
		}
		args, _ := json.Marshal(map[string]any{"reservationId": row.ReservationID, "deadline": wire.Time(deadline), "reason": "preempted by an on-demand reservation"})
		for _, n := range nodeIDs {
			_, topic, err := nodework.EnqueueCommand(ctx, tx, n, agentproto.CommandNotice, args, "reservations", s.SpotNotice, now)
			if err != nil {
				return err
			}
			notify.Later(ctx, topic)
		}
	}
	return nil
}

// load reads a reservation of tenant.
func load(ctx context.Context, q *db.Queries, tenant, id string, forUpdate bool) (db.Reservation, error) {
	get := q.GetReservation
	if forUpdate {
		get = q.GetReservationForUpdate
	}
	r, err := get(ctx, id)
	return store.Visible(r, err, r.TenantID == tenant, notFound(id))
}

// Get answers reservations.get.
func (s *Service) Get(ctx context.Context, in *api.ReservationsGetInput) (*api.Reservation, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.ReservationID, false)
	if err != nil {
		return nil, err
	}
	return output(ctx, q, r)
}

// List answers reservations.list.
func (s *Service) List(ctx context.Context, in *api.ReservationsListInput) (*api.ReservationList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p := db.ListReservationsParams{TenantID: in.TenantID}
	if in.PoolID != nil {
		p.PoolID = pgtype.Text{String: *in.PoolID, Valid: true}
	}
	if in.State != nil {
		p.State = pgtype.Text{String: *in.State, Valid: true}
	}
	rows, err := q.ListReservations(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &api.ReservationList{Items: make([]api.Reservation, 0, len(rows))}
	for _, r := range rows {
		o, err := output(ctx, q, r)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, *o)
	}
	return out, nil
}

// Cancel answers reservations.cancel.
func (s *Service) Cancel(ctx context.Context, in *api.ReservationsCancelInput) (*api.Reservation, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.ReservationID, true)
	if err != nil {
		return nil, err
	}
	switch r.State {
	case StateEnded, StateCancelled, StateFailed, StatePreempted:
		return output(ctx, q, r)
	}
	if r, err = s.finish(ctx, tx, r, StateCancelled, ""); err != nil {
		return nil, err
	}
	if err := write(ctx, tx, api.EventReservationCancelled, r, api.ReservationCancelledPayload{ReservationID: r.ReservationID}); err != nil {
		return nil, err
	}
	return outputWith(r, nil), nil // finish released every booking: no node is left to read
}

// finish deletes the instances running in a reservation, releases its
// bookings (refunding quota), drops its queued placement items, closes its
// usage and sets its final state.
//
// Its instances and bookings are read in one pipeline; the bookings'
// releases and the final state go in another, the refunds, the items'
// drop and the usage's end held after it (store.Later): two round trips
// for a reservation whose units run no instance, whatever its count.
func (s *Service) finish(ctx context.Context, tx pgx.Tx, r db.Reservation, state, reason string) (db.Reservation, error) {
	var reads store.Pipeline
	var vms []db.Instance
	var bookings []string
	var vmsErr, bookingsErr error
	reads.Queue(func(q *db.Queries) {
		vms, vmsErr = q.ReservationInstances(ctx, pgtype.Text{String: r.ReservationID, Valid: true})
	})
	reads.Queue(func(q *db.Queries) { bookings, bookingsErr = q.ReservationBookings(ctx, r.ReservationID) })
	if err := reads.Send(ctx, tx); err != nil {
		return r, err
	}
	if err := errors.Join(vmsErr, bookingsErr); err != nil {
		return r, err
	}
	// The instances running in its units go with it.
	for _, vm := range vms {
		if _, err := instances.End(ctx, tx, s.Placer, vm); err != nil {
			return r, err
		}
	}
	var p store.Pipeline
	released := make([]*placement.Released, len(bookings))
	for i, b := range bookings {
		released[i] = s.Placer.QueueRelease(ctx, &p, b, nil)
	}
	var ended db.Reservation
	var endedErr error
	p.Queue(func(q *db.Queries) {
		ended, endedErr = q.SetReservationState(ctx, db.SetReservationStateParams{ReservationID: r.ReservationID, State: state,
			Error: pgtype.Text{String: reason, Valid: reason != ""}})
	})
	if err := p.Send(ctx, tx); err != nil {
		return r, err
	}
	for _, rel := range released {
		if err := rel.Refund(ctx, tx); err != nil {
			return r, err
		}
	}
	if endedErr != nil {
		return r, endedErr
	}
	for _, item := range r.PlacementItems {
		if _, err := store.Later(tx).Exec(ctx, `UPDATE placement_queue SET state = 'failed' WHERE item_id = $1 AND state = 'queued'`, item); err != nil {
			return r, err
		}
	}
	if err := usage.CloseOwner(ctx, tx, usage.Owner{Type: ResourceType, ID: r.ReservationID}, time.Time{}); err != nil {
		return r, err
	}
	return ended, nil
}

// waited follows the Waiting convention: after commit, until it is no
// longer queued.
func (s *Service) waited(ctx context.Context, q *db.Queries, r db.Reservation, wait *api.Wait) (*api.Reservation, error) {
	out, err := output(ctx, q, r)
	if err != nil {
		return nil, err
	}
	return s.then(ctx, r, out, wait), nil
}

// waitedWith is waited with the nodes of r's bookings known.
func (s *Service) waitedWith(ctx context.Context, r db.Reservation, nodes []string, wait *api.Wait) *api.Reservation {
	return s.then(ctx, r, outputWith(r, nodes), wait)
}

// then sets the wait of a queued reservation, if one was asked.
func (s *Service) then(ctx context.Context, r db.Reservation, out *api.Reservation, wait *api.Wait) *api.Reservation {
	if wait == nil || wait.TimeoutMs == 0 || r.State != StateQueued {
		return out
	}
	id, tenant := r.ReservationID, r.TenantID
	rpc.ThenWait(ctx, time.Duration(wait.TimeoutMs)*time.Millisecond, "", out, func(ctx context.Context) (any, bool) {
		q := db.New(s.Store.Pool())
		row, err := q.GetReservation(ctx, id)
		if err != nil || row.TenantID != tenant {
			return nil, false
		}
		o, err := output(ctx, q, row)
		if err != nil {
			return nil, false
		}
		return o, row.State != StateQueued
	})
	return out
}
