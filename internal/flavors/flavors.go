// Package flavors implements the flavors group: the sizes work is made in,
// per pool. An archived flavor refuses new work; what runs in it lives on.
package flavors

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/pools"
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

func notFound(pool, name string) error {
	return api.Errorf(api.CodeNotFound, "flavor %s not found in pool %s", name, pool)
}

// Get loads a flavor of a pool tenant owns or is offered, for the modules
// that make work in it (an archived one is INVALID_STATE for them).
func Get(ctx context.Context, q *db.Queries, tenant, pool, name string) (*api.Flavor, error) {
	if _, err := pools.Readable(ctx, q, tenant, pool); err != nil {
		return nil, err
	}
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
