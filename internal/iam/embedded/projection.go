package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/store"
)

// projection is the authorization projection in iam.resources and
// iam.relationships.
type projection struct{ s *Service }

// PutDraft writes a draft on the pool, in its own short transaction, so
// the decision can be made on it before the call's transaction opens. It
// never touches a real resource of the same type and id (a retried create
// is then decided on what exists) and answers false then.
func (p projection) PutDraft(ctx context.Context, r iam.Resource) (bool, error) {
	arg, err := p.s.resourceParams(r)
	if err != nil {
		return false, err
	}
	n, err := p.s.st.Queries().IAMPutDraft(ctx, db.IAMPutDraftParams(arg))
	return n > 0, wrapStore(err)
}

// PutDraftRequire implements iam.DraftRequirer: the draft and the
// caller's role in its own tenant (the only role a decision reads, see
// roleOf) go out in one pipeline on the pool, then the decision is made
// with that role. The role is read for this decision and kept nowhere
// else.
func (s *Service) PutDraftRequire(ctx context.Context, draft iam.Resource, c *iam.Caller, action string, target iam.Resource) (iam.DraftOutcome, error) {
	arg, err := s.resourceParams(draft)
	if err != nil {
		return iam.DraftOutcome{}, err
	}
	var p store.Pipeline
	var n int64
	var putErr error
	p.Queue(func(q *db.Queries) { n, putErr = q.IAMPutDraft(ctx, db.IAMPutDraftParams(arg)) })
	read := c != nil && c.IdentityID != "" && c.TenantID != ""
	var role string
	var roleErr error
	if read {
		p.Queue(func(q *db.Queries) {
			role, roleErr = q.IAMGetRole(ctx, db.IAMGetRoleParams{TenantID: c.TenantID, IdentityID: c.IdentityID})
		})
	}
	if err := p.Send(ctx, s.st.Pool()); err != nil {
		return iam.DraftOutcome{}, wrapStore(err)
	}
	if putErr != nil || n == 0 {
		return iam.DraftOutcome{}, wrapStore(putErr)
	}
	if read {
		ctx = context.WithValue(ctx, readRoleKey{}, readRole{tenant: c.TenantID, identity: c.IdentityID, name: role, err: roleErr})
	}
	return iam.DraftOutcome{Drafted: true, Refusal: s.decide(ctx, c, action, target)}, nil
}

// readRole is a role read in the pipeline of the decision that uses it.
type readRole struct {
	tenant, identity, name string
	err                    error
}

type readRoleKey struct{}

// Get returns the projected resource, nil when it is absent.
func (p projection) Get(ctx context.Context, r iam.Ref) (*iam.Resource, error) {
	row, err := p.s.st.Queries().IAMGetResource(ctx, db.IAMGetResourceParams{Type: r.Type, ID: r.ID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, wrapStore(err)
	}
	return resourceOf(row)
}

// resourceOf is the projection's row as a resource.
func resourceOf(row db.IamResource) (*iam.Resource, error) {
	r := iam.Ref{Type: row.Type, ID: row.ID}
	out := &iam.Resource{Type: row.Type, ID: row.ID, TenantID: row.TenantID, Owner: row.OwnerID.String, Draft: row.Draft}
	if row.ParentType.Valid {
		out.Parent = &iam.Ref{Type: row.ParentType.String, ID: row.ParentID.String}
	}
	if len(row.Attributes) > 0 {
		if err := json.Unmarshal(row.Attributes, &out.Attributes); err != nil {
			return nil, fmt.Errorf("iam: attributes of %s/%s: %w", r.Type, r.ID, err)
		}
	}
	return out, nil
}

// DropDraft removes a draft after a refusal; a resource made real stays.
func (p projection) DropDraft(ctx context.Context, r iam.Ref) error {
	return wrapStore(p.s.st.Queries().IAMDropDraft(ctx, db.IAMDropDraftParams{Type: r.Type, ID: r.ID}))
}

// Put writes (or makes real) a resource in the call's transaction; tx nil
// means the transaction carried by ctx.
func (p projection) Put(ctx context.Context, tx pgx.Tx, r iam.Resource) error {
	arg, err := p.s.resourceParams(r)
	if err != nil {
		return err
	}
	tx, err = txFrom(ctx, tx)
	if err != nil {
		return err
	}
	// Nothing is read back: the row goes out with the call's next
	// statement (its commit, for a create).
	return wrapStore(db.New(store.Later(tx)).IAMPutResource(ctx, arg))
}

// Delete removes a resource and its relationships in the call's
// transaction.
func (p projection) Delete(ctx context.Context, tx pgx.Tx, r iam.Ref) error {
	q, err := txOf(ctx, tx)
	if err != nil {
		return err
	}
	if err := q.IAMDeleteRelationshipsOf(ctx, db.IAMDeleteRelationshipsOfParams{ResourceType: r.Type, ResourceID: r.ID}); err != nil {
		return wrapStore(err)
	}
	return wrapStore(q.IAMDeleteResource(ctx, db.IAMDeleteResourceParams{Type: r.Type, ID: r.ID}))
}

// Relate records relation (member, ...) of an identity on a resource; it
// is idempotent.
func (p projection) Relate(ctx context.Context, tx pgx.Tx, r iam.Ref, relation, identityID string) error {
	if err := p.s.checkRelation(r, relation, identityID); err != nil {
		return err
	}
	q, err := txOf(ctx, tx)
	if err != nil {
		return err
	}
	return wrapStore(q.IAMRelate(ctx, db.IAMRelateParams{
		ResourceType: r.Type, ResourceID: r.ID, Relation: relation, IdentityID: identityID, CreatedAt: p.s.now(),
	}))
}

// Related lists the identities related to r by relation.
func (p projection) Related(ctx context.Context, tx pgx.Tx, r iam.Ref, relation string) ([]string, error) {
	q, err := txOf(ctx, tx)
	if err != nil {
		return nil, err
	}
	ids, err := q.IAMRelated(ctx, db.IAMRelatedParams{ResourceType: r.Type, ResourceID: r.ID, Relation: relation})
	return ids, wrapStore(err)
}

// Unrelate removes a relationship; removing one that does not exist is not
// an error.
func (p projection) Unrelate(ctx context.Context, tx pgx.Tx, r iam.Ref, relation, identityID string) error {
	q, err := txOf(ctx, tx)
	if err != nil {
		return err
	}
	return wrapStore(q.IAMUnrelate(ctx, db.IAMUnrelateParams{
		ResourceType: r.Type, ResourceID: r.ID, Relation: relation, IdentityID: identityID,
	}))
}

func (s *Service) checkType(typ string) error {
	if !strings.HasPrefix(typ, s.prefix) || len(typ) == len(s.prefix) {
		return fmt.Errorf("iam: resource type %q lacks the prefix %q", typ, s.prefix)
	}
	return nil
}

func (s *Service) checkRelation(r iam.Ref, relation, identityID string) error {
	if err := s.checkType(r.Type); err != nil {
		return err
	}
	if r.ID == "" || relation == "" || identityID == "" {
		return errors.New("iam: a relationship needs a resource id, a relation and an identity")
	}
	return nil
}

func (s *Service) resourceParams(r iam.Resource) (db.IAMPutResourceParams, error) {
	if err := s.checkType(r.Type); err != nil {
		return db.IAMPutResourceParams{}, err
	}
	if r.ID == "" || r.TenantID == "" {
		return db.IAMPutResourceParams{}, fmt.Errorf("iam: resource %s needs an id and a tenant", r.Type)
	}
	attrs := r.Attributes
	if attrs == nil {
		attrs = map[string]string{}
	}
	b, err := json.Marshal(attrs)
	if err != nil {
		return db.IAMPutResourceParams{}, fmt.Errorf("iam: attributes: %w", err)
	}
	arg := db.IAMPutResourceParams{
		Type:       r.Type,
		ID:         r.ID,
		TenantID:   r.TenantID,
		OwnerID:    text(r.Owner),
		Attributes: b,
		Now:        s.now(),
	}
	if r.Parent != nil && r.Parent.Type != "" && r.Parent.ID != "" {
		arg.ParentType, arg.ParentID = text(r.Parent.Type), text(r.Parent.ID)
	}
	return arg, nil
}

// wrapStore keeps nil nil and marks store failures as the identity
// service being unavailable.
func wrapStore(err error) error {
	if err == nil {
		return nil
	}
	return unavailable(err)
}
