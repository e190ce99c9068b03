package spicedb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"
	authzed "github.com/authzed/authzed-go/v1"
	"github.com/jackc/pgx/v5"

	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/store"
)

// Keeper is what the adapter asks of the embedded identity service: it
// keeps the records, SpiceDB holds their mirror.
type Keeper interface {
	iam.Port
	RoleOf(ctx context.Context, tenant, identity string) (string, error)
	CheckDelegation(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error
}

var _ Keeper = (*embedded.Service)(nil)

// Port is iam.Port with decisions by SpiceDB.
type Port struct {
	keeper  Keeper
	st      *store.Store // the keeper's store, read by the first sync
	client  *authzed.Client
	n       names
	types   []string
	timeout time.Duration
	log     *slog.Logger

	mu    sync.Mutex
	ready bool // schema written and the keeper's records mirrored
}

var _ iam.Port = (*Port)(nil)

// Options of New.
type Options struct {
	Keeper     Keeper
	Store      *store.Store
	Client     *authzed.Client
	TypePrefix string
	// Types are the resource types without the prefix (CatalogTypes when nil).
	Types   []string
	Timeout time.Duration
	Log     *slog.Logger
}

// New returns the adapter. Nothing is called yet: the schema is written
// and the keeper's records mirrored on first use (Ready), so that a
// SpiceDB down at start makes calls UNAVAILABLE instead of the start fail.
func New(o Options) *Port {
	if o.Types == nil {
		o.Types = CatalogTypes()
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Port{keeper: o.Keeper, st: o.Store, client: o.Client, n: newNames(o.TypePrefix), types: o.Types, timeout: o.Timeout, log: o.Log}
}

// RootTenant is the keeper's root tenant.
func (p *Port) RootTenant() string { return p.keeper.RootTenant() }

// Billing is the keeper's billing bridge.
func (p *Port) Billing() iam.Billing { return p.keeper.Billing() }

// Projection is the keeper's projection, mirrored into SpiceDB.
func (p *Port) Projection() iam.Projection { return projection{p} }

// Ready writes the schema and mirrors the keeper's records once; until it
// succeeds every call answers ErrUnavailable.
func (p *Port) Ready(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ready {
		return nil
	}
	schema, err := Schema(p.n.prefix, p.types)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, p.timeout)
	_, err = p.client.WriteSchema(wctx, &v1.WriteSchemaRequest{Schema: schema})
	cancel()
	if err != nil {
		return unavailable("write schema", err)
	}
	if err := p.syncAll(ctx); err != nil {
		return err
	}
	p.ready = true
	return nil
}

// Authenticate is the keeper's, and writes nothing to SpiceDB: role
// bindings reach it from the identity inbox (Follow).
func (p *Port) Authenticate(ctx context.Context, cred iam.Credential) (*iam.Caller, error) {
	return p.keeper.Authenticate(ctx, cred)
}

// bindingUpdates makes SpiceDB hold exactly role (none when "") for
// identity in tenant.
func (p *Port) bindingUpdates(tenant, identity, role string) []*v1.RelationshipUpdate {
	var ups []*v1.RelationshipUpdate
	t := p.obj("tenant", tenant)
	for _, r := range embedded.Roles {
		op := v1.RelationshipUpdate_OPERATION_DELETE
		if r == role {
			op = v1.RelationshipUpdate_OPERATION_TOUCH
		}
		ups = append(ups, update(op, t, r, p.principal(identity)))
	}
	op := v1.RelationshipUpdate_OPERATION_DELETE
	if role != "" {
		op = v1.RelationshipUpdate_OPERATION_TOUCH
	}
	return append(ups, update(op, &v1.ObjectReference{ObjectType: p.n.platform(), ObjectId: platformID}, relBound, p.principal(identity)))
}

// Require decides a mutation, never cached.
func (p *Port) Require(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	return p.decide(ctx, c, action, r)
}

// Authorize decides a read; the gate caches its allows 10 s per session.
func (p *Port) Authorize(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	return p.decide(ctx, c, action, r)
}

// check is one item of a decision's bulk check.
type check struct {
	obj  *v1.ObjectReference
	perm string
}

// decide asks SpiceDB the policy of docs/identity.md in one
// CheckBulkPermissions: the fleet operators (owners and admins of the root
// tenant, for a caller of the root tenant), the object's permission for
// the verb, whether SpiceDB holds the object, and what an object the
// projection does not hold is decided on (the tenant and parent the call
// named). Then the keeper applies the agent's delegation.
func (p *Port) decide(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	if c == nil || c.IdentityID == "" || c.TenantID == "" {
		return iam.ErrUnauthenticated
	}
	verb, ok := verbOf(action)
	if !ok {
		return denied("malformed action %q", action)
	}
	if !strings.HasPrefix(r.Type, p.n.prefix) || len(r.Type) == len(p.n.prefix) {
		return denied("resource type %q lacks the prefix %q", r.Type, p.n.prefix)
	}
	if err := p.Ready(ctx); err != nil {
		return err
	}
	root := p.keeper.RootTenant()
	typ := strings.TrimPrefix(r.Type, p.n.prefix)

	var checks []check
	operator := c.TenantID == root
	if operator {
		checks = append(checks, check{p.obj("tenant", root), permAdminUp})
	}
	var object, exists, fallback []int // indexes into checks
	add := func(to *[]int, ch check) {
		*to = append(*to, len(checks))
		checks = append(checks, ch)
	}
	perm := map[string]string{"read": permRead, "admin": permAdminister}[verb]
	if perm == "" {
		perm = permChange
	}
	switch {
	case typ == "fleet":
		// Fleet-wide resources are decided in the root tenant only.
	case typ == "tenant":
		if r.ID != "" {
			add(&object, check{p.obj("tenant", r.ID), perm})
		}
	default:
		if r.ID != "" {
			add(&object, check{p.obj(typ, r.ID), perm})
			add(&exists, check{p.obj(typ, r.ID), relProjected})
		}
		if r.TenantID != "" {
			// An object SpiceDB does not hold: its tenant's admins
			// decide, and viewers read; no owner counts.
			fp := permAdminister
			if verb == "read" {
				fp = permRead
			}
			add(&fallback, check{p.obj("tenant", r.TenantID), fp})
		}
		if r.ID != "" && r.Parent != nil && r.Parent.ID != "" && strings.HasPrefix(r.Parent.Type, p.n.prefix) {
			add(&fallback, check{p.obj(strings.TrimPrefix(r.Parent.Type, p.n.prefix), r.Parent.ID), permProjectMember})
		}
	}
	if len(checks) == 0 {
		return denied("nothing to decide %s on %s/%s by", action, r.Type, r.ID)
	}
	has, err := p.checkBulk(ctx, c.IdentityID, checks)
	if err != nil {
		return err
	}
	any := func(idx []int) bool {
		for _, i := range idx {
			if has[i] {
				return true
			}
		}
		return false
	}
	allowed := operator && has[0]
	switch {
	case allowed:
	case typ == "fleet":
	case typ == "tenant":
		allowed = any(object)
	case any(exists):
		allowed = any(object)
	default:
		allowed = any(fallback)
	}
	if !allowed {
		return denied("%s on %s/%s", action, r.Type, r.ID)
	}
	return p.keeper.CheckDelegation(ctx, c, action, r)
}

func (p *Port) checkBulk(ctx context.Context, identity string, checks []check) ([]bool, error) {
	items := make([]*v1.CheckBulkPermissionsRequestItem, len(checks))
	subject := p.principal(identity)
	for i, ch := range checks {
		items[i] = &v1.CheckBulkPermissionsRequestItem{Resource: ch.obj, Permission: ch.perm, Subject: subject}
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.client.CheckBulkPermissions(cctx, &v1.CheckBulkPermissionsRequest{Consistency: fullyConsistent(), Items: items})
	if err != nil {
		return nil, unavailable("check", err)
	}
	if len(resp.Pairs) != len(checks) {
		return nil, unavailable("check", fmt.Errorf("%d answers to %d checks", len(resp.Pairs), len(checks)))
	}
	out := make([]bool, len(checks))
	for i, pair := range resp.Pairs {
		switch a := pair.Response.(type) {
		case *v1.CheckBulkPermissionsPair_Item:
			out[i] = a.Item.Permissionship == v1.CheckPermissionResponse_PERMISSIONSHIP_HAS_PERMISSION
		case *v1.CheckBulkPermissionsPair_Error:
			return nil, unavailable("check", fmt.Errorf("%s#%s: %s", checks[i].obj.ObjectType, checks[i].perm, a.Error.GetMessage()))
		}
	}
	return out, nil
}

// verbOf returns the verb of compute:<group>:<verb>.
func verbOf(action string) (string, bool) {
	parts := strings.Split(action, ":")
	if len(parts) != 3 || parts[0] != "compute" || parts[1] == "" || parts[2] == "" {
		return "", false
	}
	return parts[2], true
}

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", iam.ErrDenied, fmt.Sprintf(format, args...))
}

// Reads see every write before them: decisions right after a create or a
// role binding must see it, and the datastore is the arbiter.
func fullyConsistent() *v1.Consistency {
	return &v1.Consistency{Requirement: &v1.Consistency_FullyConsistent{FullyConsistent: true}}
}

// obj is the object of a resource type (with or without the prefix) and id.
func (p *Port) obj(typ, id string) *v1.ObjectReference {
	return &v1.ObjectReference{ObjectType: p.n.def(typ), ObjectId: escapeID(id)}
}

func (p *Port) principal(identity string) *v1.SubjectReference {
	return &v1.SubjectReference{Object: &v1.ObjectReference{ObjectType: p.n.principal(), ObjectId: escapeID(identity)}}
}

func (p *Port) anyPrincipal() *v1.SubjectReference {
	return &v1.SubjectReference{Object: &v1.ObjectReference{ObjectType: p.n.principal(), ObjectId: "*"}}
}

func update(op v1.RelationshipUpdate_Operation, res *v1.ObjectReference, rel string, sub *v1.SubjectReference) *v1.RelationshipUpdate {
	return &v1.RelationshipUpdate{Operation: op, Relationship: &v1.Relationship{Resource: res, Relation: rel, Subject: sub}}
}

// write applies updates in one atomic WriteRelationships.
func (p *Port) write(ctx context.Context, op string, ups []*v1.RelationshipUpdate) error {
	if len(ups) == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if _, err := p.client.WriteRelationships(wctx, &v1.WriteRelationshipsRequest{Updates: ups}); err != nil {
		return unavailable(op, err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// The projection: the keeper's record first, then its mirror.

type projection struct{ p *Port }

var _ iam.Projection = projection{}

func (pr projection) inner() iam.Projection { return pr.p.keeper.Projection() }

// PutDraft writes the draft to the keeper and, when the keeper wrote it (no
// real object holds the id), mirrors it; a real object of the same id is
// left alone, as the keeper leaves it.
func (pr projection) PutDraft(ctx context.Context, r iam.Resource) (bool, error) {
	if err := pr.p.Ready(ctx); err != nil {
		return false, err
	}
	drafted, err := pr.inner().PutDraft(ctx, r)
	if err != nil || !drafted {
		return drafted, err
	}
	r.Draft = true
	if err := pr.p.mirror(ctx, r); err != nil {
		// Nothing is left of a create SpiceDB could not take.
		_ = pr.inner().DropDraft(context.WithoutCancel(ctx), iam.Ref{Type: r.Type, ID: r.ID})
		return false, err
	}
	return true, nil
}

func (pr projection) Get(ctx context.Context, r iam.Ref) (*iam.Resource, error) {
	return pr.inner().Get(ctx, r)
}

// DropDraft drops the keeper's draft and then its mirror, unless the
// object became real meanwhile.
func (pr projection) DropDraft(ctx context.Context, r iam.Ref) error {
	if err := pr.inner().DropDraft(ctx, r); err != nil {
		return err
	}
	cur, err := pr.inner().Get(ctx, r)
	if err != nil || cur != nil {
		return err
	}
	return pr.p.forget(ctx, r)
}

// Put writes in the call's transaction and mirrors at once: a SpiceDB
// failure fails the call, which rolls the transaction back.
func (pr projection) Put(ctx context.Context, tx pgx.Tx, r iam.Resource) error {
	if err := pr.p.Ready(ctx); err != nil {
		return err
	}
	if err := pr.inner().Put(ctx, tx, r); err != nil {
		return err
	}
	r.Draft = false
	return pr.p.mirror(ctx, r)
}

func (pr projection) Delete(ctx context.Context, tx pgx.Tx, r iam.Ref) error {
	if err := pr.p.Ready(ctx); err != nil {
		return err
	}
	if err := pr.inner().Delete(ctx, tx, r); err != nil {
		return err
	}
	return pr.p.forget(ctx, r)
}

func (pr projection) Relate(ctx context.Context, tx pgx.Tx, r iam.Ref, relation, identityID string) error {
	if relation != relMember {
		return fmt.Errorf("spicedb: relation %q is not in the schema (only %s)", relation, relMember)
	}
	if err := pr.p.Ready(ctx); err != nil {
		return err
	}
	if err := pr.inner().Relate(ctx, tx, r, relation, identityID); err != nil {
		return err
	}
	return pr.p.write(ctx, "relate", []*v1.RelationshipUpdate{
		update(v1.RelationshipUpdate_OPERATION_TOUCH, pr.p.obj(r.Type, r.ID), relation, pr.p.principal(identityID))})
}

func (pr projection) Unrelate(ctx context.Context, tx pgx.Tx, r iam.Ref, relation, identityID string) error {
	if err := pr.p.Ready(ctx); err != nil {
		return err
	}
	if err := pr.inner().Unrelate(ctx, tx, r, relation, identityID); err != nil {
		return err
	}
	if relation != relMember {
		return nil
	}
	return pr.p.write(ctx, "unrelate", []*v1.RelationshipUpdate{
		update(v1.RelationshipUpdate_OPERATION_DELETE, pr.p.obj(r.Type, r.ID), relation, pr.p.principal(identityID))})
}

func (pr projection) Related(ctx context.Context, tx pgx.Tx, r iam.Ref, relation string) ([]string, error) {
	return pr.inner().Related(ctx, tx, r, relation)
}

// mirror makes SpiceDB hold r's tenant, parent, owner, shared and
// projected relationships exactly (its members are left alone), in one
// atomic write after reading what it held.
func (p *Port) mirror(ctx context.Context, r iam.Resource) error {
	obj := p.obj(r.Type, r.ID)
	want := p.resourceRelationships(r)
	held, err := p.read(ctx, &v1.RelationshipFilter{ResourceType: obj.ObjectType, OptionalResourceId: obj.ObjectId})
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	var ups []*v1.RelationshipUpdate
	for _, w := range want {
		keep[relKey(w)] = true
		ups = append(ups, &v1.RelationshipUpdate{Operation: v1.RelationshipUpdate_OPERATION_TOUCH, Relationship: w})
	}
	for _, h := range held {
		if h.Relation != relMember && !keep[relKey(h)] {
			ups = append(ups, &v1.RelationshipUpdate{Operation: v1.RelationshipUpdate_OPERATION_DELETE, Relationship: h})
		}
	}
	return p.write(ctx, "mirror resource", ups)
}

// resourceRelationships are what SpiceDB holds of a projected resource.
func (p *Port) resourceRelationships(r iam.Resource) []*v1.Relationship {
	obj := p.obj(r.Type, r.ID)
	rel := func(name string, sub *v1.SubjectReference) *v1.Relationship {
		return &v1.Relationship{Resource: obj, Relation: name, Subject: sub}
	}
	out := []*v1.Relationship{
		rel(relTenant, &v1.SubjectReference{Object: p.obj("tenant", r.TenantID)}),
		rel(relProjected, p.anyPrincipal()),
	}
	if r.Parent != nil && r.Parent.Type != "" && r.Parent.ID != "" {
		out = append(out, rel(relParent, &v1.SubjectReference{Object: p.obj(r.Parent.Type, r.Parent.ID)}))
	}
	if r.Owner != "" {
		out = append(out, rel(relOwner, p.principal(r.Owner)))
	}
	if !r.Draft && r.TenantID == p.keeper.RootTenant() && r.Attributes[iam.AttrShared] == "true" {
		out = append(out, rel(relSharedBy, &v1.SubjectReference{Object: &v1.ObjectReference{ObjectType: p.n.platform(), ObjectId: platformID}}))
	}
	return out
}

func relKey(r *v1.Relationship) string {
	s := r.Subject
	return r.Relation + "@" + s.Object.ObjectType + ":" + s.Object.ObjectId + "#" + s.OptionalRelation
}

// forget removes every relationship of the object.
func (p *Port) forget(ctx context.Context, r iam.Ref) error {
	obj := p.obj(r.Type, r.ID)
	dctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	_, err := p.client.DeleteRelationships(dctx, &v1.DeleteRelationshipsRequest{
		RelationshipFilter: &v1.RelationshipFilter{ResourceType: obj.ObjectType, OptionalResourceId: obj.ObjectId}})
	if err != nil {
		return unavailable("delete relationships", err)
	}
	return nil
}

func (p *Port) read(ctx context.Context, f *v1.RelationshipFilter) ([]*v1.Relationship, error) {
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	stream, err := p.client.ReadRelationships(rctx, &v1.ReadRelationshipsRequest{Consistency: fullyConsistent(), RelationshipFilter: f})
	if err != nil {
		return nil, unavailable("read relationships", err)
	}
	var out []*v1.Relationship
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, unavailable("read relationships", err)
		}
		out = append(out, resp.Relationship)
	}
}
