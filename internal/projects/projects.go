// Package projects implements the projects group: tenant-internal grouping
// of work. The project row is the application's; membership is the
// identity service's (relation member on compute-project/{id}), kept
// through the identity port so that an external identity service would
// hold it instead.
package projects

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// RelationMember is the relationship that makes an identity a member.
const RelationMember = "member"

// Service implements api.ProjectsService.
type Service struct{}

var _ api.ProjectsService = Service{}

func output(r db.Project) *api.Project {
	return &api.Project{
		ProjectID: r.ProjectID, TenantID: r.TenantID, Name: r.Name, Description: r.Description, Owner: r.Owner,
		Version: r.Version, CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt),
	}
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "project %s not found", id) }

func ref(sess *iam.Session, id string) iam.Ref {
	return iam.Ref{Type: sess.TypePrefix() + "project", ID: id}
}

var createMethod = api.Lookup("/projects/create")

// Create answers projects.create: the creator owns the project and is its
// first member.
func (Service) Create(ctx context.Context, in *api.ProjectsCreateInput) (*api.Project, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	existing, err := q.GetProject(ctx, k.ID)
	if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
		return nil, err
	} else if replay {
		return output(existing), nil
	}
	row, err := q.InsertProject(ctx, db.InsertProjectParams{
		ProjectID: k.ID, TenantID: in.TenantID, Name: in.Name, Description: in.Description, Owner: sess.Caller.IdentityID, IdemRequest: k.Fingerprint,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// The id (a concurrent call with the same key) or the name is taken.
		existing, err := q.GetProject(ctx, k.ID)
		if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
			return nil, err
		} else if replay {
			return output(existing), nil
		}
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a project named %s", in.TenantID, in.Name)
	}
	if err != nil {
		return nil, err
	}
	if err := sess.MakeReal(ctx, tx, map[string]string{"name": row.Name}); err != nil {
		return nil, err
	}
	if err := sess.Projection().Relate(ctx, tx, ref(sess, k.ID), RelationMember, row.Owner); err != nil {
		return nil, err
	}
	return output(row), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventProjectCreated, Subject: k.ID, TenantID: row.TenantID,
		Data: api.ProjectCreatedPayload{ProjectID: k.ID, Name: row.Name, Owner: row.Owner},
	})
}

// load reads a project of tenant, for update when forUpdate.
func load(ctx context.Context, q *db.Queries, tenant, id string, forUpdate bool) (db.Project, error) {
	get := q.GetProject
	if forUpdate {
		get = q.GetProjectForUpdate
	}
	row, err := get(ctx, id)
	return store.Visible(row, err, row.TenantID == tenant, notFound(id))
}

// Get answers projects.get.
func (Service) Get(ctx context.Context, in *api.ProjectsGetInput) (*api.Project, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := load(ctx, q, in.TenantID, in.ProjectID, false)
	if err != nil {
		return nil, err
	}
	return output(row), nil
}

// List answers projects.list.
func (Service) List(ctx context.Context, in *api.ProjectsListInput) (*api.ProjectList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListProjects(ctx, in.TenantID)
	if err != nil {
		return nil, err
	}
	out := &api.ProjectList{Items: make([]api.Project, 0, len(rows))}
	for _, r := range rows {
		if sess.CanRead(ctx, "compute:projects:read", "project", r.ProjectID, r.TenantID) {
			out.Items = append(out.Items, *output(r))
		}
	}
	return out, nil
}

// Update answers projects.update.
func (Service) Update(ctx context.Context, in *api.ProjectsUpdateInput) (*api.Project, error) {
	if in.Name == nil && in.Description == nil {
		return nil, api.Errorf(api.CodeInvalidInput, "no change named: give name or description")
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := load(ctx, q, in.TenantID, in.ProjectID, true)
	if err != nil {
		return nil, err
	}
	if in.Version != nil && *in.Version != row.Version {
		return nil, api.Errorf(api.CodeConflict, "project %s is at version %d, not %d", row.ProjectID, row.Version, *in.Version).
			WithDetails(map[string]any{"version": row.Version})
	}
	name, description := row.Name, row.Description
	if in.Name != nil {
		name = *in.Name
	}
	if in.Description != nil {
		description = *in.Description
	}
	if name == row.Name && description == row.Description {
		return output(row), nil
	}
	if taken, err := q.ProjectNameTaken(ctx, db.ProjectNameTakenParams{TenantID: row.TenantID, Name: name, ProjectID: row.ProjectID}); err != nil {
		return nil, err
	} else if taken {
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a project named %s", row.TenantID, name)
	}
	if row, err = q.UpdateProject(ctx, db.UpdateProjectParams{ProjectID: row.ProjectID, Name: name, Description: description}); err != nil {
		return nil, err
	}
	// The projection carries the name as an attribute.
	if err := sess.Projection().Put(ctx, tx, iam.Resource{
		Type: ref(sess, row.ProjectID).Type, ID: row.ProjectID, TenantID: row.TenantID, Owner: row.Owner,
		Parent: &iam.Ref{Type: sess.TypePrefix() + "tenant", ID: row.TenantID}, Attributes: map[string]string{"name": row.Name},
	}); err != nil {
		return nil, err
	}
	return output(row), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventProjectUpdated, Subject: row.ProjectID, TenantID: row.TenantID,
		Data: api.ProjectUpdatedPayload{ProjectID: row.ProjectID, Name: row.Name, Version: row.Version},
	})
}

// Delete answers projects.delete: the row, its place in the projection and
// every membership go in one transaction.
func (Service) Delete(ctx context.Context, in *api.ProjectsDeleteInput) (*api.ProjectDeleted, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := load(ctx, q, in.TenantID, in.ProjectID, true)
	if err != nil {
		return nil, err
	}
	if err := q.DeleteProject(ctx, row.ProjectID); err != nil {
		return nil, err
	}
	// Deleting the resource drops its relationships with it.
	if err := sess.Projection().Delete(ctx, tx, ref(sess, row.ProjectID)); err != nil {
		return nil, err
	}
	return &api.ProjectDeleted{Deleted: true}, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventProjectDeleted, Subject: row.ProjectID, TenantID: row.TenantID,
		Data: api.ProjectDeletedPayload{ProjectID: row.ProjectID},
	})
}

func members(ctx context.Context, sess *iam.Session, tx pgx.Tx, id string) (*api.ProjectMembers, error) {
	ids, err := sess.Projection().Related(ctx, tx, ref(sess, id), RelationMember)
	if err != nil {
		return nil, err
	}
	if ids == nil {
		ids = []string{}
	}
	return &api.ProjectMembers{ProjectID: id, Members: ids}, nil
}

// AddMember answers projects.addMember.
func (Service) AddMember(ctx context.Context, in *api.ProjectsAddMemberInput) (*api.ProjectMembers, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := load(ctx, q, in.TenantID, in.ProjectID, true); err != nil {
		return nil, err
	}
	cur, err := members(ctx, sess, tx, in.ProjectID)
	if err != nil || slices.Contains(cur.Members, in.IdentityID) {
		return cur, err
	}
	if err := sess.Projection().Relate(ctx, tx, ref(sess, in.ProjectID), RelationMember, in.IdentityID); err != nil {
		return nil, err
	}
	return members(ctx, sess, tx, in.ProjectID)
}

// RemoveMember answers projects.removeMember.
func (Service) RemoveMember(ctx context.Context, in *api.ProjectsRemoveMemberInput) (*api.ProjectMembers, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	row, err := load(ctx, q, in.TenantID, in.ProjectID, true)
	if err != nil {
		return nil, err
	}
	if in.IdentityID == row.Owner {
		return nil, api.Errorf(api.CodeInvalidState, "identityId: %s owns project %s and stays a member", in.IdentityID, row.ProjectID)
	}
	if err := sess.Projection().Unrelate(ctx, tx, ref(sess, in.ProjectID), RelationMember, in.IdentityID); err != nil {
		return nil, err
	}
	return members(ctx, sess, tx, in.ProjectID)
}

// Members answers projects.members.
func (Service) Members(ctx context.Context, in *api.ProjectsMembersInput) (*api.ProjectMembers, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := load(ctx, q, in.TenantID, in.ProjectID, false); err != nil {
		return nil, err
	}
	return members(ctx, sess, tx, in.ProjectID)
}
