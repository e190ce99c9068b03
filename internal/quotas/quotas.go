// Package quotas implements the quotas group: reading and setting the caps
// that internal/placement charges. A missing row grants nothing.
package quotas

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/pools"
)

// Service implements api.QuotasService.
type Service struct{}

var _ api.QuotasService = Service{}

func output(r db.Quota) api.Quota {
	return api.Quota{TenantID: r.TenantID, PoolID: r.PoolID, Resource: r.Resource, Max: r.Max, Used: r.Used, Offered: r.Offered}
}

// List answers quotas.list: the tenant's rows; in a pool it owns, every
// tenant's rows of that pool.
func (Service) List(ctx context.Context, in *api.QuotasListInput) (*api.QuotaList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	all := false
	var pool pgtype.Text
	if in.PoolID != nil {
		p, err := pools.Readable(ctx, q, in.TenantID, *in.PoolID)
		if err != nil {
			return nil, err
		}
		all, pool = p.TenantID == in.TenantID, pgtype.Text{String: p.PoolID, Valid: true}
	}
	rows, err := q.ListQuotas(ctx, db.ListQuotasParams{TenantID: in.TenantID, AllTenants: all, PoolID: pool})
	if err != nil {
		return nil, err
	}
	out := &api.QuotaList{Items: make([]api.Quota, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, output(r))
	}
	return out, nil
}

// Get answers quotas.get; a missing row reads as max 0.
func (Service) Get(ctx context.Context, in *api.QuotasGetInput) (*api.Quota, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p, err := pools.Readable(ctx, q, in.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	row, err := q.GetQuota(ctx, db.GetQuotaParams{TenantID: in.TenantID, PoolID: p.PoolID, Resource: in.Resource})
	if errors.Is(err, pgx.ErrNoRows) {
		return &api.Quota{TenantID: in.TenantID, PoolID: p.PoolID, Resource: in.Resource, Offered: p.TenantID == in.TenantID}, nil
	}
	if err != nil {
		return nil, err
	}
	out := output(db.Quota{TenantID: row.TenantID, PoolID: row.PoolID, Resource: row.Resource, Max: row.Max, Used: row.Used, Offered: row.Offered})
	return &out, nil
}

// Set answers quotas.set.
func (Service) Set(ctx context.Context, in *api.QuotasSetInput) (*api.Quota, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p, err := pools.Owned(ctx, q, in.TenantID, in.PoolID, nil)
	if err != nil {
		return nil, err
	}
	forTenant := in.TenantID
	if in.ForTenantID != nil {
		forTenant = *in.ForTenantID
	}
	row, err := q.SetQuotaMax(ctx, db.SetQuotaMaxParams{TenantID: forTenant, PoolID: p.PoolID, Resource: in.Resource, Max: in.Max})
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err := q.GetQuota(ctx, db.GetQuotaParams{TenantID: forTenant, PoolID: p.PoolID, Resource: in.Resource})
		if err != nil {
			return nil, err
		}
		return nil, api.Errorf(api.CodeInvalidState, "max: tenant %s uses %d %s in pool %s, more than %d", forTenant, cur.Used, in.Resource, p.PoolID, in.Max).
			WithDetails(map[string]any{"used": cur.Used})
	}
	if err != nil {
		return nil, err
	}
	out := output(row)
	return &out, nil
}
