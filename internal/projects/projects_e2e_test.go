package projects_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

func code(t *testing.T, err error) string { t.Helper(); return testenv.APIError(t, err).Code }

// outsider returns a client of an identity of tenant that holds no role in
// it: what it reads, it reads as a project member only.
func outsider(t *testing.T, env *testenv.Env, tenant, identity string) *computeclient.Client {
	t.Helper()
	token := env.Key(t, tenant, identity, "viewer")
	_, err := env.Store.Pool().Exec(t.Context(), `delete from iam.role_bindings where tenant_id = $1 and identity_id = $2`, tenant, identity)
	require.NoError(t, err)
	return env.Client(t, computeclient.WithToken(token))
}

func TestProjectLifecycle(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	ann := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "member")))
	owner := env.Client(t, computeclient.WithToken(env.Key(t, "acme", "olga", "owner")))
	globex := env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner")))

	p, err := ann.ProjectsCreate(t.Context(), &client.ProjectsCreateInput{TenantId: "acme", Name: "web", IdempotencyKey: "k1",
		Description: client.NewOptString("the web shop")})
	require.NoError(t, err)
	assert.Equal(t, "ann", p.Data.Owner, "the creator owns it")
	assert.Regexp(t, `^prj_[0-9a-hjkmnp-tv-z]{26}$`, p.Data.ProjectId)
	id := p.Data.ProjectId
	again, err := ann.ProjectsCreate(t.Context(), &client.ProjectsCreateInput{TenantId: "acme", Name: "web", IdempotencyKey: "k1",
		Description: client.NewOptString("the web shop")})
	require.NoError(t, err)
	assert.Equal(t, id, again.Data.ProjectId, "a retry returns it")
	_, err = ann.ProjectsCreate(t.Context(), &client.ProjectsCreateInput{TenantId: "acme", Name: "other", IdempotencyKey: "k1"})
	assert.Equal(t, "CONFLICT", code(t, err), "the key with another request")
	_, err = owner.ProjectsCreate(t.Context(), &client.ProjectsCreateInput{TenantId: "acme", Name: "web", IdempotencyKey: "k2"})
	assert.Equal(t, "CONFLICT", code(t, err), "the name is taken")

	m, err := ann.ProjectsMembers(t.Context(), &client.ProjectsMembersInput{TenantId: "acme", ProjectId: id})
	require.NoError(t, err)
	assert.Equal(t, []string{"ann"}, m.Data.Members, "the owner is the first member")

	// A member of the project with no role in the tenant reads it; an
	// identity of the tenant with neither is refused.
	bob := outsider(t, env, "acme", "bob")
	eve := outsider(t, env, "acme", "eve")
	_, err = bob.ProjectsGet(t.Context(), &client.ProjectsGetInput{TenantId: "acme", ProjectId: id})
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	added, err := ann.ProjectsAddMember(t.Context(), &client.ProjectsAddMemberInput{TenantId: "acme", ProjectId: id, IdentityId: "bob"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ann", "bob"}, added.Data.Members)
	again2, err := ann.ProjectsAddMember(t.Context(), &client.ProjectsAddMemberInput{TenantId: "acme", ProjectId: id, IdentityId: "bob"})
	require.NoError(t, err)
	assert.Equal(t, added.Data, again2.Data, "adding a member again changes nothing")
	got, err := bob.ProjectsGet(t.Context(), &client.ProjectsGetInput{TenantId: "acme", ProjectId: id})
	require.NoError(t, err)
	assert.Equal(t, "web", got.Data.Name)
	_, err = eve.ProjectsGet(t.Context(), &client.ProjectsGetInput{TenantId: "acme", ProjectId: id})
	assert.Equal(t, "ACCESS_DENIED", code(t, err), "no role, no membership")
	_, err = bob.ProjectsUpdate(t.Context(), &client.ProjectsUpdateInput{TenantId: "acme", ProjectId: id, Name: client.NewOptString("mine")})
	assert.Equal(t, "ACCESS_DENIED", code(t, err), "members manage what is in the project, not the project")
	_, err = globex.ProjectsGet(t.Context(), &client.ProjectsGetInput{TenantId: "globex", ProjectId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's project")

	up, err := ann.ProjectsUpdate(t.Context(), &client.ProjectsUpdateInput{TenantId: "acme", ProjectId: id, Name: client.NewOptString("shop"), Version: client.NewOptInt64(1)})
	require.NoError(t, err)
	assert.Equal(t, int64(2), up.Data.Version)
	_, err = ann.ProjectsUpdate(t.Context(), &client.ProjectsUpdateInput{TenantId: "acme", ProjectId: id, Name: client.NewOptString("x"), Version: client.NewOptInt64(1)})
	assert.Equal(t, "CONFLICT", code(t, err), "stale version")
	_, err = ann.ProjectsUpdate(t.Context(), &client.ProjectsUpdateInput{TenantId: "acme", ProjectId: id})
	assert.Equal(t, "INVALID_INPUT", code(t, err), "no change named")

	_, err = ann.ProjectsRemoveMember(t.Context(), &client.ProjectsRemoveMemberInput{TenantId: "acme", ProjectId: id, IdentityId: "ann"})
	assert.Equal(t, "INVALID_STATE", code(t, err), "the owner stays")
	removed, err := owner.ProjectsRemoveMember(t.Context(), &client.ProjectsRemoveMemberInput{TenantId: "acme", ProjectId: id, IdentityId: "bob"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ann"}, removed.Data.Members)

	list, err := owner.ProjectsList(t.Context(), &client.ProjectsListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 1)

	del, err := owner.ProjectsDelete(t.Context(), &client.ProjectsDeleteInput{TenantId: "acme", ProjectId: id})
	require.NoError(t, err)
	assert.True(t, del.Data.Deleted)
	_, err = owner.ProjectsGet(t.Context(), &client.ProjectsGetInput{TenantId: "acme", ProjectId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	var rels int
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(), `select count(*) from iam.relationships where resource_id = $1`, id).Scan(&rels))
	assert.Zero(t, rels, "memberships go with the project")

	require.Eventually(t, func() bool {
		res, err := owner.EventsList(t.Context(), &client.EventsListInput{TenantId: "acme", Types: []string{"project.*"}})
		return err == nil && len(res.Data.Items) == 3
	}, 10*time.Second, 50*time.Millisecond, "created, updated, deleted")
}
