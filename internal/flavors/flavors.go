// Package flavors implements the flavors group: the sizes work is made in,
// per pool. An archived flavor refuses new work; what runs in it lives on.
package flavors

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/pools"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Service implements api.FlavorsService.
type Service struct{}

var _ api.FlavorsService = Service{}

func output(r db.Flavor) *api.Flavor {
	f := &api.Flavor{
		PoolID: r.PoolID, Name: r.Name, Vcpu: int64(r.Vcpu), MemoryMiB: r.MemoryMib, DiskGiB: r.DiskGib,
		Archived: r.Archived, CreatedAt: wire.Time(r.CreatedAt),
	}
	if r.GpuModel.Valid {
		f.Gpus = &api.GPUs{Model: r.GpuModel.String, Count: int64(r.Gpus)}
	}
	return f
}

// NotFound answers a flavor pool does not have.
func NotFound(pool, name string) error { return notFound(pool, name) }

func notFound(pool, name string) error {
	return api.Errorf(api.CodeNotFound, "flavor %s not found in pool %s", name, pool)
}

// Get loads a flavor of a pool tenant owns or is offered, for the modules
// that make work in it (an archived one is INVALID_STATE for them).
func Get(ctx context.Context, q *db.Queries, tenant, pool, name string) (*api.Flavor, error) {
	if _, err := pools.Readable(ctx, q, tenant, pool); err != nil {
		return nil, err
	}
	return OfPool(ctx, q, pool, name)
}

// InPool is pools.Readable and OfPool in one statement, with the
// transaction's time: the pool (NOT_FOUND unless tenant owns it or is
// offered it) and its flavor name, nil when it has none (the caller
// answers NotFound where it would have read the flavor, after its checks
// of the pool).
func InPool(ctx context.Context, q *db.Queries, tenant, pool, name string) (db.Pool, *api.Flavor, time.Time, error) {
	r := &PoolRead{tenant: tenant, pool: pool}
	r.row, r.err = q.PoolFlavor(ctx, db.PoolFlavorParams{TenantID: tenant, PoolID: pool, Flavor: name})
	return r.Result(ctx, q)
}

// PoolRead is InPool's statement sent in a pipeline with others (a
// create's idempotency read): Result answers as InPool once it is sent.
type PoolRead struct {
	tenant, pool string
	row          db.PoolFlavorRow
	err          error
}

// QueueInPool queues InPool's statement in p.
func QueueInPool(ctx context.Context, p *store.Pipeline, tenant, pool, name string) *PoolRead {
	r := &PoolRead{tenant: tenant, pool: pool}
	p.Queue(func(q *db.Queries) {
		r.row, r.err = q.PoolFlavor(ctx, db.PoolFlavorParams{TenantID: tenant, PoolID: pool, Flavor: name})
	})
	return r
}

// Result is InPool's answer from the statement read.
func (r *PoolRead) Result(ctx context.Context, q *db.Queries) (db.Pool, *api.Flavor, time.Time, error) {
	row, err, tenant, pool := r.row, r.err, r.tenant, r.pool
	if errors.Is(err, pgx.ErrNoRows) {
		// No pool: the time still (a caller may check its input first).
		if row.Now, err = q.Now(ctx); err != nil {
			return db.Pool{}, nil, time.Time{}, err
		}
		err = pgx.ErrNoRows
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && row.Pool.TenantID != tenant && !row.Offered):
		return db.Pool{}, nil, row.Now, pools.NotFound(pool)
	case err != nil:
		return db.Pool{}, nil, time.Time{}, err
	case !row.FlavorName.Valid:
		return row.Pool, nil, row.Now, nil
	}
	return row.Pool, output(db.Flavor{PoolID: pool, Name: row.FlavorName.String, Vcpu: row.FlavorVcpu.Int32, MemoryMib: row.FlavorMemoryMib.Int64,
		DiskGib: row.FlavorDiskGib.Int64, GpuModel: row.FlavorGpuModel, Gpus: row.FlavorGpus.Int32, Archived: row.FlavorArchived.Bool,
		CreatedAt: *row.FlavorCreatedAt}), row.Now, nil
}

// OfPool reads a flavor of a pool the caller has already read through
// pools.Readable (a second read of the pool would be a round trip more).
func OfPool(ctx context.Context, q *db.Queries, pool, name string) (*api.Flavor, error) {
	row, err := q.GetFlavor(ctx, db.GetFlavorParams{PoolID: pool, Name: name})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound(pool, name)
	}
	if err != nil {
		return nil, err
	}
	return output(row), nil
}

// Create answers flavors.create.
func (Service) Create(ctx context.Context, in *api.FlavorsCreateInput) (*api.Flavor, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := pools.Owned(ctx, q, in.TenantID, in.PoolID, nil)
	if err != nil {
		return nil, err
	}
	if pool.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "pool %s is archived", pool.PoolID)
	}
	p := db.InsertFlavorParams{PoolID: pool.PoolID, Name: in.Name, Vcpu: int32(in.Vcpu), MemoryMib: in.MemoryMiB, DiskGib: in.DiskGiB}
	if in.Gpus != nil {
		p.GpuModel, p.Gpus = pgtype.Text{String: in.Gpus.Model, Valid: true}, int32(in.Gpus.Count)
	}
	row, err := q.InsertFlavor(ctx, p)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "name: pool %s has a flavor %s (archived flavors keep their names)", pool.PoolID, in.Name)
	}
	if err != nil {
		return nil, err
	}
	return output(row), nil
}

// List answers flavors.list.
func (Service) List(ctx context.Context, in *api.FlavorsListInput) (*api.FlavorList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := pools.Readable(ctx, q, in.TenantID, in.PoolID); err != nil {
		return nil, err
	}
	rows, err := q.ListFlavors(ctx, db.ListFlavorsParams{PoolID: in.PoolID, IncludeArchived: in.IncludeArchived})
	if err != nil {
		return nil, err
	}
	out := &api.FlavorList{Items: make([]api.Flavor, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, *output(r))
	}
	return out, nil
}

// Get answers flavors.get.
func (Service) Get(ctx context.Context, in *api.FlavorsGetInput) (*api.Flavor, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	return Get(ctx, q, in.TenantID, in.PoolID, in.Name)
}

// Archive answers flavors.archive.
func (Service) Archive(ctx context.Context, in *api.FlavorsArchiveInput) (*api.Flavor, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := pools.Owned(ctx, q, in.TenantID, in.PoolID, nil); err != nil {
		return nil, err
	}
	row, err := q.ArchiveFlavor(ctx, db.ArchiveFlavorParams{PoolID: in.PoolID, Name: in.Name})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound(in.PoolID, in.Name)
	}
	if err != nil {
		return nil, err
	}
	return output(row), nil
}
