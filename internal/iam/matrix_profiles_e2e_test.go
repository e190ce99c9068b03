package iam_test

// Matrix rows of the profiles group. Profiles are not projected (their
// ids are per tenant): reads are decided as compute:profiles:read on
// compute-profile in the input's tenant (viewers and above), changes as
// compute:profiles:manage (creates on the tenant: members too; update and
// delete of a profile no one owns: owners and admins).

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/go-faster/jx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
)

func profileDoc(id string, version int) string {
	return fmt.Sprintf(`{"id": %q, "version": %d, "steps": [{"name": "on", "phase": "prepare", "uses": "power.on"}]}`, id, version)
}

// profile stores a private profile version 1 of tenant and returns its id
// (the prepared one when the test prepared its objects ahead of its
// calls).
func (fx *fixture) profile(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["profile/"+tenant]; ok {
		return id
	}
	id := fx.unique()
	_, err := fx.env.Store.Pool().Exec(t.Context(), `insert into profiles (tenant_id, profile_id, profile_version, document)
		values ($1, $2, 1, $3)`, tenant, id, profileDoc(id, 1))
	require.NoError(t, err, "fixture: a profile in %s", tenant)
	return id
}

func createDocument(t *testing.T, raw string) client.ProfilesCreateInputDocument {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(raw), &m))
	out := client.ProfilesCreateInputDocument{}
	for k, v := range m {
		out[k] = jx.Raw(v)
	}
	return out
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["profile/"+tenant] = fx.profile(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodProfilesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProfilesCreate(t.Context(), &client.ProfilesCreateInput{TenantId: tenant, Document: createDocument(t, profileDoc(fx.unique(), 1))})
		},
		tenantRoles: []string{owner, admin, member}, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.ProfilesCreateResult).Data
			assert.Equal(t, tenant, d.TenantId)
			assert.EqualValues(t, 1, d.Version)
		},
	}}
	matrix[api.MethodProfilesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProfilesGet(t.Context(), &client.ProfilesGetInput{TenantId: tenant,
				ProfileId: fx.keep("profile", tenant, func() string { return fx.profile(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.ProfilesGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodProfilesValidate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProfilesValidate(t.Context(), &client.ProfilesValidateInput{TenantId: tenant,
				ProfileId: fx.keep("profile", tenant, func() string { return fx.profile(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.ProfilesValidateResult).Data.Valid)
		},
	}}
	matrix[api.MethodProfilesRender] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProfilesRender(t.Context(), &client.ProfilesRenderInput{TenantId: tenant,
				ProfileId: fx.keep("profile", tenant, func() string { return fx.profile(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.ProfilesRenderResult).Data
			assert.Equal(t, tenant, d.TenantId)
			require.Len(t, d.Steps, 1)
			assert.Equal(t, "power.on", d.Steps[0].Uses)
		},
	}}
	matrix[api.MethodProfilesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.ProfilesList(t.Context(), &client.ProfilesListInput{TenantId: tenant, Limit: client.NewOptInt64(200)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, x := range res.(*client.ProfilesListResult).Data.Items {
				assert.Contains(t, []string{tenant, "builtin"}, x.TenantId, "private profiles of other tenants are not listed")
			}
		},
	}}
	matrix[api.MethodProfilesUpdate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProfilesUpdate(t.Context(), &client.ProfilesUpdateInput{TenantId: tenant, ProfileId: fx.profile(t, tenant), ProfileVersion: 1,
				Visibility: client.NewOptProfilesUpdateInputVisibility(client.ProfilesUpdateInputVisibilityPrivate)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.EqualValues(t, 2, res.(*client.ProfilesUpdateResult).Data.Version)
		},
	}}
	matrix[api.MethodProfilesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProfilesDelete(t.Context(), &client.ProfilesDeleteInput{TenantId: tenant, ProfileId: fx.profile(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.EqualValues(t, 1, res.(*client.ProfilesDeleteResult).Data.Deleted)
		},
	}}
}
