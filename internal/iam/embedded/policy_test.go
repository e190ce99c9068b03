package embedded

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/iam"
)

// policyWorld is the fixture of the policy table: keys of each role in the
// root tenant and in acme, an admin of tenant other, a project member, an
// agent key, and a projection holding resources of several owners.
func policyWorld(t *testing.T) (*Service, map[string]*iam.Caller) {
	t.Helper()
	s, st, _ := newTestService(t)
	ctx := context.Background()
	callers := map[string]*iam.Caller{}
	for _, k := range []struct{ name, tenant, role string }{
		{"root-owner", "root", RoleOwner},
		{"root-admin", "root", RoleAdmin},
		{"root-member", "root", RoleMember},
		{"root-viewer", "root", RoleViewer},
		{"acme-owner", "acme", RoleOwner},
		{"acme-admin", "acme", RoleAdmin},
		{"alice", "acme", RoleMember},
		{"bob", "acme", RoleMember},
		{"vic", "acme", RoleViewer},
		{"pat", "acme", RoleViewer}, // member of project prj-1
		{"other-admin", "other", RoleAdmin},
	} {
		callers[k.name] = mustCaller(t, s, KeyRequest{Tenant: k.tenant, Identity: k.name, Role: k.role})
	}
	callers["carol-bot"] = mustCaller(t, s, KeyRequest{Tenant: "acme", Identity: "carol", Role: RoleMember,
		Agent: "bot-1", Confirm: []string{"compute:sandboxes:manage"}})

	proj := s.Projection()
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		for _, r := range []iam.Resource{
			{Type: "compute-sandbox-template", ID: "tpl-alice", TenantID: "acme", Owner: "alice"},
			{Type: "compute-sandbox-template", ID: "tpl-bob", TenantID: "acme", Owner: "bob"},
			{Type: "compute-sandbox-template", ID: "tpl-carol", TenantID: "acme", Owner: "carol"},
			{Type: "compute-project", ID: "prj-1", TenantID: "acme", Owner: "acme-owner"},
			{Type: "compute-pool", ID: "pool-p", TenantID: "acme", Owner: "bob", Parent: &iam.Ref{Type: "compute-project", ID: "prj-1"}},
			{Type: "compute-sandbox-volume", ID: "vol-p", TenantID: "acme", Owner: "bob", Parent: &iam.Ref{Type: "compute-pool", ID: "pool-p"}},
			{Type: "compute-pool", ID: "pool-x", TenantID: "acme", Owner: "bob"},
			{Type: "compute-site", ID: "site-other", TenantID: "other", Owner: "other-admin"},
		} {
			if err := proj.Put(ctx, tx, r); err != nil {
				return err
			}
		}
		return proj.Relate(ctx, tx, iam.Ref{Type: "compute-project", ID: "prj-1"}, "member", "pat")
	}))
	_, err := proj.PutDraft(ctx, iam.Resource{Type: "compute-sandbox-volume", ID: "vol-new", TenantID: "acme", Owner: "alice", Draft: true})
	require.NoError(t, err)
	return s, callers
}

func TestPolicy(t *testing.T) {
	s, callers := policyWorld(t)
	ctx := context.Background()

	tenant := func(id string) iam.Resource { return iam.Resource{Type: "compute-tenant", ID: id, TenantID: id} }
	res := func(typ, id string) iam.Resource { return iam.Resource{Type: "compute-" + typ, ID: id} }
	fleet := iam.Resource{Type: "compute-fleet", ID: "global"}

	const (
		allow   = "allow"
		deny    = "deny"
		confirm = "confirm"
	)
	tests := []struct {
		name   string
		caller string
		action string
		r      iam.Resource
		want   string
	}{
		// Roles in the caller's own tenant.
		{"viewer reads the tenant", "vic", "compute:sites:read", tenant("acme"), allow},
		{"viewer reads another's resource", "vic", "compute:sandboxes:read", res("sandbox-template", "tpl-alice"), allow},
		{"viewer never creates", "vic", "compute:sites:manage", tenant("acme"), deny},
		{"viewer never manages", "vic", "compute:sandboxes:manage", res("sandbox-template", "tpl-bob"), deny},
		{"member creates on the tenant", "alice", "compute:sites:manage", tenant("acme"), allow},
		{"member reads", "alice", "compute:sandboxes:read", res("sandbox-template", "tpl-bob"), allow},
		{"member manages own resource", "alice", "compute:sandboxes:manage", res("sandbox-template", "tpl-alice"), allow},
		{"member not another's resource", "alice", "compute:sandboxes:manage", res("sandbox-template", "tpl-bob"), deny},
		{"member no admin verb", "alice", "compute:webhooks:admin", tenant("acme"), deny},
		{"admin manages another's resource", "acme-admin", "compute:sandboxes:manage", res("sandbox-template", "tpl-bob"), allow},
		{"owner manages another's resource", "acme-owner", "compute:sandboxes:manage", res("sandbox-template", "tpl-alice"), allow},
		{"admin admin verb", "acme-admin", "compute:webhooks:admin", tenant("acme"), allow},

		// Drafts are decided like real resources, owned by their creator.
		{"creator manages own draft", "alice", "compute:sandboxes:manage", res("sandbox-volume", "vol-new"), allow},
		{"member not another's draft", "bob", "compute:sandboxes:manage", res("sandbox-volume", "vol-new"), deny},

		// Resources absent from the projection: type and tenant as given.
		{"absent: viewer reads in own tenant", "vic", "compute:sandboxes:read",
			iam.Resource{Type: "compute-sandbox-template", ID: "ghost", TenantID: "acme"}, allow},
		{"absent: a given owner is not believed", "alice", "compute:sandboxes:manage",
			iam.Resource{Type: "compute-sandbox-template", ID: "ghost", TenantID: "acme", Owner: "alice"}, deny},
		{"absent: admin manages", "acme-admin", "compute:sandboxes:manage",
			iam.Resource{Type: "compute-sandbox-template", ID: "ghost", TenantID: "acme"}, allow},
		{"absent: other tenant", "acme-owner", "compute:sandboxes:read",
			iam.Resource{Type: "compute-sandbox-template", ID: "ghost", TenantID: "other"}, deny},
		{"absent: no tenant", "acme-owner", "compute:sandboxes:read",
			iam.Resource{Type: "compute-sandbox-template", ID: "ghost"}, deny},
		{"absent tenant resource is its own tenant", "alice", "compute:sites:manage", res("tenant", "acme"), allow},
		{"the projection's tenant wins over the given one", "acme-owner", "compute:sites:read",
			iam.Resource{Type: "compute-site", ID: "site-other", TenantID: "acme"}, deny},

		// Tenants: a caller acts in its own tenant only ...
		{"owner of acme not in other", "acme-owner", "compute:sites:read", res("site", "site-other"), deny},
		{"admin of other not in acme", "other-admin", "compute:sites:manage", tenant("acme"), deny},
		// ... except the fleet operators, root owners and admins.
		{"root admin manages in acme", "root-admin", "compute:sandboxes:manage", res("sandbox-template", "tpl-bob"), allow},
		{"root owner reads in other", "root-owner", "compute:sites:read", res("site", "site-other"), allow},
		{"root owner creates in acme", "root-owner", "compute:sites:manage", tenant("acme"), allow},
		{"root member not in acme", "root-member", "compute:sites:read", tenant("acme"), deny},
		{"root viewer not in acme", "root-viewer", "compute:sites:read", tenant("acme"), deny},
		{"root member creates in root", "root-member", "compute:sites:manage", tenant("root"), allow},

		// Fleet-wide resources: root owners and admins only, any verb.
		{"fleet: root owner", "root-owner", "compute:fleet:admin", fleet, allow},
		{"fleet: root admin", "root-admin", "compute:fleet:admin", fleet, allow},
		{"fleet: root admin creates a shared site", "root-admin", "compute:sites:manage", fleet, allow},
		{"fleet: root member", "root-member", "compute:sites:manage", fleet, deny},
		{"fleet: root viewer reads", "root-viewer", "compute:fleet:read", fleet, deny},
		{"fleet: tenant owner", "acme-owner", "compute:fleet:admin", fleet, deny},
		{"fleet: tenant owner, fleet secret", "acme-owner", "compute:secrets:manage", fleet, deny},
		{"fleet: tenant given is ignored", "acme-owner", "compute:fleet:admin",
			iam.Resource{Type: "compute-fleet", ID: "global", TenantID: "acme"}, deny},

		// Projects: the member relation grants member rights in the project.
		{"project member reads the project", "pat", "compute:projects:read", res("project", "prj-1"), allow},
		{"project member manages in the project", "pat", "compute:sandboxes:manage", res("pool", "pool-p"), allow},
		{"project member manages deeper in the project", "pat", "compute:sandboxes:manage", res("sandbox-volume", "vol-p"), allow},
		{"project member creates in the project", "pat", "compute:sandboxes:manage",
			iam.Resource{Type: "compute-pool", ID: "new-pool", TenantID: "acme", Parent: &iam.Ref{Type: "compute-project", ID: "prj-1"}}, allow},
		{"project member does not manage the project", "pat", "compute:projects:manage", res("project", "prj-1"), deny},
		{"project member not outside the project", "pat", "compute:sandboxes:manage", res("pool", "pool-x"), deny},
		{"not a project member", "vic", "compute:sandboxes:manage", res("pool", "pool-p"), deny},

		// Agents: the delegation's actions wait for a confirmation; the
		// rest is decided on the identity's role.
		{"agent: held action", "carol-bot", "compute:sandboxes:manage", res("sandbox-template", "tpl-carol"), confirm},
		{"agent: other action", "carol-bot", "compute:sandboxes:read", res("sandbox-template", "tpl-bob"), allow},
		{"agent: create not held", "carol-bot", "compute:sites:manage", tenant("acme"), allow},
		{"agent: held but refused is refused", "carol-bot", "compute:sandboxes:manage", res("sandbox-template", "tpl-bob"), deny},

		// Shapes.
		{"malformed action", "acme-owner", "sites:manage", tenant("acme"), deny},
		{"type without the prefix", "acme-owner", "compute:sites:read", iam.Resource{Type: "tenant", ID: "acme", TenantID: "acme"}, deny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := callers[tc.caller]
			require.NotNil(t, c, tc.caller)
			for _, decide := range []func(context.Context, *iam.Caller, string, iam.Resource) error{s.Require, s.Authorize} {
				err := decide(ctx, c, tc.action, tc.r)
				switch tc.want {
				case allow:
					require.NoError(t, err)
				case deny:
					require.ErrorIs(t, err, iam.ErrDenied)
				case confirm:
					var cr *iam.ConfirmationRequired
					require.ErrorAs(t, err, &cr)
					assert.NotErrorIs(t, err, iam.ErrDenied)
					assert.True(t, strings.HasPrefix(cr.ConfirmationID, "cfm_"))
					assert.Equal(t, epoch.Add(confirmationTTL), cr.ExpiresAt)
					assert.Equal(t, tc.action, cr.Action)
					assert.Equal(t, iam.Ref{Type: tc.r.Type, ID: tc.r.ID}, cr.Resource)
					row, err := s.st.Queries().IAMGetConfirmation(ctx, cr.ConfirmationID)
					require.NoError(t, err, "the confirmation is recorded")
					assert.Equal(t, c.DelegationID, row.DelegationID)
					assert.Equal(t, tc.action, row.Action)
					assert.Equal(t, tc.r.Type+"/"+tc.r.ID, row.ResourceType+"/"+row.ResourceID)
					assert.True(t, row.ExpiresAt.Equal(cr.ExpiresAt))
				}
			}
		})
	}
}

func TestPolicyEdges(t *testing.T) {
	s, callers := policyWorld(t)
	ctx := context.Background()
	r := iam.Resource{Type: "compute-tenant", ID: "acme", TenantID: "acme"}

	assert.ErrorIs(t, s.Require(ctx, nil, "compute:sites:read", r), iam.ErrUnauthenticated)
	assert.ErrorIs(t, s.Require(ctx, &iam.Caller{}, "compute:sites:read", r), iam.ErrUnauthenticated)

	// An identity without a binding in its tenant has no rights.
	ghost := &iam.Caller{IdentityID: "nobody", TenantID: "acme", Session: "x"}
	assert.ErrorIs(t, s.Authorize(ctx, ghost, "compute:sites:read", r), iam.ErrDenied)

	// A caller claiming a delegation that is not its own.
	forged := *callers["alice"]
	forged.AgentID, forged.DelegationID = "bot-1", callers["carol-bot"].DelegationID
	assert.ErrorIs(t, s.Require(ctx, &forged, "compute:sites:manage", r), iam.ErrDenied)

	// Denials carry a reason.
	err := s.Require(ctx, callers["vic"], "compute:sites:manage", r)
	require.ErrorIs(t, err, iam.ErrDenied)
	assert.NotEqual(t, iam.ErrDenied.Error(), err.Error())

	// A store failure is unavailable, not a denial.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = s.Require(cctx, callers["alice"], "compute:sites:manage", iam.Resource{Type: "compute-pool", ID: "pool-x"})
	assert.ErrorIs(t, err, iam.ErrUnavailable)
	assert.False(t, errors.Is(err, iam.ErrDenied))
}

// A service with another prefix and root tenant decides on those.
func TestPolicyConfiguredNames(t *testing.T) {
	s, _, _ := newTestService(t)
	s = New(s.st, "ops", "cp-", nil)
	ctx := context.Background()
	c := mustCaller(t, s, KeyRequest{Tenant: "ops", Identity: "op", Role: RoleAdmin})
	require.NoError(t, s.Require(ctx, c, "compute:fleet:admin", iam.Resource{Type: "cp-fleet", ID: "global"}))
	require.NoError(t, s.Require(ctx, c, "compute:sites:manage", iam.Resource{Type: "cp-tenant", ID: "acme"}))
	assert.ErrorIs(t, s.Require(ctx, c, "compute:fleet:admin", iam.Resource{Type: "compute-fleet", ID: "global"}), iam.ErrDenied)
	assert.Equal(t, "ops", s.RootTenant())
}
