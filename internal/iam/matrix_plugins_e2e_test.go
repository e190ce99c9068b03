package iam_test

// Matrix rows of the example plugin (plugins/example; the matrix's env
// runs it): its methods are decided like the service's own, on
// compute:example:read and compute:example:write.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
)

// note is a note of tenant written by its owner, kept until a delete used
// it up.
func (fx *fixture) note(t *testing.T, tenant string) string {
	t.Helper()
	return fx.keep("note", tenant, func() string {
		res, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).ExampleNotesCreate(t.Context(),
			&client.ExampleNotesCreateInput{TenantId: tenant, Title: "fixture"})
		require.NoError(t, err, "fixture: a note in %s", tenant)
		return res.Data.NoteId
	})
}

func init() {
	// Notes exist before the census of refused calls counts rows (a note
	// made on first use is an admitted create, with its audit row).
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["note/"+tenant] = fx.note(t, tenant)
	})
	operators := []string{owner, admin}
	matrix[api.MethodExampleNotesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ExampleNotesCreate(t.Context(), &client.ExampleNotesCreateInput{TenantId: tenant, Title: fx.unique()})
		},
		tenantRoles: []string{owner, admin, member}, // a write decided on the tenant, like a create
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.ExampleNotesCreateResult).Data.TenantId)
		},
	}}
	matrix[api.MethodExampleNotesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.ExampleNotesList(t.Context(), &client.ExampleNotesListInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member, viewer},
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, n := range res.(*client.ExampleNotesListResult).Data.Items {
				assert.Equal(t, tenant, n.TenantId)
			}
		},
	}}
	matrix[api.MethodExampleNotesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			id := fx.note(t, tenant)
			res, err := c.ExampleNotesDelete(t.Context(), &client.ExampleNotesDeleteInput{TenantId: tenant, NoteId: id})
			if err == nil {
				fx.used("note", tenant, id)
			}
			return res, err
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.ExampleNotesDeleteResult).Data.Deleted)
		},
	}}
}
