package placement

import (
	"context"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/ids"
	"computeplane/internal/store"
)

// Candidates is an admission's first read of the nodes that fit, queued
// in the caller's pipeline with its own first reads (QueueCandidates).
type Candidates struct {
	rows []db.PlacementCandidatesPackRow
	err  error
}

// QueueCandidates queues in p the read of the nodes of pool with room for
// its flavor (by name, read in the same statement: the caller learns the
// shape from the same pipeline) that offer network. Its answer is the first
// round of AdmitPipelined, which saves the candidates' round trip.
func (e *Engine) QueueCandidates(ctx context.Context, p *store.Pipeline, pool, flavor, network string) *Candidates {
	c := &Candidates{}
	params := db.PlacementCandidatesPackOfFlavorParams{PoolID: pool, Flavor: flavor, Network: text(networkAsked(network)),
		Lim: int32(e.topN * candidatesPerPick)}
	if e.w.Spread <= e.w.Pack {
		p.Queue(func(q *db.Queries) {
			rows, err := q.PlacementCandidatesPackOfFlavor(ctx, params)
			c.rows, c.err = make([]db.PlacementCandidatesPackRow, len(rows)), err
			for i, r := range rows {
				c.rows[i] = db.PlacementCandidatesPackRow(r)
			}
		})
		return c
	}
	p.Queue(func(q *db.Queries) {
		rows, err := q.PlacementCandidatesSpreadOfFlavor(ctx, db.PlacementCandidatesSpreadOfFlavorParams(params))
		c.rows, c.err = make([]db.PlacementCandidatesPackRow, len(rows)), err
		for i, r := range rows {
			c.rows[i] = db.PlacementCandidatesPackRow(r)
		}
	})
	return c
}

// AdmitPipelined is Admit in fewer round trips: the candidates are first's
// (QueueCandidates, read for req's shape; nil reads them), and the booking
// of the best one, the quota charges and the caller's next statements
// (then queues them in p, for booking b) go out in one pipeline behind a
// savepoint. When that node was filled or held meanwhile, or a charge is
// refused, the savepoint is rolled back and the admission goes as Admit
// does (then is called again for the booking it makes).
//
// A nil booking is an admission refused (or a database error); with a
// booking the error is the pipeline's (a statement of then failed: its
// own outcome is what then kept).
func (e *Engine) AdmitPipelined(ctx context.Context, tx pgx.Tx, req Request, first *Candidates,
	then func(p *store.Pipeline, b *Booking)) (*Booking, error) {
	if req.Whole || req.NodeID != "" || first == nil || first.err != nil || len(first.rows) == 0 {
		return e.admitThen(ctx, tx, req, then)
	}
	n := e.order(first.rows)[0]
	sp, err := tx.Begin(ctx) // held: it travels with the pipeline
	if err != nil {
		return nil, err
	}
	b := &Booking{ID: ids.New("bkg"), NodeID: n.NodeID, Shape: req.Shape}
	var booked int64
	var bookErr error
	var p store.Pipeline
	p.Queue(func(q *db.Queries) {
		booked, bookErr = q.BookNode(ctx, db.BookNodeParams{
			BookingID: b.ID, NodeID: n.NodeID, PoolID: req.PoolID, TenantID: req.TenantID,
			OwnerType: req.Owner.Type, OwnerID: req.Owner.ID,
			Vcpu: req.Shape.VCPU, MemoryMib: req.Shape.MemoryMiB, DiskGib: req.Shape.DiskGiB, Gpus: req.Shape.GPUs, Until: req.Until,
		})
	})
	cs := charges(req.Shape, req)
	refused, chargeErr := queueCharge(ctx, &p, req.TenantID, req.PoolID, cs)
	then(&p, b)
	sendErr := p.Send(ctx, sp)
	switch {
	case bookErr != nil:
		return nil, bookErr
	case booked == 0 || *refused >= 0:
		// Filled or held by another transaction, or a charge refused (the
		// statements after it ran): undo all of it and admit as Admit does,
		// which reads again and explains a refusal.
		if err := sp.Rollback(ctx); err != nil {
			return nil, err
		}
		return e.admitThen(ctx, tx, req, then)
	case *chargeErr != nil:
		return nil, *chargeErr
	}
	if err := sp.Commit(ctx); err != nil { // held: RELEASE travels with the next statement
		return nil, err
	}
	return b, sendErr
}

// admitThen is Admit followed by then's statements in one pipeline.
func (e *Engine) admitThen(ctx context.Context, tx pgx.Tx, req Request, then func(p *store.Pipeline, b *Booking)) (*Booking, error) {
	b, err := e.Admit(ctx, tx, req)
	if err != nil {
		return nil, err
	}
	var p store.Pipeline
	then(&p, b)
	return b, p.Send(ctx, tx)
}

// queueCharge queues the charges cs (as charge sends them, one statement)
// in p; after the pipeline is sent, refused is the first charge refused
// (-1: none) and failed a database error.
func queueCharge(ctx context.Context, p *store.Pipeline, tenant, pool string, cs []charge) (refused *int, failed *error) {
	params := chargeParams(tenant, pool, cs)
	r, f := -1, error(nil)
	p.Queue(func(q *db.Queries) {
		charged, err := q.ChargeQuotas(ctx, params)
		r, f = -1, err
		if err == nil {
			r = firstRefused(cs, charged)
		}
	})
	return &r, &f
}

// QueueChargeCount queues ChargeCount's charges in p (so they travel with
// the statements after them); given the pipeline's error once it is sent,
// result answers what ChargeCount would have: nil, QUOTA_EXCEEDED (read
// then, unless the pipeline failed: its error is the answer) or the
// charge's own error. A refusal does not stop the statements queued after
// it: the caller, refused, rolls its transaction back.
func (e *Engine) QueueChargeCount(ctx context.Context, p *store.Pipeline, tx pgx.Tx, tenant, pool string, count map[string]int64) (result func(sent error) error) {
	cs := charges(Shape{}, Request{Count: count})
	refused, failed := queueCharge(ctx, p, tenant, pool, cs)
	return func(sent error) error {
		switch {
		case *failed != nil || *refused < 0:
			return *failed
		case sent != nil:
			return sent
		}
		return quotaExceeded(ctx, db.New(tx), tenant, pool, cs[*refused])
	}
}
