package iam_test

// Matrix rows of the sandboxTemplates group. The matrix env has no image
// source: an admitted sandboxTemplates.create answers INVALID_CONFIG.

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/sandboxtemplates"
)

// template writes a live template of tenant with its projection entry
// (owned by no one).
func (fx *fixture) template(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["template/"+tenant]; ok {
		return id
	}
	pool, flavor := fx.pooledFlavor(t, tenant)
	id := ids.New("sbxt")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into sandbox_templates (template_id, tenant_id, name, pool_id, flavor, image_id, runtime,
			default_ttl_seconds, max_ttl_seconds, warm_min, warm_max, network, owner)
			values ($1, $2, $3, $4, $5, 'img', 'qemu', 3600, 86400, 0, 0, 'egress', 'fixture')`, id, tenant, fx.unique(), pool, flavor); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + sandboxtemplates.ResourceType, ID: id, TenantID: tenant,
			Parent: &iam.Ref{Type: fx.env.Config.TypePrefix + "pool", ID: pool}, Attributes: map[string]string{"poolId": pool},
		})
	}), "fixture: a template in %s", tenant)
	return id
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["template/"+tenant] = fx.template(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodSandboxTemplatesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			pool, flavor := fx.pooledFlavor(t, tenant)
			return admittedAs(c.SandboxTemplatesCreate(t.Context(), &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: fx.unique(),
				PoolId: pool, Flavor: flavor, ImageId: "computeplane/minimal"}))
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok:          func(*testing.T, any, string) {}, // the matrix env has no image source
	}}
	matrix[api.MethodSandboxTemplatesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxTemplatesGet(t.Context(), &client.SandboxTemplatesGetInput{TenantId: tenant,
				TemplateId: fx.keep("template", tenant, func() string { return fx.template(t, tenant) })})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.SandboxTemplatesGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodSandboxTemplatesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.SandboxTemplatesList(t.Context(), &client.SandboxTemplatesListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, x := range res.(*client.SandboxTemplatesListResult).Data.Items {
				assert.Equal(t, tenant, x.TenantId)
			}
		},
	}}
	matrix[api.MethodSandboxTemplatesUpdate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxTemplatesUpdate(t.Context(), &client.SandboxTemplatesUpdateInput{TenantId: tenant, TemplateId: fx.template(t, tenant),
				DefaultTtlSeconds: client.NewOptInt64(600)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			d := res.(*client.SandboxTemplatesUpdateResult).Data
			assert.EqualValues(t, 600, d.DefaultTtlSeconds)
			assert.EqualValues(t, 2, d.Version)
		},
	}}
	matrix[api.MethodSandboxTemplatesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxTemplatesDelete(t.Context(), &client.SandboxTemplatesDeleteInput{TenantId: tenant, TemplateId: fx.template(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.SandboxTemplatesDeleteResult).Data.Deleted)
		},
	}}
}
