// Package placement is the one placement engine: every admission that needs
// capacity (instances, reservations, sandboxes, volumes) books it here, in
// the admission's own transaction, and every release gives it back.
//
// An admission filters the pool's ready nodes (room for the shape, GPU
// model, a pinned node such as a volume's host), scores the best few with
// the configured weights, picks one of the top N at random so concurrent
// admissions do not herd onto one node, books it with one conditional
// UPDATE, and charges the tenant's quota rows last (the hot rows of a
// tenant are then locked only for the end of the transaction). The
// database has the last word: a node's booked amounts cannot pass its
// capacity (vCPU: its allocatable figure, capacity times the pool's
// vCPU allocation ratio; memory is never overcommitted), a quota's used cannot pass its max, and whole-node bookings
// of one node cannot overlap (migrations/00011_fleet.sql), so a bug here
// can fail an admission but never over-commit.
package placement

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/config"
	"computeplane/internal/ids"
	"computeplane/internal/store"
)

// Quota resources.
const (
	ResourceVCPU      = "vcpu"
	ResourceMemoryMiB = "memoryMiB"
	ResourceDiskGiB   = "diskGiB"
	ResourceGPUs      = "gpus"
	ResourceInstances = "instances"
	ResourceSandboxes = "sandboxes"
	ResourceNodes     = "nodes"
)

// Resources lists every quota resource, in the order rows are charged.
var Resources = []string{ResourceDiskGiB, ResourceGPUs, ResourceInstances, ResourceMemoryMiB, ResourceNodes, ResourceSandboxes, ResourceVCPU}

// Shape is what a booking holds on one node.
type Shape struct {
	VCPU      int32
	MemoryMiB int64
	DiskGiB   int64
	GPUs      int32
	GPUModel  string // required model when GPUs > 0; "" for any
}

// Owner is what a booking is for.
type Owner struct {
	Type string // instance, reservation, sandbox, volume ...
	ID   string
}

// Request is one admission.
type Request struct {
	TenantID, PoolID string
	Owner            Owner
	Shape            Shape
	// Whole books an entire empty node (metal reservations); Shape is then
	// taken from the node.
	Whole bool
	// NodeID pins the booking to one node (a volume's host); "" places
	// anywhere in the pool.
	NodeID string
	// Count charges counted resources besides the shape's (instances: 1).
	Count map[string]int64
	// Until ends the booking's time range; nil leaves it open.
	Until *time.Time
	// Network is the VM network mode the booking's VM asks for (egress,
	// private): only a node whose hello offers it takes the VM. "" and
	// none ask nothing.
	Network string
}

// Booking is capacity held on one node.
type Booking struct {
	ID     string
	NodeID string
	Shape  Shape
	Whole  bool
}

// Weights are the scorers' weights; both zero means pack.
type Weights struct {
	// Pack prefers the most used nodes (bin packing: fewer nodes busy).
	Pack float64
	// Spread prefers the least used nodes (spreading load and failures).
	Spread float64
}

// Options configure an Engine.
type Options struct {
	Weights Weights
	// TopN is how many of the best-scored nodes one is picked from at
	// random (scheduler.topN, default 5).
	TopN int
	// Attempts bounds how often an admission looks again after the nodes it
	// picked filled up under it (capacity.maxAttempts, default 3).
	Attempts int
}

// Engine places admissions. It holds no state of its own: every fact is in
// the database, so any number of processes can place into one pool.
type Engine struct {
	w        Weights
	topN     int
	attempts int
}

// Scorer names in scheduler.weights.
const (
	ScorerPack   = "pack"
	ScorerSpread = "spread"
)

// OptionsFrom reads the engine's options from the deployment's
// configuration: scheduler.weights (pack, spread), scheduler.topN and
// capacity.maxAttempts.
func OptionsFrom(c *config.Config) Options {
	return Options{
		Weights:  Weights{Pack: c.Scheduler.Weights[ScorerPack], Spread: c.Scheduler.Weights[ScorerSpread]},
		TopN:     c.Scheduler.TopN,
		Attempts: c.Capacity.MaxAttempts,
	}
}

// New returns an engine.
func New(o Options) *Engine {
	if o.Weights == (Weights{}) {
		o.Weights.Pack = 1
	}
	if o.TopN <= 0 {
		o.TopN = 5
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	return &Engine{w: o.Weights, topN: o.TopN, attempts: o.Attempts}
}

// candidatesPerPick is how many more candidates than TopN are read and
// scored, so the weights have room to reorder what the index returns.
const candidatesPerPick = 4

// Admit books capacity for req in tx and charges the tenant's quota. Any
// error leaves tx to be rolled back by the caller; the error is
// CAPACITY_UNAVAILABLE or QUOTA_EXCEEDED (with details) or a database
// error.
func (e *Engine) Admit(ctx context.Context, tx pgx.Tx, req Request) (*Booking, error) {
	q := db.New(tx)
	b, err := e.book(ctx, q, req, "")
	if err != nil {
		return nil, err
	}
	if err := e.charge(ctx, q, req.TenantID, req.PoolID, charges(b.Shape, req)); err != nil {
		return nil, err
	}
	return b, nil
}

// HeldWait bounds how long an admission keeps looking when the nodes that
// would take it are held (row-locked) by other transactions (a node's
// status write, another admission) rather than full: those rounds do not
// count as attempts, or a node's own heartbeat could refuse work it has
// room for.
const HeldWait = 2 * time.Second

// book finds a node for req (other than exclude) and books it.
func (e *Engine) book(ctx context.Context, q *db.Queries, req Request, exclude string) (*Booking, error) {
	shape := req.Shape
	start := time.Now()
	var tried []string // the nodes the last round could not book
	for round, filled := 0, 0; ; round++ {
		if round > 0 {
			// Every candidate was taken or held by a concurrent
			// transaction: look again after a moment.
			if err := pause(ctx, round); err != nil {
				return nil, err
			}
		}
		rows, err := e.candidates(ctx, q, db.PlacementCandidatesPackParams{
			PoolID: req.PoolID, Vcpu: shape.VCPU, MemoryMib: shape.MemoryMiB, DiskGib: shape.DiskGiB, Gpus: shape.GPUs,
			GpuModel: text(shape.GPUModel), NodeID: text(req.NodeID), Whole: req.Whole, Lim: int32(e.topN * candidatesPerPick),
			Network: text(networkAsked(req.Network)),
		})
		if err != nil {
			return nil, err
		}
		rows = slices.DeleteFunc(rows, func(n db.PlacementCandidatesPackRow) bool { return n.NodeID == exclude })
		if len(rows) == 0 {
			return nil, e.refusal(ctx, q, req)
		}
		if tried != nil {
			// A node tried last round that still fits was held, not
			// filled: only filled rounds count as attempts.
			held := slices.ContainsFunc(rows, func(n db.PlacementCandidatesPackRow) bool { return slices.Contains(tried, n.NodeID) })
			if !held {
				filled++
			}
			if filled >= e.attempts || (held && time.Since(start) > HeldWait) {
				return nil, e.refusal(ctx, q, req)
			}
		}
		tried = tried[:0]
		for _, n := range e.order(rows) {
			held := shape
			if req.Whole {
				// The whole node: its vCPU as the pool's ratio allocates it.
				held = Shape{VCPU: n.AllocVcpu, MemoryMiB: n.CapMemoryMib, DiskGiB: n.CapDiskGib, GPUs: n.CapGpus, GPUModel: shape.GPUModel}
			}
			b := &Booking{ID: ids.New("bkg"), NodeID: n.NodeID, Shape: held, Whole: req.Whole}
			booked, err := q.BookNode(ctx, db.BookNodeParams{
				BookingID: b.ID, NodeID: n.NodeID, PoolID: req.PoolID, TenantID: req.TenantID,
				OwnerType: req.Owner.Type, OwnerID: req.Owner.ID, Whole: req.Whole,
				Vcpu: held.VCPU, MemoryMib: held.MemoryMiB, DiskGib: held.DiskGiB, Gpus: held.GPUs, Until: req.Until,
			})
			if err != nil {
				return nil, err
			}
			if booked == 0 {
				tried = append(tried, n.NodeID)
				continue // filled or held by another transaction: the next one
			}
			return b, nil
		}
	}
}

// Move moves a live booking to another node of its pool (toNode, or the
// best other one when ""), in tx: the old booking is released, a new one
// made for the same owner and shape; the tenant's quota is unchanged. When
// no other node has room, nothing moves (CAPACITY_UNAVAILABLE).
func (e *Engine) Move(ctx context.Context, tx pgx.Tx, bookingID, toNode string) (*Booking, error) {
	q := db.New(tx)
	r, err := q.ReleaseBooking(ctx, bookingID) // and its node's amounts
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeNotFound, "booking %s is not held", bookingID)
	}
	if err != nil {
		return nil, err
	}
	req := Request{
		TenantID: r.TenantID, PoolID: r.PoolID, Owner: Owner{Type: r.OwnerType, ID: r.OwnerID}, Whole: r.Whole, NodeID: toNode,
		Shape: Shape{VCPU: r.Vcpu, MemoryMiB: r.MemoryMib, DiskGiB: r.DiskGib, GPUs: r.Gpus},
	}
	b, err := e.book(ctx, q, req, r.NodeID)
	var refused *api.Error
	if errors.As(err, &refused) && refused.Code == api.CodeQuotaExceeded {
		return nil, noCapacity(req) // a move charges nothing: what failed is room
	}
	return b, err
}

// refusal explains an admission that found no room: an archived or missing
// pool first, then a spent quota (the answer the tenant can act on), then
// the pool's capacity.
func (e *Engine) refusal(ctx context.Context, q *db.Queries, req Request) error {
	pool, err := q.GetPool(ctx, req.PoolID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return api.Errorf(api.CodeNotFound, "poolId: pool %s not found", req.PoolID)
	case err != nil:
		return err
	case pool.Archived:
		return api.Errorf(api.CodeInvalidState, "pool %s is archived: it takes no new work", req.PoolID)
	}
	held := req.Shape
	if req.Whole {
		held = Shape{}
	}
	if err := e.refusalOfQuota(ctx, q, req.TenantID, req.PoolID, charges(held, req)); err != nil {
		return err
	}
	if req.NodeID != "" {
		// A node that is not ready takes nothing, room or not: say so
		// rather than blame its room.
		n, err := q.GetNode(ctx, req.NodeID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if err == nil && n.Node.State != "ready" {
			return api.Errorf(api.CodeCapacityUnavailable, "node %s is %s: it takes no new work until it is ready", req.NodeID, n.Node.State).
				WithDetails(map[string]any{"poolId": req.PoolID, "nodeId": req.NodeID, "state": n.Node.State})
		}
		if err == nil {
			if err := CheckNodeNetwork(ctx, q, req.NodeID, req.Network); err != nil {
				return err
			}
		}
	} else if mode := networkAsked(req.Network); mode != "" {
		// No node offering the mode is another answer than no room.
		n, err := q.PoolNodesOffering(ctx, db.PoolNodesOfferingParams{PoolID: req.PoolID, Network: mode})
		if err != nil {
			return err
		}
		if n == 0 {
			return api.Errorf(api.CodeCapacityUnavailable, "no ready node of pool %s offers network %s (its nodes run compute-agent with --network none%s)",
				req.PoolID, mode, underlayHint(mode)).WithDetails(map[string]any{"poolId": req.PoolID, "network": mode})
		}
	}
	return noCapacity(req)
}

// Release gives a booking's capacity back to its node and refunds the
// tenant's quota, in tx. extra refunds the counted resources the admission
// charged besides the shape (as Request.Count). Releasing a booking twice
// is NOT_FOUND the second time.
//
// The booking and its node are one statement (ReleaseBooking), the
// refunds another (RefundQuotas), held to travel with tx's next statement
// or its COMMIT (store.Later): a release costs one round trip, none of its
// own when the caller queues it with its next statements (QueueRelease).
func (e *Engine) Release(ctx context.Context, tx pgx.Tx, bookingID string, extra map[string]int64) error {
	var p store.Pipeline
	r := e.QueueRelease(ctx, &p, bookingID, extra)
	if err := p.Send(ctx, tx); err != nil {
		return err
	}
	return r.Refund(ctx, tx)
}

// Released is a release queued in the caller's pipeline (QueueRelease).
type Released struct {
	id    string
	extra map[string]int64
	row   db.ReleaseBookingRow
	err   error
}

// QueueRelease queues in p the statement of Release that gives a
// booking's capacity back to its node, so that it travels with the
// caller's statements after it (an instance's deletion: its desired state
// and its node's spec reads); Refund, once p is sent, refunds the quota.
func (e *Engine) QueueRelease(ctx context.Context, p *store.Pipeline, bookingID string, extra map[string]int64) *Released {
	r := &Released{id: bookingID, extra: extra}
	p.Queue(func(q *db.Queries) { r.row, r.err = q.ReleaseBooking(ctx, bookingID) })
	return r
}

// Refund refunds, in tx, what the released booking held and the counted
// resources given to QueueRelease, held as Release's refunds are. A
// booking not held (released already) is NOT_FOUND.
func (r *Released) Refund(ctx context.Context, tx pgx.Tx) error {
	if errors.Is(r.err, pgx.ErrNoRows) {
		return api.Errorf(api.CodeNotFound, "booking %s is not held", r.id)
	}
	if r.err != nil {
		return r.err
	}
	b := r.row
	held := Shape{VCPU: b.Vcpu, MemoryMiB: b.MemoryMib, DiskGiB: b.DiskGib, GPUs: b.Gpus}
	return refund(ctx, tx, b.TenantID, b.PoolID, charges(held, Request{Whole: b.Whole, Count: r.extra}))
}

// ChargeCount charges counted resources alone, in tx: work that runs in
// capacity already booked and charged (an instance in a reservation's
// unit) still counts against its own quota (instances: 1).
func (e *Engine) ChargeCount(ctx context.Context, tx pgx.Tx, tenant, pool string, count map[string]int64) error {
	return e.charge(ctx, db.New(tx), tenant, pool, charges(Shape{}, Request{Count: count}))
}

// RefundCount gives back what ChargeCount charged, held as Release's
// refunds are.
func (e *Engine) RefundCount(ctx context.Context, tx pgx.Tx, tenant, pool string, count map[string]int64) error {
	return refund(ctx, tx, tenant, pool, charges(Shape{}, Request{Count: count}))
}

// refund gives cs back in one statement (RefundQuotas), which locks the
// rows in the order of Resources as a charge does. Nothing is read back,
// so it is held (store.Later): a refund that fails (past what is used)
// fails tx's next statement or its COMMIT instead, and the call with it.
func refund(ctx context.Context, tx pgx.Tx, tenant, pool string, cs []charge) error {
	if len(cs) == 0 {
		return nil
	}
	p := chargeParams(tenant, pool, cs)
	return db.New(store.Later(tx)).RefundQuotas(ctx, db.RefundQuotasParams(p))
}

type charge struct {
	resource string
	amount   int64
}

// charges lists what an admission charges, in the order of Resources. A
// whole-node booking is charged as one node, a slice by its shape.
func charges(held Shape, req Request) []charge {
	amounts := map[string]int64{}
	if req.Whole {
		amounts[ResourceNodes] = 1
	} else {
		amounts[ResourceVCPU] = int64(held.VCPU)
		amounts[ResourceMemoryMiB] = held.MemoryMiB
		amounts[ResourceDiskGiB] = held.DiskGiB
		amounts[ResourceGPUs] = int64(held.GPUs)
	}
	for r, n := range req.Count {
		amounts[r] += n
	}
	var out []charge
	for _, r := range Resources {
		if n := amounts[r]; n > 0 {
			out = append(out, charge{r, n})
		}
	}
	return out
}

// charge charges cs in one statement (ChargeQuotas), in the order of
// Resources, so that concurrent admissions lock a tenant's quota rows in
// one order; the first charge refused names the refusal.
func (e *Engine) charge(ctx context.Context, q *db.Queries, tenant, pool string, cs []charge) error {
	charged, err := q.ChargeQuotas(ctx, chargeParams(tenant, pool, cs))
	if err != nil {
		return err
	}
	if i := firstRefused(cs, charged); i >= 0 {
		return quotaExceeded(ctx, q, tenant, pool, cs[i])
	}
	return nil
}

// chargeParams is cs as ChargeQuotas takes them.
func chargeParams(tenant, pool string, cs []charge) db.ChargeQuotasParams {
	p := db.ChargeQuotasParams{TenantID: tenant, PoolID: pool, Resources: make([]string, len(cs)), Amounts: make([]int64, len(cs))}
	for i, c := range cs {
		p.Resources[i], p.Amounts[i] = c.resource, c.amount
	}
	return p
}

// firstRefused is the index in cs of the first charge ChargeQuotas did not
// make (charged holds the 1-based positions it made), -1 when it made all.
func firstRefused(cs []charge, charged []pgtype.Int4) int {
	made := make([]bool, len(cs))
	for _, c := range charged {
		if i := int(c.Int32) - 1; c.Valid && i >= 0 && i < len(cs) {
			made[i] = true
		}
	}
	for i, ok := range made {
		if !ok {
			return i
		}
	}
	return -1
}

// refusalOfQuota names the first charge of cs the tenant's quota refuses,
// or nil when every one fits.
func (e *Engine) refusalOfQuota(ctx context.Context, q *db.Queries, tenant, pool string, cs []charge) error {
	for _, c := range cs {
		row, err := q.GetQuota(ctx, db.GetQuotaParams{TenantID: tenant, PoolID: pool, Resource: c.resource})
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && (!row.Offered || row.Used+c.amount > row.Max)) {
			return quotaExceeded(ctx, q, tenant, pool, c)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// quotaExceeded explains a refused charge: no row (grants nothing), a pool
// no longer offered, or max reached.
func quotaExceeded(ctx context.Context, q *db.Queries, tenant, pool string, c charge) error {
	details := map[string]any{"resource": c.resource, "requested": c.amount}
	row, err := q.GetQuota(ctx, db.GetQuotaParams{TenantID: tenant, PoolID: pool, Resource: c.resource})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		details["max"], details["used"] = 0, 0
		return api.Errorf(api.CodeQuotaExceeded, "tenant %s has no %s quota in pool %s", tenant, c.resource, pool).WithDetails(details)
	case err != nil:
		return err
	case !row.Offered:
		return api.Errorf(api.CodeQuotaExceeded, "pool %s is no longer offered to tenant %s", pool, tenant).WithDetails(details)
	}
	details["max"], details["used"] = row.Max, row.Used
	return api.Errorf(api.CodeQuotaExceeded, "%s quota of tenant %s in pool %s is spent: %d of %d used, %d more asked",
		c.resource, tenant, pool, row.Used, row.Max, c.amount).WithDetails(details)
}

// networkAsked is the mode a request's VM asks a node for, "" for none.
func networkAsked(mode string) string {
	if mode == "none" {
		return ""
	}
	return mode
}

func underlayHint(mode string) string {
	if mode == "private" {
		return " or without an underlay address"
	}
	return ""
}

// CheckNodeNetwork refuses, CAPACITY_UNAVAILABLE, a VM asking for a
// network mode on a node that does not offer it (a VM placed on a given
// node: a reservation's unit, a volume's host).
func CheckNodeNetwork(ctx context.Context, q *db.Queries, node, mode string) error {
	mode = networkAsked(mode)
	if mode == "" {
		return nil
	}
	offers, err := q.NodeOffers(ctx, db.NodeOffersParams{NodeID: node, Network: mode})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if !offers {
		return api.Errorf(api.CodeCapacityUnavailable, "node %s does not offer network %s (it runs compute-agent with --network none%s)",
			node, mode, underlayHint(mode)).WithDetails(map[string]any{"nodeId": node, "network": mode})
	}
	return nil
}

func noCapacity(req Request) error {
	s := req.Shape
	details := map[string]any{
		"poolId": req.PoolID, "vcpu": s.VCPU, "memoryMiB": s.MemoryMiB, "diskGiB": s.DiskGiB, "gpus": s.GPUs,
	}
	what := fmt.Sprintf("%d vCPU, %d MiB, %d GiB disk", s.VCPU, s.MemoryMiB, s.DiskGiB)
	if s.GPUs > 0 {
		details["gpuModel"] = s.GPUModel
		what += fmt.Sprintf(", %d GPU %s", s.GPUs, s.GPUModel)
	}
	if req.Whole {
		details["whole"] = true
		what = "a whole empty node"
	}
	if mode := networkAsked(req.Network); mode != "" {
		details["network"] = mode
		what += ", network " + mode
	}
	if req.NodeID != "" {
		details["nodeId"] = req.NodeID
		return api.Errorf(api.CodeCapacityUnavailable, "node %s has no room for %s", req.NodeID, what).WithDetails(details)
	}
	return api.Errorf(api.CodeCapacityUnavailable, "no ready node of pool %s has room for %s", req.PoolID, what).WithDetails(details)
}

// candidates reads the nodes that fit, in the index order of the heavier
// scorer (pack: least free first; spread: most free first).
func (e *Engine) candidates(ctx context.Context, q *db.Queries, p db.PlacementCandidatesPackParams) ([]db.PlacementCandidatesPackRow, error) {
	if e.w.Spread <= e.w.Pack {
		return q.PlacementCandidatesPack(ctx, p)
	}
	rows, err := q.PlacementCandidatesSpread(ctx, db.PlacementCandidatesSpreadParams(p))
	out := make([]db.PlacementCandidatesPackRow, len(rows))
	for i, r := range rows {
		out[i] = db.PlacementCandidatesPackRow(r)
	}
	return out, err
}

// order scores candidates and returns them best first, the first pick
// drawn at random from the top N.
func (e *Engine) order(rows []db.PlacementCandidatesPackRow) []db.PlacementCandidatesPackRow {
	score := func(n db.PlacementCandidatesPackRow) float64 {
		used := 1 - (frac(n.FreeVcpu, n.AllocVcpu)+frac64(n.FreeMemoryMib, n.CapMemoryMib))/2
		return e.w.Pack*used + e.w.Spread*(1-used)
	}
	slices.SortStableFunc(rows, func(a, b db.PlacementCandidatesPackRow) int {
		switch sa, sb := score(a), score(b); {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return 0
	})
	if top := min(e.topN, len(rows)); top > 1 {
		i := rand.IntN(top)
		rows[0], rows[i] = rows[i], rows[0]
	}
	return rows
}

func frac(free, capacity int32) float64 {
	if capacity <= 0 {
		return 0
	}
	return float64(free) / float64(capacity)
}

func frac64(free, capacity int64) float64 {
	if capacity <= 0 {
		return 0
	}
	return float64(free) / float64(capacity)
}

// pause waits a few random milliseconds, more after each attempt.
func pause(ctx context.Context, attempt int) error {
	t := time.NewTimer(time.Duration(1+rand.IntN(min(4*attempt, 50))) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }
