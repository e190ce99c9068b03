package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/iam"
)

// Roles per tenant, ordered: each one holds the rights of those below it.
type role int

const (
	roleNone role = iota
	roleViewer
	roleMember
	roleAdmin
	roleOwner
)

// Role names as stored in iam.role_bindings.
const (
	RoleOwner  = "owner"
	RoleAdmin  = "admin"
	RoleMember = "member"
	RoleViewer = "viewer"
)

// Roles lists the role names, highest first.
var Roles = []string{RoleOwner, RoleAdmin, RoleMember, RoleViewer}

func parseRole(s string) role {
	switch s {
	case RoleOwner:
		return roleOwner
	case RoleAdmin:
		return roleAdmin
	case RoleMember:
		return roleMember
	case RoleViewer:
		return roleViewer
	}
	return roleNone
}

// Verbs with a meaning of their own; every other verb (manage, ...) is a
// change.
const (
	verbRead  = "read"
	verbAdmin = "admin"
)

// relationMember is the relationship that makes an identity a member of a
// project.
const relationMember = "member"

// Require decides a mutation. It is never cached by the gate.
func (s *Service) Require(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	return s.decide(ctx, c, action, r)
}

// Authorize decides a read; the gate caches its allows per session. The
// embedded policy decides reads and mutations by the same rules: the verb
// of the action says which.
func (s *Service) Authorize(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	return s.decide(ctx, c, action, r)
}

// target is the resource a decision is made on, as the projection knows
// it, or as the caller of the decision gave it when the projection does
// not hold it.
type target struct {
	typ, id, tenant      string
	parentType, parentID string
	owner                string // only from the projection
	shared               bool   // a real resource marked shared (AttrShared)
}

// decide applies the policy of docs/identity.md. The order matters: the
// caller's identity, the action's shape, fleet-wide resources, the tenant,
// the role (with project membership), and last the agent's delegation, so
// that an agent is only asked to confirm what its identity may do.
func (s *Service) decide(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	if c == nil || c.IdentityID == "" || c.TenantID == "" {
		return iam.ErrUnauthenticated
	}
	if !actionPattern.MatchString(action) {
		return denied("malformed action %q", action)
	}
	if !strings.HasPrefix(r.Type, s.prefix) || len(r.Type) == len(s.prefix) {
		return denied("resource type %q lacks the prefix %q", r.Type, s.prefix)
	}
	verb := action[strings.LastIndexByte(action, ':')+1:]
	q := s.queries(ctx)

	if err := s.allowed(ctx, q, c, verb, r); err != nil {
		return err
	}
	if c.DelegationID != "" {
		return s.checkDelegation(ctx, q, c, action, r)
	}
	return nil
}

func (s *Service) allowed(ctx context.Context, q *db.Queries, c *iam.Caller, verb string, r iam.Resource) error {
	// Fleet-wide resources belong to no tenant: they are decided in the
	// root tenant, for its owners and admins only, whatever the verb.
	if r.Type == s.prefix+"fleet" {
		if c.TenantID != s.root {
			return denied("fleet-wide resources are decided in the root tenant")
		}
		rl, err := s.roleOf(ctx, q, s.root, c.IdentityID)
		if err != nil {
			return err
		}
		if rl >= roleAdmin {
			return nil
		}
		return denied("fleet-wide resources need owner or admin in the root tenant")
	}

	t, err := s.resolve(ctx, q, r)
	if err != nil {
		return err
	}
	if t.tenant == "" {
		return denied("resource %s/%s names no tenant", t.typ, t.id)
	}

	if c.TenantID != t.tenant {
		// Platform resources marked shared (shared sites) are read by every
		// tenant's viewers and above.
		if verb == verbRead && t.shared && t.tenant == s.root {
			rl, err := s.roleOf(ctx, q, c.TenantID, c.IdentityID)
			if err != nil {
				return err
			}
			if rl >= roleViewer {
				return nil
			}
		}
		// The fleet operators: owners and admins of the root tenant act in
		// every tenant.
		if c.TenantID == s.root {
			rl, err := s.roleOf(ctx, q, s.root, c.IdentityID)
			if err != nil {
				return err
			}
			if rl >= roleAdmin {
				return nil
			}
		}
		return denied("tenant %s may not act in tenant %s", c.TenantID, t.tenant)
	}

	rl, err := s.roleOf(ctx, q, t.tenant, c.IdentityID)
	if err != nil {
		return err
	}
	switch {
	case rl >= roleAdmin:
		return nil
	case verb == verbAdmin:
		return denied("%s needs owner or admin", verb)
	case verb == verbRead:
		if rl >= roleViewer {
			return nil
		}
		// A project member reads the project and what is in it.
		ok, err := s.projectMember(ctx, q, c, t, true)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		return denied("no role in tenant %s", t.tenant)
	}

	// A change (manage and every other verb).
	if rl == roleMember {
		// Members create: creates are decided on the tenant (or on a draft
		// the caller owns).
		if t.typ == s.prefix+"tenant" {
			return nil
		}
		// Creators own what they create; owners manage their own.
		if t.owner != "" && t.owner == c.IdentityID {
			return nil
		}
	}
	// A project member manages what is in the project, not the project.
	ok, err := s.projectMember(ctx, q, c, t, false)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if rl == roleViewer || rl == roleNone {
		return denied("%s needs member or above in tenant %s", verb, t.tenant)
	}
	return denied("members change only what they own")
}

// resolve finds the resource in the projection; a resource it does not
// hold is decided on the type and tenant (and parent, for project
// membership) given, never on an owner given: ownership is what the
// projection recorded.
func (s *Service) resolve(ctx context.Context, q *db.Queries, r iam.Resource) (target, error) {
	t := target{typ: r.Type, id: r.ID, tenant: r.TenantID}
	if r.Type == s.prefix+"tenant" && r.ID != "" {
		// A tenant is its own tenant and has no owner or parent: no lookup,
		// which saves every create and tenant-level call a round trip.
		t.tenant = r.ID
		return t, nil
	}
	if r.Parent != nil {
		t.parentType, t.parentID = r.Parent.Type, r.Parent.ID
	}
	if d, ok := ctx.Value(writtenDraftKey{}).(iam.Resource); ok && d.Type == r.Type && d.ID == r.ID && r.ID != "" {
		t.tenant, t.owner = d.TenantID, d.Owner
		if d.Parent != nil && d.Parent.Type != "" && d.Parent.ID != "" { // as resourceParams writes it
			t.parentType, t.parentID = d.Parent.Type, d.Parent.ID
		}
	} else if r.ID != "" {
		row, err := q.IAMGetResource(ctx, db.IAMGetResourceParams{Type: r.Type, ID: r.ID})
		switch {
		case err == nil:
			t.tenant = row.TenantID
			t.parentType, t.parentID = row.ParentType.String, row.ParentID.String
			t.owner = row.OwnerID.String
			t.shared = !row.Draft && attributeTrue(row.Attributes, iam.AttrShared)
		case !errors.Is(err, pgx.ErrNoRows):
			return t, unavailable(err)
		}
	}
	// A tenant resource not (yet) projected is its own tenant.
	if t.tenant == "" && r.Type == s.prefix+"tenant" {
		t.tenant = r.ID
	}
	return t, nil
}

// roleOf reads identity's role in tenant. Every decision asks for the
// caller's role in its own tenant (the fleet operators' is the root
// tenant's, which is then theirs): PutDraftRequire reads it in the
// pipeline of the draft and hands it over in ctx.
func (s *Service) roleOf(ctx context.Context, q *db.Queries, tenant, identity string) (role, error) {
	var name string
	var err error
	if r, ok := ctx.Value(readRoleKey{}).(readRole); ok && r.tenant == tenant && r.identity == identity {
		name, err = r.name, r.err
	} else {
		name, err = q.IAMGetRole(ctx, db.IAMGetRoleParams{TenantID: tenant, IdentityID: identity})
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return roleNone, nil
	}
	if err != nil {
		return roleNone, unavailable(err)
	}
	return parseRole(name), nil
}

// projectMember reports whether the caller is a member of a project of the
// resource's tenant that contains the resource (or, with self, is it).
func (s *Service) projectMember(ctx context.Context, q *db.Queries, c *iam.Caller, t target, self bool) (bool, error) {
	// Without a parent only the resource itself can be the project
	// (IAMProjectMember's chain): nothing to read.
	if t.id == "" || t.parentType == "" && !self {
		return false, nil
	}
	arg := s.memberParams(c, t, self)
	var ok bool
	var err error
	if r, read := ctx.Value(readMemberKey{}).(readMember); read && r.arg == arg {
		ok, err = r.ok, r.err
	} else {
		ok, err = q.IAMProjectMember(ctx, arg)
	}
	if err != nil {
		return false, unavailable(err)
	}
	return ok, nil
}

func (s *Service) memberParams(c *iam.Caller, t target, self bool) db.IAMProjectMemberParams {
	return db.IAMProjectMemberParams{
		TenantID:    t.tenant,
		ProjectType: s.prefix + "project",
		IncludeSelf: self,
		IdentityID:  c.IdentityID,
		Type:        t.typ,
		ID:          t.id,
		ParentType:  t.parentType,
		ParentID:    t.parentID,
	}
}

// checkDelegation holds the delegation's listed actions for confirmation:
// it records a confirmation and answers *iam.ConfirmationRequired.
func (s *Service) checkDelegation(ctx context.Context, q *db.Queries, c *iam.Caller, action string, r iam.Resource) error {
	d, err := q.IAMGetDelegation(ctx, c.DelegationID)
	if errors.Is(err, pgx.ErrNoRows) {
		return iam.ErrUnauthenticated
	}
	if err != nil {
		return unavailable(err)
	}
	if d.IdentityID != c.IdentityID || d.TenantID != c.TenantID || d.AgentID != c.AgentID {
		return denied("the delegation does not belong to this session")
	}
	if !slices.Contains(d.ConfirmActions, action) {
		return nil
	}
	now := s.now()
	cr := &iam.ConfirmationRequired{
		ConfirmationID: newID("cfm_"),
		ExpiresAt:      now.Add(confirmationTTL).UTC().Truncate(time.Microsecond),
		Action:         action,
		Resource:       iam.Ref{Type: r.Type, ID: r.ID},
	}
	if err := q.IAMInsertConfirmation(ctx, db.IAMInsertConfirmationParams{
		ID:           cr.ConfirmationID,
		DelegationID: d.ID,
		Action:       action,
		ResourceType: r.Type,
		ResourceID:   r.ID,
		CreatedAt:    now,
		ExpiresAt:    cr.ExpiresAt,
	}); err != nil {
		return unavailable(err)
	}
	return cr
}

func denied(format string, args ...any) error {
	return fmt.Errorf("%w: %s", iam.ErrDenied, fmt.Sprintf(format, args...))
}

// attributeTrue reports whether the JSON attributes hold name: "true".
func attributeTrue(raw []byte, name string) bool {
	var attrs map[string]string
	if json.Unmarshal(raw, &attrs) != nil {
		return false
	}
	return attrs[name] == "true"
}

// RoleOf returns the role identity holds in tenant, "" for none. External
// decision services mirror role bindings from it.
func (s *Service) RoleOf(ctx context.Context, tenant, identity string) (string, error) {
	rl, err := s.roleOf(ctx, s.st.Queries(), tenant, identity)
	if err != nil || rl == roleNone {
		return "", err
	}
	return Roles[roleOwner-rl], nil
}

// CheckDelegation applies the caller's delegation (nil without one): an
// action it holds for confirmation is recorded and answered with
// *iam.ConfirmationRequired. External decision services call it after
// they allowed the identity, as decide does.
func (s *Service) CheckDelegation(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error {
	if c.DelegationID == "" {
		return nil
	}
	return s.checkDelegation(ctx, s.st.Queries(), c, action, r)
}
