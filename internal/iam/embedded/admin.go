package embedded

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/store"
)

// Errors of the administration functions (possibly wrapped).
var (
	// ErrInvalid: a request the operator commands would refuse as usage.
	ErrInvalid = errors.New("iam: invalid request")
	// ErrConflict: the request contradicts what exists (the identity lives
	// in another tenant, or holds another role in this one).
	ErrConflict = errors.New("iam: conflict")
	// ErrKeyNotFound: no key has this id.
	ErrKeyNotFound = errors.New("iam: key not found")
	// ErrIdentityNotFound: the tenant has no such identity.
	ErrIdentityNotFound = errors.New("iam: identity not found")
)

// Identity kinds.
const (
	KindUser    = "user"
	KindService = "service"
	KindAgent   = "agent"
)

// RootAdminIdentity is the identity EnsureRootAdminKey issues keys for.
const RootAdminIdentity = "admin"

// KeyRequest asks for a new API key.
type KeyRequest struct {
	// Tenant and Identity are created when absent. An identity belongs to
	// one tenant.
	Tenant   string
	Identity string
	// Role is bound to the identity in the tenant when it holds none; an
	// identity holding another role is a conflict (keys carry their
	// identity's role, so a second role would change keys already issued).
	Role string
	// Kind is the kind of an identity created now: user (default),
	// service or agent. An existing identity keeps its kind.
	Kind string
	// MFA marks the key as an MFA session.
	MFA bool
	// Agent makes the key an agent key: a delegation from Identity to
	// this agent, holding the Confirm actions for confirmation.
	Agent   string
	Confirm []string
}

// KeyInfo describes a key; it never holds the token or its hash.
type KeyInfo struct {
	KeyID          string
	Tenant         string
	Identity       string
	IdentityKind   string
	Role           string
	MFA            bool
	AgentID        string
	DelegationID   string
	ConfirmActions []string
	CreatedAt      time.Time
	RevokedAt      *time.Time
}

// Validate checks the request's shapes: what the operator commands answer
// with exit status 2.
func (r KeyRequest) Validate() error {
	switch {
	case !tenantPattern.MatchString(r.Tenant):
		return fmt.Errorf("%w: tenant must be 1 to 128 characters of A-Z a-z 0-9 . _ : -", ErrInvalid)
	case !identityPattern.MatchString(r.Identity):
		return fmt.Errorf("%w: identity must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -", ErrInvalid)
	case parseRole(r.Role) == roleNone:
		return fmt.Errorf("%w: role must be one of owner, admin, member, viewer", ErrInvalid)
	case r.Kind != "" && r.Kind != KindUser && r.Kind != KindService && r.Kind != KindAgent:
		return fmt.Errorf("%w: kind must be one of user, service, agent", ErrInvalid)
	case r.Agent != "" && !identityPattern.MatchString(r.Agent):
		return fmt.Errorf("%w: agent must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -", ErrInvalid)
	case len(r.Confirm) > 0 && r.Agent == "":
		return fmt.Errorf("%w: confirm actions need an agent", ErrInvalid)
	}
	for _, a := range r.Confirm {
		if !actionPattern.MatchString(a) {
			return fmt.Errorf("%w: action %q is not compute:<group>:<verb>", ErrInvalid, a)
		}
	}
	return nil
}

// CreateKey creates an API key (and what it needs: tenant, identity, role
// binding, delegation) and returns the token, shown once and stored only as
// its SHA-256, and the key id.
func (s *Service) CreateKey(ctx context.Context, req KeyRequest) (token, keyID string, err error) {
	if err := req.Validate(); err != nil {
		return "", "", err
	}
	err = s.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		token, keyID, err = s.createKey(ctx, db.New(tx), req)
		return err
	})
	if err != nil {
		return "", "", err
	}
	return token, keyID, nil
}

func (s *Service) createKey(ctx context.Context, q *db.Queries, req KeyRequest) (string, string, error) {
	now := s.now()
	if err := q.IAMEnsureTenant(ctx, db.IAMEnsureTenantParams{ID: req.Tenant, CreatedAt: now}); err != nil {
		return "", "", fmt.Errorf("iam: create tenant: %w", err)
	}
	kind := req.Kind
	if kind == "" {
		kind = KindUser
	}
	if err := q.IAMEnsureIdentity(ctx, db.IAMEnsureIdentityParams{ID: req.Identity, TenantID: req.Tenant, Kind: kind, CreatedAt: now}); err != nil {
		return "", "", fmt.Errorf("iam: create identity: %w", err)
	}
	ident, err := q.IAMGetIdentity(ctx, req.Identity)
	if err != nil {
		return "", "", fmt.Errorf("iam: create identity: %w", err)
	}
	if ident.TenantID != req.Tenant {
		return "", "", fmt.Errorf("%w: identity %s belongs to tenant %s", ErrConflict, req.Identity, ident.TenantID)
	}
	held, err := q.IAMGetRole(ctx, db.IAMGetRoleParams{TenantID: req.Tenant, IdentityID: req.Identity})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if err := q.IAMEnsureRoleBinding(ctx, db.IAMEnsureRoleBindingParams{TenantID: req.Tenant, IdentityID: req.Identity, Role: req.Role, CreatedAt: now}); err != nil {
			return "", "", fmt.Errorf("iam: bind role: %w", err)
		}
		if held, err = q.IAMGetRole(ctx, db.IAMGetRoleParams{TenantID: req.Tenant, IdentityID: req.Identity}); err != nil {
			return "", "", fmt.Errorf("iam: bind role: %w", err)
		}
		// A new binding is a role change: external decision services
		// (SpiceDB) learn bindings from the inbox, never on the
		// authentication path.
		if held == req.Role {
			if err := s.writeEvent(ctx, q, EventRoleChanged, req.Identity, ""); err != nil {
				return "", "", fmt.Errorf("iam: bind role: inbox: %w", err)
			}
		}
	case err != nil:
		return "", "", fmt.Errorf("iam: bind role: %w", err)
	}
	if held != req.Role {
		return "", "", fmt.Errorf("%w: identity %s holds role %s in tenant %s, not %s", ErrConflict, req.Identity, held, req.Tenant, req.Role)
	}
	var delegation string
	if req.Agent != "" {
		delegation = newID("dlg_")
		actions := slices.Clone(req.Confirm)
		slices.Sort(actions)
		actions = slices.Compact(actions)
		if actions == nil {
			actions = []string{}
		}
		if err := q.IAMInsertDelegation(ctx, db.IAMInsertDelegationParams{
			ID: delegation, TenantID: req.Tenant, IdentityID: req.Identity, AgentID: req.Agent,
			ConfirmActions: actions, CreatedAt: now,
		}); err != nil {
			return "", "", fmt.Errorf("iam: create delegation: %w", err)
		}
	}
	token, keyID := newToken()
	if err := q.IAMInsertKey(ctx, db.IAMInsertKeyParams{
		ID: keyID, TenantID: req.Tenant, IdentityID: req.Identity, TokenHash: hashToken(token),
		Mfa: req.MFA, AgentID: text(req.Agent), DelegationID: text(delegation), CreatedAt: now,
	}); err != nil {
		return "", "", fmt.Errorf("iam: create key: %w", err)
	}
	return token, keyID, nil
}

// RevokeKey revokes a key and writes a credential.revoked event with its
// session to the inbox, so that workers drop it from the caches and close
// what it opened. Revoking a revoked key changes nothing.
func (s *Service) RevokeKey(ctx context.Context, keyID string) error {
	return s.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		now := s.now()
		row, err := q.IAMRevokeKey(ctx, db.IAMRevokeKeyParams{ID: keyID, RevokedAt: &now})
		if errors.Is(err, pgx.ErrNoRows) {
			found, err := q.IAMKeyExists(ctx, keyID)
			if err != nil {
				return fmt.Errorf("iam: revoke key: %w", err)
			}
			if !found {
				return fmt.Errorf("%w: %s", ErrKeyNotFound, keyID)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("iam: revoke key: %w", err)
		}
		if err := s.writeEvent(ctx, q, EventCredentialRevoked, row.IdentityID, sessionOf(row.ID)); err != nil {
			return fmt.Errorf("iam: revoke key: inbox: %w", err)
		}
		return nil
	})
}

// ListKeys lists the keys of a tenant (every tenant when tenant is empty),
// revoked ones included, by tenant and age.
func (s *Service) ListKeys(ctx context.Context, tenant string) ([]KeyInfo, error) {
	rows, err := s.st.Queries().IAMListKeys(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: list keys: %w", err)
	}
	out := make([]KeyInfo, len(rows))
	for i, r := range rows {
		out[i] = KeyInfo{
			KeyID: r.ID, Tenant: r.TenantID, Identity: r.IdentityID, IdentityKind: r.IdentityKind,
			Role: r.Role, MFA: r.Mfa, AgentID: r.AgentID.String, DelegationID: r.DelegationID.String,
			ConfirmActions: r.ConfirmActions, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt,
		}
	}
	return out, nil
}

// EnsureRootAdminKey gives a fresh install its first key: when the root
// tenant has no live key of an owner or admin, it creates one for identity
// admin with role owner and returns its token (created true); otherwise it
// returns created false and no token. Processes starting together create
// one key between them.
func (s *Service) EnsureRootAdminKey(ctx context.Context) (token string, created bool, err error) {
	err = s.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		if err := q.AdvisoryXactLock(ctx, rootKeyLockID); err != nil {
			return fmt.Errorf("iam: root key: lock: %w", err)
		}
		found, err := q.IAMTenantHasAdminKey(ctx, s.root)
		if err != nil {
			return fmt.Errorf("iam: root key: %w", err)
		}
		if found {
			return nil
		}
		token, _, err = s.createKey(ctx, q, KeyRequest{Tenant: s.root, Identity: RootAdminIdentity, Role: RoleOwner})
		if err != nil {
			return fmt.Errorf("iam: root key: %w", err)
		}
		created = true
		return nil
	})
	if err != nil {
		return "", false, err
	}
	return token, created, nil
}

// SetRole changes the role of an identity of tenant and returns the role it
// held ("" for none). Its keys carry the new role from their next
// authentication (cached credentials keep the old one for up to 30 s);
// a change writes a role.changed event, so open tunnels are decided again
// and an external decision service (SpiceDB) takes the new binding.
func (s *Service) SetRole(ctx context.Context, tenant, identity, role string) (string, error) {
	if parseRole(role) == roleNone {
		return "", fmt.Errorf("%w: role must be one of %s", ErrInvalid, strings.Join(Roles, ", "))
	}
	var old string
	err := s.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		ident, err := q.IAMGetIdentity(ctx, identity)
		if _, err := store.Visible(ident, err, ident.TenantID == tenant,
			fmt.Errorf("%w: identity %s is not in tenant %s", ErrIdentityNotFound, identity, tenant)); err != nil {
			return err
		}
		if old, err = q.IAMGetRole(ctx, db.IAMGetRoleParams{TenantID: tenant, IdentityID: identity}); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if err := q.IAMSetRole(ctx, db.IAMSetRoleParams{TenantID: tenant, IdentityID: identity, Role: role, CreatedAt: s.now()}); err != nil {
			return err
		}
		if old == role {
			return nil
		}
		// What the identity holds open (tunnels) is decided again.
		return s.writeEvent(ctx, q, EventRoleChanged, identity, "")
	})
	return old, err
}
