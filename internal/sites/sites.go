// Package sites implements the sites group: boot and failure domains.
// Platform sites (shared, dedicated) belong to the root tenant; custom sites
// to a tenant. Every change publishes its event in its own transaction and
// keeps the site's region and kind in the authorization projection.
package sites

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/cursor"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Kinds of sites.
const (
	KindShared    = "shared"
	KindDedicated = "dedicated"
	KindCustom    = "custom"
)

// readAction is what each listed site is decided on.
const readAction = "compute:sites:read"

// References tells whether something still uses a site: live things
// (unarchived pools, undeleted nodes) forbid deletion; any reference keeps a
// tombstone. The pools and nodes modules provide it; nil means none.
type References func(ctx context.Context, tx pgx.Tx, siteID string) (live, referenced bool, err error)

// Service implements api.SitesService.
type Service struct {
	root    string
	cursors *cursor.Sealer
	refs    References
	// onDelete runs in the transaction of a deletion (join tokens are
	// revoked); nil does nothing.
	onDelete func(ctx context.Context, tx pgx.Tx, siteID string) error
}

// OnDelete sets what else a deletion does in its transaction: the join
// service revokes the site's tokens.
func (s *Service) OnDelete(fn func(ctx context.Context, tx pgx.Tx, siteID string) error) *Service {
	s.onDelete = fn
	return s
}

var _ api.SitesService = (*Service)(nil)

// New returns the sites service of a deployment.
func New(rootTenant string, cursors *cursor.Sealer, refs References) *Service {
	return &Service{root: rootTenant, cursors: cursors, refs: refs}
}

func text(s *string) pgtype.Text {
	if s == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: *s, Valid: true}
}

func output(r db.Site) *api.Site {
	iamRegion := r.Region
	if r.IamRegion.Valid {
		iamRegion = r.IamRegion.String
	}
	return &api.Site{
		SiteID: r.SiteID, TenantID: r.TenantID, Kind: r.Kind, Region: r.Region, IAMRegion: iamRegion,
		Version: r.Version, Tombstoned: r.Tombstoned, CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt),
	}
}

func attributes(r db.Site) map[string]string {
	a := map[string]string{"kind": r.Kind, "region": r.Region}
	if r.Kind == KindShared {
		a[iam.AttrShared] = "true"
	}
	return a
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "site %s not found", id) }

var createMethod = api.Lookup("/sites/create")

// Create answers sites.create. The id derives from tenant, calling identity
// and key, so a retry lands on the stored site: the same request returns it
// (without a second decision: the gate saw it exists), another is CONFLICT.
func (s *Service) Create(ctx context.Context, in *api.SitesCreateInput) (*api.Site, error) {
	if in.Kind != KindCustom && in.TenantID != s.root {
		return nil, api.Errorf(api.CodeInvalidInput, "tenantId: a %s site belongs to the root tenant %s", in.Kind, s.root)
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	row, err := q.InsertSite(ctx, db.InsertSiteParams{
		SiteID: k.ID, TenantID: in.TenantID, Kind: in.Kind, Region: in.Region, IamRegion: text(in.IAMRegion),
		CreatedBy: sess.Caller.IdentityID, IdemRequest: k.Fingerprint,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// The id is taken: a retry, or a concurrent call with the key.
		existing, err := q.GetSite(ctx, k.ID)
		if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
			return nil, err
		} else if !replay {
			return nil, notFound(k.ID) // removed since
		}
		return output(existing), nil
	}
	if err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, attributes(row)); err != nil {
		return nil, err
	}
	site := output(row)
	return site, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventSiteCreated, Subject: site.SiteID, TenantID: site.TenantID,
		Data: api.SiteCreatedPayload{SiteID: site.SiteID, Kind: site.Kind, Region: site.Region, IAMRegion: site.IAMRegion, Version: site.Version},
	})
}

// visible reports whether tenant sees the site: its own, and the root
// tenant's shared sites.
func (s *Service) visible(r db.Site, tenant string) bool {
	return !r.Tombstoned && (r.TenantID == tenant || (r.TenantID == s.root && r.Kind == KindShared))
}

// Get answers sites.get: a site the tenant cannot see is NOT_FOUND.
func (s *Service) Get(ctx context.Context, in *api.SitesGetInput) (*api.Site, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := q.GetSite(ctx, in.SiteID)
	if row, err = store.Visible(row, err, s.visible(row, in.TenantID), notFound(in.SiteID)); err != nil {
		return nil, err
	}
	return output(row), nil
}

// List answers sites.list: visible sites in id order, pages of at most 50;
// sites the caller may not read are left out, so a page may hold fewer.
func (s *Service) List(ctx context.Context, in *api.SitesListInput) (*api.SiteList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	after := ""
	if in.Cursor != nil {
		pos, err := s.cursors.Open(api.MethodSitesList, in.TenantID, *in.Cursor)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalidInput, "cursor: not a cursor sites.list returned")
		}
		after = string(pos)
	}
	rows, err := q.ListSites(ctx, db.ListSitesParams{
		TenantID: in.TenantID, RootTenantID: s.root, AfterID: after,
		Kind: text(in.Kind), Region: text(in.Region), MaxRows: int32(in.Limit) + 1,
	})
	if err != nil {
		return nil, err
	}
	out := &api.SiteList{Items: []api.Site{}}
	more := len(rows) > int(in.Limit)
	if more {
		rows = rows[:in.Limit]
	}
	for _, r := range rows {
		if sess.CanRead(ctx, readAction, "site", r.SiteID, r.TenantID) {
			out.Items = append(out.Items, *output(r))
		}
	}
	if more {
		c := s.cursors.Seal(api.MethodSitesList, in.TenantID, []byte(rows[len(rows)-1].SiteID))
		out.Cursor = &c
	}
	return out, nil
}

// locked loads the site for a change by its owner tenant: absent, deleted
// or another tenant's is NOT_FOUND; a stale version is CONFLICT.
func locked(ctx context.Context, q *db.Queries, tenant, id string, version *int64) (db.Site, error) {
	row, err := q.GetSiteForUpdate(ctx, id)
	if row, err = store.Visible(row, err, !row.Tombstoned && row.TenantID == tenant, notFound(id)); err != nil {
		return db.Site{}, err
	}
	if version != nil && *version != row.Version {
		return db.Site{}, api.Errorf(api.CodeConflict, "site %s is at version %d, not %d", id, row.Version, *version).
			WithDetails(map[string]any{"version": row.Version})
	}
	return row, nil
}

// Update answers sites.update: a change named and the version matching
// publishes site.updated; a no-op returns the site unchanged.
func (s *Service) Update(ctx context.Context, in *api.SitesUpdateInput) (*api.Site, error) {
	switch {
	case in.IAMRegion != nil && in.ClearIAMRegion:
		return nil, api.Errorf(api.CodeInvalidInput, "iamRegion: give iamRegion or clearIamRegion, not both")
	case in.Region == nil && in.IAMRegion == nil && !in.ClearIAMRegion:
		return nil, api.Errorf(api.CodeInvalidInput, "no change named: give region, iamRegion or clearIamRegion")
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := locked(ctx, q, in.TenantID, in.SiteID, in.Version)
	if err != nil {
		return nil, err
	}
	region, iamRegion := row.Region, row.IamRegion
	if in.Region != nil {
		region = *in.Region
	}
	switch {
	case in.IAMRegion != nil:
		iamRegion = text(in.IAMRegion)
	case in.ClearIAMRegion:
		iamRegion = pgtype.Text{}
	}
	if region == row.Region && iamRegion == row.IamRegion {
		return output(row), nil
	}
	row, err = q.UpdateSite(ctx, db.UpdateSiteParams{SiteID: row.SiteID, Region: region, IamRegion: iamRegion})
	if err != nil {
		return nil, err
	}
	err = sess.Projection().Put(ctx, tx, iam.Resource{
		Type: sess.TypePrefix() + "site", ID: row.SiteID, TenantID: row.TenantID, Attributes: attributes(row),
	})
	if err != nil {
		return nil, err
	}
	site := output(row)
	return site, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventSiteUpdated, Subject: site.SiteID, TenantID: site.TenantID,
		Data: api.SiteUpdatedPayload{SiteID: site.SiteID, Kind: site.Kind, Region: site.Region, IAMRegion: site.IAMRegion, Version: site.Version},
	})
}

// Delete answers sites.delete: live pools or nodes are INVALID_STATE; a
// site still referenced is tombstoned, otherwise removed; a retry after
// deletion answers deleted false.
func (s *Service) Delete(ctx context.Context, in *api.SitesDeleteInput) (*api.SiteDeleted, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := q.GetSiteForUpdate(ctx, in.SiteID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &api.SiteDeleted{Deleted: false, Tombstoned: false}, nil
	case err != nil:
		return nil, err
	case row.TenantID != in.TenantID:
		return nil, notFound(in.SiteID)
	case row.Tombstoned:
		return &api.SiteDeleted{Deleted: false, Tombstoned: true}, nil
	}
	if _, err := locked(ctx, q, in.TenantID, in.SiteID, in.Version); err != nil {
		return nil, err
	}
	live, referenced := false, false
	if s.refs != nil {
		if live, referenced, err = s.refs(ctx, tx, row.SiteID); err != nil {
			return nil, err
		}
	}
	if live {
		return nil, api.Errorf(api.CodeInvalidState, "site %s still has live pools or nodes", row.SiteID)
	}
	if s.onDelete != nil {
		if err := s.onDelete(ctx, tx, row.SiteID); err != nil {
			return nil, err
		}
	}
	if referenced {
		_, err = q.TombstoneSite(ctx, row.SiteID)
	} else {
		err = q.DeleteSite(ctx, row.SiteID)
	}
	if err != nil {
		return nil, err
	}
	if err := sess.Projection().Delete(ctx, tx, iam.Ref{Type: sess.TypePrefix() + "site", ID: row.SiteID}); err != nil {
		return nil, err
	}
	return &api.SiteDeleted{Deleted: true, Tombstoned: referenced}, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventSiteDeleted, Subject: row.SiteID, TenantID: row.TenantID,
		Data: api.SiteDeletedPayload{SiteID: row.SiteID, Tombstoned: referenced},
	})
}
