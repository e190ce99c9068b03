// Package profiles implements the profiles group: versioned provisioning
// recipes (docs/profiles.md). It owns the profile document (its JSON
// Schema is catalog/profile.schema.json), the lookup order (the tenant's
// own, then public, then the read-only profiles shipped under tenant
// builtin from builtin/), composition by uses of other profiles
// (Resolve, Render), and the lock a workflow engine takes on a version it
// starts (Lock). The built-in actions a step may use are declared once,
// in internal/workflows/actionspec (Actions).
package profiles

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"sort"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/cursor"
	"computeplane/internal/iam"
	"computeplane/internal/wire"
)

// ResourceType is a profile's type in authorization decisions. Profiles
// are not projected: their ids are per tenant, so a decision is made on
// the type, the id and the tenant the call names.
const ResourceType = "profile"

// Service implements api.ProfilesService.
type Service struct {
	Cursors *cursor.Sealer
}

var _ api.ProfilesService = (*Service)(nil)

const listMethod = "profiles.list"

func output(e *Entry) *api.Profile {
	o := &api.Profile{TenantID: e.Tenant, ProfileID: e.ID, ProfileVersion: int64(e.Version), Document: e.Document,
		Visibility: e.Visibility, Version: e.RowVersion, CreatedAt: wire.Time(e.CreatedAt), UpdatedAt: wire.Time(e.UpdatedAt)}
	if e.LockedAt != nil {
		s := wire.Time(*e.LockedAt)
		o.LockedAt = &s
	}
	return o
}

// invalid is the INVALID_INPUT of a document that fails Check: the first
// offending field in details.path, every issue in details.issues (paths
// under the input field document).
func invalid(issues []Issue) error {
	all := make([]Issue, len(issues))
	for i, is := range issues {
		all[i] = Issue{Path: "document", Message: is.Message}
		if is.Path != "" {
			all[i].Path = "document." + is.Path
		}
	}
	return api.Errorf(api.CodeInvalidInput, "%s: %s", all[0].Path, all[0].Message).
		WithDetails(map[string]any{"path": all[0].Path, "issues": all})
}

func version(v *int64) int {
	if v == nil {
		return 0
	}
	return int(*v)
}

// Create answers profiles.create.
func (s *Service) Create(ctx context.Context, in *api.ProfilesCreateInput) (*api.Profile, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	d, issues := Check(in.Document)
	if len(issues) > 0 {
		return nil, invalid(issues)
	}
	raw, err := json.Marshal(in.Document)
	if err != nil {
		return nil, err
	}
	visibility := in.Visibility
	if visibility == "" {
		visibility = "private"
	}
	row, err := q.InsertProfile(ctx, db.InsertProfileParams{TenantID: in.TenantID, ProfileID: d.ID, ProfileVersion: int32(d.Version),
		Document: raw, Visibility: visibility})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "document.version: tenant %s has profile %s version %d already", in.TenantID, d.ID, d.Version).
			WithDetails(map[string]any{"path": "document.version"})
	}
	if err != nil {
		return nil, err
	}
	e, err := entryOf(row)
	if err != nil {
		return nil, err
	}
	return output(e), nil
}

// Get answers profiles.get.
func (s *Service) Get(ctx context.Context, in *api.ProfilesGetInput) (*api.Profile, error) {
	_, tx, _, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	e, err := Lookup(ctx, tx, in.TenantID, in.ProfileID, version(in.ProfileVersion))
	if err != nil {
		return nil, err
	}
	return output(e), nil
}

// Validate answers profiles.validate: problems of the profile are issues,
// never errors.
func (s *Service) Validate(ctx context.Context, in *api.ProfilesValidateInput) (*api.ProfileValidation, error) {
	_, tx, _, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	e, err := Lookup(ctx, tx, in.TenantID, in.ProfileID, version(in.ProfileVersion))
	if err != nil {
		return nil, err
	}
	_, issues, err := Resolve(ctx, tx, in.TenantID, e)
	if err != nil {
		return nil, err
	}
	out := &api.ProfileValidation{Valid: len(issues) == 0, Issues: []api.ProfileIssue{}}
	for _, is := range issues {
		p := is.Path
		out.Issues = append(out.Issues, api.ProfileIssue{Path: &p, Message: is.Message})
	}
	return out, nil
}

// Render answers profiles.render.
func (s *Service) Render(ctx context.Context, in *api.ProfilesRenderInput) (*api.ProfileRendering, error) {
	_, tx, _, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := Render(ctx, tx, in.TenantID, in.ProfileID, version(in.ProfileVersion))
	if err != nil {
		return nil, err
	}
	out := &api.ProfileRendering{TenantID: r.Entry.Tenant, ProfileID: r.Entry.ID, ProfileVersion: int64(r.Entry.Version),
		Document: r.Entry.Document, Steps: make([]api.ProfileStep, 0, len(r.Steps))}
	for _, st := range r.Steps {
		out.Steps = append(out.Steps, api.ProfileStep{Name: st.Name, Phase: st.Phase, Uses: st.Uses, With: st.With,
			TimeoutMs: st.TimeoutMs, Retries: int64(st.Retries), Profile: st.Profile})
	}
	return out, nil
}

// position is where a list page starts: the first item of (id, version)
// after skipping skip items of that pair (several tenants may publish the
// same id and version). It fits a cursor of at most 256 characters: a
// 128-byte id, two 32-bit numbers and the 16-byte tag are 203 base64
// characters.
type position struct {
	id      string
	version int
	skip    int
}

func (p position) encode() []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(p.version))
	b = binary.BigEndian.AppendUint32(b, uint32(p.skip))
	return append(b, p.id...)
}

func decodePosition(b []byte) (position, bool) {
	if len(b) < 8 {
		return position{}, false
	}
	return position{version: int(binary.BigEndian.Uint32(b)), skip: int(binary.BigEndian.Uint32(b[4:])), id: string(b[8:])}, true
}

func less(a, b *Entry) bool {
	if a.ID != b.ID {
		return a.ID < b.ID
	}
	if a.Version != b.Version {
		return a.Version < b.Version
	}
	return a.Tenant < b.Tenant
}

// List answers profiles.list: the tenant's own, the public and the
// shipped profile versions ordered by id, version and owner tenant; items
// the caller may not read are left out.
func (s *Service) List(ctx context.Context, in *api.ProfilesListInput) (*api.ProfileList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var pos position
	if in.Cursor != nil {
		raw, err := s.Cursors.Open(listMethod, in.TenantID, *in.Cursor)
		var ok bool
		if err == nil {
			pos, ok = decodePosition(raw)
		}
		if !ok {
			return nil, api.Errorf(api.CodeInvalidInput, "cursor: not a cursor profiles.list returned")
		}
	}
	limit := int(in.Limit)
	if limit == 0 {
		limit = 50
	}
	want := pos.skip + limit + 1
	rows, err := q.ListProfilesFrom(ctx, db.ListProfilesFromParams{TenantID: in.TenantID, ProfileID: pos.id,
		ProfileVersion: int32(pos.version), MaxRows: int32(want)})
	if err != nil {
		return nil, err
	}
	all := make([]*Entry, 0, len(rows)+len(builtins))
	for _, r := range rows {
		e, err := entryOf(r)
		if err != nil {
			return nil, err
		}
		all = append(all, e)
	}
	start := &Entry{ID: pos.id, Version: pos.version}
	for i := range builtins {
		if e := builtinEntry(&builtins[i]); !less(e, start) || (e.ID == start.ID && e.Version == start.Version) {
			all = append(all, e)
		}
	}
	sort.Slice(all, func(i, j int) bool { return less(all[i], all[j]) })
	// Stored rows past the ones read sort after all of them: only the
	// first want items of the merge are certain.
	all = all[:min(len(all), want)]
	skip := 0
	for skip < pos.skip && skip < len(all) && all[skip].ID == pos.id && all[skip].Version == pos.version {
		skip++
	}
	consumed := all[:min(len(all), skip+limit)]
	page := consumed[skip:]
	out := &api.ProfileList{Items: []api.Profile{}}
	readable := map[string]bool{} // one decision per id: versions and owners share it
	for _, e := range page {
		ok, seen := readable[e.ID]
		if !seen {
			ok = sess.CanRead(ctx, "compute:profiles:read", ResourceType, e.ID, in.TenantID)
			readable[e.ID] = ok
		}
		if !ok {
			continue
		}
		out.Items = append(out.Items, *output(e))
	}
	if len(all) > len(consumed) && len(page) > 0 {
		last := page[len(page)-1]
		next := position{id: last.ID, version: last.Version}
		for _, e := range consumed {
			if e.ID == last.ID && e.Version == last.Version {
				next.skip++
			}
		}
		c := s.Cursors.Seal(listMethod, in.TenantID, next.encode())
		out.Cursor = &c
	}
	return out, nil
}

// Update answers profiles.update.
func (s *Service) Update(ctx context.Context, in *api.ProfilesUpdateInput) (*api.Profile, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if in.Document == nil && in.Visibility == nil {
		return nil, api.Errorf(api.CodeInvalidInput, "document: give a document, a visibility or both").
			WithDetails(map[string]any{"path": "document"})
	}
	row, err := q.GetOwnProfileForUpdate(ctx, db.GetOwnProfileForUpdateParams{TenantID: in.TenantID, ProfileID: in.ProfileID,
		ProfileVersion: int32(in.ProfileVersion)})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound(in.ProfileID, int(in.ProfileVersion))
	}
	if err != nil {
		return nil, err
	}
	if in.ExpectedVersion != nil && *in.ExpectedVersion != row.Version {
		return nil, api.Errorf(api.CodeConflict, "expectedVersion: the profile version's row is at version %d, not %d", row.Version, *in.ExpectedVersion).
			WithDetails(map[string]any{"path": "expectedVersion", "version": row.Version})
	}
	doc := row.Document
	if in.Document != nil {
		d, issues := Check(in.Document)
		if len(issues) > 0 {
			return nil, invalid(issues)
		}
		switch {
		case d.ID != in.ProfileID:
			return nil, api.Errorf(api.CodeInvalidInput, "document.id: a new document keeps the id %s, not %s", in.ProfileID, d.ID).
				WithDetails(map[string]any{"path": "document.id"})
		case d.Version != int(in.ProfileVersion):
			return nil, api.Errorf(api.CodeInvalidInput, "document.version: a new document keeps the version %d, not %d", in.ProfileVersion, d.Version).
				WithDetails(map[string]any{"path": "document.version"})
		}
		raw, err := json.Marshal(in.Document)
		if err != nil {
			return nil, err
		}
		if row.LockedAt != nil && !sameJSON(raw, row.Document) {
			return nil, api.Errorf(api.CodeInvalidState, "document: profile %s version %d was used by a workflow at %s; its document cannot change (its visibility can)",
				in.ProfileID, in.ProfileVersion, wire.Time(*row.LockedAt))
		}
		doc = raw
	}
	visibility := row.Visibility
	if in.Visibility != nil {
		visibility = *in.Visibility
	}
	updated, err := q.UpdateProfile(ctx, db.UpdateProfileParams{TenantID: row.TenantID, ProfileID: row.ProfileID,
		ProfileVersion: row.ProfileVersion, Document: doc, Visibility: visibility})
	if err != nil {
		return nil, err
	}
	e, err := entryOf(updated)
	if err != nil {
		return nil, err
	}
	return output(e), nil
}

// sameJSON reports whether two JSON texts hold the same value (a locked
// version accepts its own document again).
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// Delete answers profiles.delete: one version, or every version when none
// is named, of the tenant's own; shipped or absent ones are NOT_FOUND.
func (s *Service) Delete(ctx context.Context, in *api.ProfilesDeleteInput) (*api.ProfileDeleted, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var n int64
	if in.ProfileVersion == nil {
		n, err = q.DeleteProfileVersions(ctx, db.DeleteProfileVersionsParams{TenantID: in.TenantID, ProfileID: in.ProfileID})
	} else {
		n, err = q.DeleteProfileVersion(ctx, db.DeleteProfileVersionParams{TenantID: in.TenantID, ProfileID: in.ProfileID,
			ProfileVersion: int32(*in.ProfileVersion)})
	}
	if err != nil {
		return nil, err
	}
	if n == 0 {
		if findBuiltin(in.ProfileID, version(in.ProfileVersion)) != nil {
			return nil, api.Errorf(api.CodeNotFound, "profileId: profile %s is shipped under tenant %s and cannot be deleted", in.ProfileID, BuiltinTenant)
		}
		return nil, notFound(in.ProfileID, version(in.ProfileVersion))
	}
	return &api.ProfileDeleted{Deleted: n}, nil
}
