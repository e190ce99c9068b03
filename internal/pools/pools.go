// Package pools implements the pools group: sets of hosts in one site that
// admissions place work on. It owns the pools table and, with
// internal/placement, the quota rows: pools.create writes the owner's,
// pools.offer another tenant's, pools.unoffer closes them to new work.
package pools

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/join"
	"computeplane/internal/outbox"
	"computeplane/internal/pki"
	"computeplane/internal/placement"
	"computeplane/internal/sites"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Unlimited is the max of an owner's quota row for a resource its
// ownerLimits leave out: 2^53-1, the largest integer every JSON client
// reads exactly.
const Unlimited = 1<<53 - 1

// Defaults of hosted vps-host pools.
const (
	DefaultRuntime = "qemu"
	AgentDaemon    = "node-daemon"
)

// Service implements api.PoolsService.
type Service struct {
	root string
	// pki opens the deployment's PKI bundle, for join tokens.
	pki func() (*pki.Bundle, error)
}

// WithPKI sets where join tokens get the join service's key.
func (s *Service) WithPKI(load func() (*pki.Bundle, error)) *Service {
	s.pki = load
	return s
}

var _ api.PoolsService = (*Service)(nil)

// New returns the pools service of a deployment.
func New(rootTenant string) *Service { return &Service{root: rootTenant} }

// SiteReferences tells sites.delete what still uses a site: unarchived
// pools and nodes not retired forbid deletion, any pool or node keeps a
// tombstone.
func SiteReferences(ctx context.Context, tx pgx.Tx, siteID string) (live, referenced bool, err error) {
	r, err := db.New(tx).SiteReferences(ctx, siteID)
	return r.Live, r.Referenced, err
}

var _ sites.References = SiteReferences

func ptr(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}

func text(s *string) pgtype.Text {
	if s == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: *s, Valid: true}
}

// output is the pool as tenant sees it.
func output(r db.Pool, tenant string) *api.Pool {
	return &api.Pool{
		PoolID: r.PoolID, TenantID: r.TenantID, SiteID: r.SiteID, Name: r.Name, Class: r.Class, Hosting: r.Hosting,
		AccountID: ptr(r.AccountID), Runtime: ptr(r.Runtime), Agent: ptr(r.Agent), VcpuAllocationRatio: r.VcpuAllocationRatio, Archived: r.Archived,
		Offered: r.TenantID != tenant, Version: r.Version, CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt),
	}
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "pool %s not found", id) }

var createMethod = api.Lookup("/pools/create")

// Create answers pools.create.
func (s *Service) Create(ctx context.Context, in *api.PoolsCreateInput) (*api.Pool, error) {
	runtime, agent, err := shape(in)
	if err != nil {
		return nil, err
	}
	if err := checkRatio(in.VcpuAllocationRatio); err != nil {
		return nil, err
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	existing, err := q.GetPool(ctx, k.ID)
	if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
		return nil, err
	} else if replay {
		return output(existing, in.TenantID), nil
	}
	if in.AccountID != nil {
		// A provider pool's account is one of the tenant's.
		acct, err := q.GetProviderAccount(ctx, *in.AccountID)
		if _, err := store.Visible(acct, err, acct.TenantID == in.TenantID, api.Errorf(api.CodeNotFound, "accountId: provider account %s not found", *in.AccountID)); err != nil {
			return nil, err
		}
	}
	site, err := q.GetSite(ctx, in.SiteID)
	if _, err := store.Visible(site, err, !site.Tombstoned &&
		(site.TenantID == in.TenantID || (site.TenantID == s.root && site.Kind == sites.KindShared)),
		api.Errorf(api.CodeNotFound, "siteId: site %s not found", in.SiteID)); err != nil {
		return nil, err
	}
	if taken, err := q.PoolNameTaken(ctx, db.PoolNameTakenParams{TenantID: in.TenantID, Name: in.Name, PoolID: k.ID}); err != nil {
		return nil, err
	} else if taken {
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a live pool named %s", in.TenantID, in.Name)
	}
	row, err := q.InsertPool(ctx, db.InsertPoolParams{
		PoolID: k.ID, TenantID: in.TenantID, SiteID: in.SiteID, Name: in.Name, Class: in.Class, Hosting: in.Hosting,
		AccountID: text(in.AccountID), Runtime: text(runtime), Agent: text(agent), VcpuAllocationRatio: in.VcpuAllocationRatio,
		CreatedBy: sess.Caller.IdentityID, IdemRequest: k.Fingerprint,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// A concurrent call committed first: with the same key, answer as
		// its retry; else it took the name.
		existing, err := q.GetPool(ctx, k.ID)
		if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
			return nil, err
		} else if replay {
			return output(existing, in.TenantID), nil
		}
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a live pool named %s", in.TenantID, in.Name)
	}
	if err != nil {
		return nil, err
	}
	if err := setLimits(ctx, q, in.TenantID, k.ID, in.OwnerLimits, Unlimited); err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, map[string]string{"class": row.Class, "hosting": row.Hosting, "siteId": row.SiteID}); err != nil {
		return nil, err
	}
	return output(row, in.TenantID), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventPoolCreated, Subject: row.PoolID, TenantID: row.TenantID,
		Data: api.PoolCreatedPayload{PoolID: row.PoolID, SiteID: row.SiteID, Name: row.Name, Class: row.Class, Hosting: row.Hosting},
	})
}

// checkRatio refuses a vCPU allocation ratio finer than the hundredths
// the database keeps (the catalog bounds it to 1.0..16.0): rounding it
// silently would book other than asked.
func checkRatio(r float64) error {
	if c := r * 100; math.Abs(c-math.Round(c)) > 1e-6 {
		return api.Errorf(api.CodeInvalidInput, "vcpuAllocationRatio: %g has more than two decimals", r)
	}
	return nil
}

// shape checks the combination of class, hosting, account, runtime and
// agent, and fills the defaults of hosted pools.
func shape(in *api.PoolsCreateInput) (runtime, agent *string, err error) {
	runtime, agent = in.Runtime, in.Agent
	switch {
	case in.Hosting == "provider":
		if in.AccountID == nil {
			return nil, nil, api.Errorf(api.CodeInvalidInput, "accountId: a provider pool needs its provider account")
		}
		if agent != nil {
			return nil, nil, api.Errorf(api.CodeInvalidInput, "agent: a provider pool's machines are run by the provider")
		}
		return nil, nil, nil // the account is checked by Create
	case in.AccountID != nil:
		return nil, nil, api.Errorf(api.CodeInvalidInput, "accountId: only a provider pool has a provider account")
	}
	if in.Class == "metal-host" && runtime != nil {
		return nil, nil, api.Errorf(api.CodeInvalidInput, "runtime: a metal-host pool runs no VM runtime")
	}
	if in.Class == "vps-host" && runtime == nil {
		r := DefaultRuntime
		runtime = &r
	}
	if runtime != nil && *runtime != DefaultRuntime {
		return nil, nil, api.Errorf(api.CodeInvalidInput, "runtime: %s is not a runtime of this deployment (known: %s)", *runtime, DefaultRuntime)
	}
	if agent == nil {
		a := AgentDaemon
		agent = &a
	}
	return runtime, agent, nil
}

// limitsOf is the max of every resource: as given, else fill (Unlimited
// for an owner, 0 for an offer: a resource left out grants nothing).
func limitsOf(l *api.Limits, fill int64) map[string]int64 {
	given := map[string]*int64{}
	if l != nil {
		given = map[string]*int64{
			placement.ResourceVCPU: l.Vcpu, placement.ResourceMemoryMiB: l.MemoryMiB, placement.ResourceDiskGiB: l.DiskGiB,
			placement.ResourceGPUs: l.Gpus, placement.ResourceInstances: l.Instances, placement.ResourceSandboxes: l.Sandboxes,
			placement.ResourceNodes: l.Nodes,
		}
	}
	out := map[string]int64{}
	for _, r := range placement.Resources {
		out[r] = fill
		if v := given[r]; v != nil {
			out[r] = *v
		}
	}
	return out
}

// setLimits writes tenant's quota row of every resource in pool; a max
// below what the tenant already uses is INVALID_STATE.
func setLimits(ctx context.Context, q *db.Queries, tenant, pool string, l *api.Limits, fill int64) error {
	limits := limitsOf(l, fill)
	for _, r := range placement.Resources {
		max := limits[r]
		_, err := q.SetQuota(ctx, db.SetQuotaParams{TenantID: tenant, PoolID: pool, Resource: r, Max: max})
		if errors.Is(err, pgx.ErrNoRows) {
			cur, err := q.GetQuota(ctx, db.GetQuotaParams{TenantID: tenant, PoolID: pool, Resource: r})
			if err != nil {
				return err
			}
			return api.Errorf(api.CodeInvalidState, "limits.%s: tenant %s uses %d, more than %d", r, tenant, cur.Used, max).
				WithDetails(map[string]any{"resource": r, "used": cur.Used})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// NotFound is the answer for a pool the tenant may not read (Readable's).
func NotFound(id string) error { return notFound(id) }

// Readable loads a pool tenant owns or is offered; anything else is
// NOT_FOUND. The flavors and quotas groups read pools through it.
func Readable(ctx context.Context, q *db.Queries, tenant, id string) (db.Pool, error) {
	row, err := q.GetPool(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return db.Pool{}, notFound(id)
	}
	if err != nil || row.TenantID == tenant {
		return row, err
	}
	offered, err := q.PoolOfferedTo(ctx, db.PoolOfferedToParams{PoolID: id, TenantID: tenant})
	if err != nil {
		return db.Pool{}, err
	}
	if !offered {
		return db.Pool{}, notFound(id)
	}
	return row, nil
}

// Get answers pools.get.
func (s *Service) Get(ctx context.Context, in *api.PoolsGetInput) (*api.Pool, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := Readable(ctx, q, in.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	return output(row, in.TenantID), nil
}

// List answers pools.list.
func (s *Service) List(ctx context.Context, in *api.PoolsListInput) (*api.PoolList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListPoolsOfTenant(ctx, db.ListPoolsOfTenantParams{TenantID: in.TenantID, IncludeArchived: in.IncludeArchived, SiteID: text(in.SiteID)})
	if err != nil {
		return nil, err
	}
	out := &api.PoolList{Items: make([]api.Pool, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, *output(r, in.TenantID))
	}
	return out, nil
}

// Owned loads a pool for a change by its owner: absent or another tenant's
// is NOT_FOUND, a stale version CONFLICT.
func Owned(ctx context.Context, q *db.Queries, tenant, id string, version *int64) (db.Pool, error) {
	row, err := q.GetPoolForUpdate(ctx, id)
	if row, err = store.Visible(row, err, row.TenantID == tenant, notFound(id)); err != nil {
		return db.Pool{}, err
	}
	if version != nil && *version != row.Version {
		return db.Pool{}, api.Errorf(api.CodeConflict, "pool %s is at version %d, not %d", id, row.Version, *version).
			WithDetails(map[string]any{"version": row.Version})
	}
	return row, nil
}

// Update answers pools.update: a new name, a new vCPU allocation ratio
// (applied to the pool's nodes in the same transaction), or both.
func (s *Service) Update(ctx context.Context, in *api.PoolsUpdateInput) (*api.Pool, error) {
	if in.Name == nil && in.VcpuAllocationRatio == nil {
		return nil, api.Errorf(api.CodeInvalidInput, "name: give a name or a vcpuAllocationRatio to change")
	}
	if in.VcpuAllocationRatio != nil {
		if err := checkRatio(*in.VcpuAllocationRatio); err != nil {
			return nil, err
		}
	}
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := Owned(ctx, q, in.TenantID, in.PoolID, in.Version)
	if err != nil {
		return nil, err
	}
	name, ratio := row.Name, row.VcpuAllocationRatio
	if in.Name != nil {
		name = *in.Name
	}
	if in.VcpuAllocationRatio != nil {
		ratio = *in.VcpuAllocationRatio
	}
	if name == row.Name && ratio == row.VcpuAllocationRatio {
		return output(row, in.TenantID), nil
	}
	if row.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "pool %s is archived", row.PoolID)
	}
	if name != row.Name {
		if taken, err := q.PoolNameTaken(ctx, db.PoolNameTakenParams{TenantID: in.TenantID, Name: name, PoolID: row.PoolID}); err != nil {
			return nil, err
		} else if taken {
			return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a live pool named %s", in.TenantID, name)
		}
	}
	if ratio != row.VcpuAllocationRatio {
		if err := setNodesRatio(ctx, q, row.PoolID, ratio); err != nil {
			return nil, err
		}
	}
	if row, err = q.UpdatePool(ctx, db.UpdatePoolParams{PoolID: row.PoolID, Name: name, VcpuAllocationRatio: ratio}); err != nil {
		return nil, err
	}
	return output(row, in.TenantID), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventPoolUpdated, Subject: row.PoolID, TenantID: row.TenantID,
		Data: api.PoolUpdatedPayload{PoolID: row.PoolID, Name: row.Name, VcpuAllocationRatio: row.VcpuAllocationRatio, Version: row.Version},
	})
}

// setNodesRatio gives every node of pool the vCPU allocation ratio: a
// node with more vCPU booked than the ratio would let it take refuses the
// change (INVALID_STATE) rather than leave it over-committed. The nodes
// are locked first, so no admission books them between check and write.
func setNodesRatio(ctx context.Context, q *db.Queries, pool string, ratio float64) error {
	nodes, err := q.LockPoolNodes(ctx, db.LockPoolNodesParams{PoolID: pool, VcpuAllocationRatio: ratio})
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.BookedVcpu > n.AllocVcpu {
			return api.Errorf(api.CodeInvalidState, "vcpuAllocationRatio: node %s has %d vCPU booked, more than the %d it could take at %g",
				n.NodeID, n.BookedVcpu, n.AllocVcpu, ratio).
				WithDetails(map[string]any{"nodeId": n.NodeID, "bookedVcpu": n.BookedVcpu, "allocatableVcpu": n.AllocVcpu})
		}
	}
	return q.SetPoolNodesRatio(ctx, db.SetPoolNodesRatioParams{PoolID: pool, VcpuAllocationRatio: ratio})
}

// Archive answers pools.archive.
func (s *Service) Archive(ctx context.Context, in *api.PoolsArchiveInput) (*api.Pool, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := Owned(ctx, q, in.TenantID, in.PoolID, in.Version)
	if err != nil || row.Archived {
		return output(row, in.TenantID), err
	}
	if row, err = q.ArchivePool(ctx, row.PoolID); err != nil {
		return nil, err
	}
	return output(row, in.TenantID), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventPoolArchived, Subject: row.PoolID, TenantID: row.TenantID,
		Data: api.PoolArchivedPayload{PoolID: row.PoolID},
	})
}

// Offer answers pools.offer.
func (s *Service) Offer(ctx context.Context, in *api.PoolsOfferInput) (*api.PoolOffer, error) {
	if in.ToTenantID == in.TenantID {
		return nil, api.Errorf(api.CodeInvalidInput, "toTenantId: a pool is not offered to its owner; set its quotas instead")
	}
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := Owned(ctx, q, in.TenantID, in.PoolID, nil)
	if err != nil {
		return nil, err
	}
	if row.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "pool %s is archived", row.PoolID)
	}
	if err := setLimits(ctx, q, in.ToTenantID, row.PoolID, &in.Limits, 0); err != nil {
		return nil, err
	}
	limits := map[string]any{}
	for r, max := range limitsOf(&in.Limits, 0) {
		limits[r] = max
	}
	return &api.PoolOffer{PoolID: row.PoolID, ToTenantID: in.ToTenantID, Offered: true}, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventPoolOffered, Subject: row.PoolID, TenantID: row.TenantID,
		Data: api.PoolOfferedPayload{PoolID: row.PoolID, ToTenantID: in.ToTenantID, Limits: limits},
	})
}

// Unoffer answers pools.unoffer.
func (s *Service) Unoffer(ctx context.Context, in *api.PoolsUnofferInput) (*api.PoolOffer, error) {
	if in.ToTenantID == in.TenantID {
		return nil, api.Errorf(api.CodeInvalidInput, "toTenantId: a pool is not offered to its owner; archive it instead")
	}
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := Owned(ctx, q, in.TenantID, in.PoolID, nil)
	if err != nil {
		return nil, err
	}
	n, err := q.UnofferPool(ctx, db.UnofferPoolParams{PoolID: row.PoolID, TenantID: in.ToTenantID})
	if err != nil || n == 0 {
		// Not offered: nothing changes, nothing published.
		return &api.PoolOffer{PoolID: row.PoolID, ToTenantID: in.ToTenantID, Offered: false}, err
	}
	return &api.PoolOffer{PoolID: row.PoolID, ToTenantID: in.ToTenantID, Offered: false}, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventPoolUnoffered, Subject: row.PoolID, TenantID: row.TenantID,
		Data: api.PoolUnofferedPayload{PoolID: row.PoolID, ToTenantID: in.ToTenantID},
	})
}

// JoinToken answers pools.joinToken.
func (s *Service) JoinToken(ctx context.Context, in *api.PoolsJoinTokenInput) (*api.JoinToken, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := Owned(ctx, q, in.TenantID, in.PoolID, nil)
	if err != nil {
		return nil, err
	}
	if row.Archived {
		return nil, api.Errorf(api.CodeInvalidState, "pool %s is archived", row.PoolID)
	}
	if s.pki == nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "the deployment has no PKI: run computed pki init")
	}
	bundle, err := s.pki()
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "%v", err)
	}
	ttl := time.Duration(in.TTLSeconds) * time.Second
	now := time.Now()
	token, id, err := join.Mint(ctx, tx, bundle, row.TenantID, row.PoolID, row.SiteID, sess.Caller.IdentityID, ttl, now)
	if err != nil {
		return nil, err
	}
	return &api.JoinToken{Token: token, TokenID: id, PoolID: row.PoolID, ExpiresAt: wire.Time(now.Add(ttl))}, nil
}
