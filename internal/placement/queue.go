package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/ids"
	"computeplane/internal/workers"
)

// Queue states (capacity.placer pool-lease).
const (
	ItemQueued = "queued"
	ItemPlaced = "placed"
	ItemFailed = "failed"
)

// Item is a queued admission and what became of it.
type Item struct {
	ID        string
	State     string
	Attempts  int32
	BookingID string
	NodeID    string
	// Error is the refusal of a failed item: code, message, details.
	Error *api.Error
}

// Enqueue writes req as a queued admission of its pool, in tx: the pool's
// worker places it with PlaceBatch (capacity.placer pool-lease). Quota is
// charged when it is placed, so used never passes max whatever waits.
func (e *Engine) Enqueue(ctx context.Context, tx pgx.Tx, req Request) (string, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	id := ids.New("plc")
	return id, db.New(tx).EnqueuePlacement(ctx, db.EnqueuePlacementParams{ItemID: id, PoolID: req.PoolID, TenantID: req.TenantID, Request: raw})
}

// GetItem returns a queued admission's state.
func GetItem(ctx context.Context, q *db.Queries, id string) (*Item, error) {
	r, err := q.GetPlacement(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeNotFound, "placement %s not found", id)
	}
	if err != nil {
		return nil, err
	}
	it := &Item{ID: r.ItemID, State: r.State, Attempts: r.Attempts, BookingID: r.BookingID.String, NodeID: r.NodeID.String}
	if len(r.Error) > 0 {
		it.Error = &api.Error{}
		if err := json.Unmarshal(r.Error, it.Error); err != nil {
			return nil, err
		}
	}
	return it, nil
}

// PlaceBatch places at most max queued admissions of pool, oldest first,
// in tx: each in a savepoint, so one refusal leaves the others. An item
// that finds no room stays queued for the next batch until it has been
// tried capacity.maxAttempts times; a refusal of another kind (a spent
// quota, an archived pool) fails it at once. It returns how many items it
// decided; a database error rolls the whole batch back.
func (e *Engine) PlaceBatch(ctx context.Context, tx pgx.Tx, pool string, max int) (int, error) {
	q := db.New(tx)
	items, err := q.ClaimQueued(ctx, db.ClaimQueuedParams{PoolID: pool, Lim: int32(max)})
	if err != nil {
		return 0, err
	}
	for _, it := range items {
		var req Request
		if err := json.Unmarshal(it.Request, &req); err != nil {
			return 0, fmt.Errorf("placement: queued item %s: %w", it.ItemID, err)
		}
		d := db.DecidePlacementParams{ItemID: it.ItemID}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return 0, err
		}
		b, err := e.Admit(ctx, sp, req)
		var refused *api.Error
		switch {
		case err == nil:
			if err := sp.Commit(ctx); err != nil {
				return 0, err
			}
			d.State = ItemPlaced
			d.BookingID = pgtype.Text{String: b.ID, Valid: true}
			d.NodeID = pgtype.Text{String: b.NodeID, Valid: true}
		case errors.As(err, &refused):
			if err := sp.Rollback(ctx); err != nil {
				return 0, err
			}
			d.State = ItemFailed
			if refused.Code == api.CodeCapacityUnavailable && int(it.Attempts)+1 < e.attempts {
				d.State = ItemQueued
			}
			if d.Error, err = json.Marshal(refused); err != nil {
				return 0, err
			}
		default:
			_ = sp.Rollback(ctx)
			return 0, err
		}
		if err := q.DecidePlacement(ctx, d); err != nil {
			return 0, err
		}
	}
	return len(items), nil
}

// Queue is the reconciler of the pool-lease placer: its keys are the pools
// with queued admissions; the worker holding a pool's shard places them in
// batches of MaxBatch (capacity.maxBatch) under the shard's lease.
type Queue struct {
	Engine   *Engine
	Store    interface{ Queries() *db.Queries }
	WithTx   func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error
	MaxBatch int
}

var _ workers.Reconciler = (*Queue)(nil)

// ReconcilerName is the name the queue is registered under.
const ReconcilerName = "placement"

// Keys lists the pools of shard with queued admissions.
func (qu *Queue) Keys(ctx context.Context, shard int) ([]string, error) {
	pools, err := qu.Store.Queries().QueuedPools(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pools {
		if workers.ShardOf(p) == shard {
			out = append(out, p)
		}
	}
	return out, nil
}

// batchesPerSync bounds the batches one Sync places before it yields to
// the other keys of the shard.
const batchesPerSync = 16

// Sync places batches of the pool, each in its own fenced transaction,
// until one is not full; after batchesPerSync full ones it asks to be
// synced again.
func (qu *Queue) Sync(ctx context.Context, l workers.Lease, pool string) (workers.Result, error) {
	for range batchesPerSync {
		n := 0
		err := qu.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) (err error) {
			if err := l.Fence(ctx, tx); err != nil {
				return err
			}
			n, err = qu.Engine.PlaceBatch(ctx, tx, pool, qu.MaxBatch)
			return err
		})
		if err != nil || n < qu.MaxBatch {
			return workers.Done, err
		}
	}
	return workers.SyncAgain, nil
}

// TopicQueued is woken after an admission was queued, so that the workers
// holding the pool's shard place it at once instead of at their next
// resync.
const TopicQueued = "placement-queued"

// Kick asks enqueue (workers.Runner.Enqueue, which ignores the keys of
// shards this process does not hold) to sync every pool with queued
// admissions.
func (qu *Queue) Kick(ctx context.Context, enqueue func(name, key string)) error {
	pools, err := qu.Store.Queries().QueuedPools(ctx)
	if err != nil {
		return err
	}
	for _, p := range pools {
		enqueue(ReconcilerName, p)
	}
	return nil
}
