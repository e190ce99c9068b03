package spicedb

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"

	"computeplane/internal/iam"
)

// syncBatch is the number of updates per WriteRelationships (SpiceDB takes
// 1000 by default).
const syncBatch = 500

// syncTimeout bounds the first mirror of the keeper's records.
const syncTimeout = 60 * time.Second

// syncAll mirrors every resource, relationship and role binding the keeper
// holds (TOUCH: idempotent), so that SpiceDB starting empty (or an adapter
// configured on an existing install) decides on what the keeper holds. It
// adds and never removes: a relationship SpiceDB holds that the keeper
// does not is removed when its object is next written or deleted; role
// bindings are written exactly (the other roles of each binding deleted).
func (p *Port) syncAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	q := p.st.Queries()
	var ups []*v1.RelationshipUpdate
	touch := func(r *v1.Relationship) {
		ups = append(ups, &v1.RelationshipUpdate{Operation: v1.RelationshipUpdate_OPERATION_TOUCH, Relationship: r})
	}
	resources, err := q.IAMAllResources(ctx)
	if err != nil {
		return fmt.Errorf("%w: spicedb sync: %w", iam.ErrUnavailable, err)
	}
	for _, row := range resources {
		r := iam.Resource{Type: row.Type, ID: row.ID, TenantID: row.TenantID, Owner: row.OwnerID.String, Draft: row.Draft}
		if row.ParentType.Valid {
			r.Parent = &iam.Ref{Type: row.ParentType.String, ID: row.ParentID.String}
		}
		_ = json.Unmarshal(row.Attributes, &r.Attributes) // a malformed attribute only loses shared
		for _, rel := range p.resourceRelationships(r) {
			touch(rel)
		}
	}
	rels, err := q.IAMAllRelationships(ctx)
	if err != nil {
		return fmt.Errorf("%w: spicedb sync: %w", iam.ErrUnavailable, err)
	}
	for _, row := range rels {
		if row.Relation == relMember {
			touch(&v1.Relationship{Resource: p.obj(row.ResourceType, row.ResourceID), Relation: relMember, Subject: p.principal(row.IdentityID)})
		}
	}
	bindings, err := q.IAMAllRoleBindings(ctx)
	if err != nil {
		return fmt.Errorf("%w: spicedb sync: %w", iam.ErrUnavailable, err)
	}
	for _, row := range bindings {
		// Exactly the role held: a role changed while SpiceDB could not
		// take it loses the old one here.
		ups = append(ups, p.bindingUpdates(row.TenantID, row.IdentityID, row.Role)...)
	}
	for len(ups) > 0 {
		n := min(len(ups), syncBatch)
		if err := p.write(ctx, "sync", ups[:n]); err != nil {
			return err
		}
		ups = ups[n:]
	}
	p.log.InfoContext(ctx, "mirrored the identity records into SpiceDB",
		"resources", len(resources), "relationships", len(rels), "roleBindings", len(bindings))
	return nil
}
