package iam_test

// Matrix rows of the providerAccounts group. The matrix env has no PKI
// bundle and no bootstrap options: an admitted bootstrap answers
// INVALID_CONFIG.

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
	"computeplane/internal/provideraccounts"
)

const matrixProviderConfig = `{"image": "computeplane/minimal", "machineTypes": [{"name": "small", "vcpu": 1, "memoryMiB": 256}]}`

// providerAccount writes a localqemu account of tenant with its projection
// entry (owned by no one).
func (fx *fixture) providerAccount(t *testing.T, tenant string) string {
	t.Helper()
	id := ids.New("pacct")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into provider_accounts (account_id, tenant_id, provider, name, config, created_by)
			values ($1, $2, 'localqemu', $3, $4, 'fixture')`, id, tenant, fx.unique(), matrixProviderConfig); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + provideraccounts.ResourceType, ID: id, TenantID: tenant,
			Attributes: map[string]string{"provider": "localqemu"},
		})
	}), "fixture: a provider account in %s", tenant)
	return id
}

// spareAccount is a fresh account for a call that changes or deletes one,
// or, once the refused calls are counted, the one prepared for them.
func (fx *fixture) spareAccount(t *testing.T, tenant string) string {
	if id, ok := fx.prepared["provider-account-spare/"+tenant]; ok {
		return id
	}
	return fx.providerAccount(t, tenant)
}

func (fx *fixture) keptAccount(t *testing.T, tenant string) string {
	if id, ok := fx.prepared["provider-account/"+tenant]; ok {
		return id
	}
	return fx.keep("provider-account", tenant, func() string { return fx.providerAccount(t, tenant) })
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["provider-account/"+tenant] = fx.providerAccount(t, tenant)
		objs["provider-account-spare/"+tenant] = fx.providerAccount(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodProviderAccountsCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProviderAccountsCreate(t.Context(), &client.ProviderAccountsCreateInput{TenantId: tenant, Provider: "localqemu",
				Name: fx.unique(), Config: []byte(matrixProviderConfig), IdempotencyKey: client.NewOptString(fx.unique())})
		},
		tenantRoles: []string{owner, admin, member}, // manage on the tenant: members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.ProviderAccountsCreateResult).Data
			assert.Equal(t, tenant, d.TenantId)
			assert.EqualValues(t, 1, d.Version)
		},
	}}
	matrix[api.MethodProviderAccountsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProviderAccountsGet(t.Context(), &client.ProviderAccountsGetInput{TenantId: tenant, AccountId: fx.keptAccount(t, tenant)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.ProviderAccountsGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodProviderAccountsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.ProviderAccountsList(t.Context(), &client.ProviderAccountsListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, x := range res.(*client.ProviderAccountsListResult).Data.Items {
				assert.Equal(t, tenant, x.TenantId)
			}
		},
	}}
	matrix[api.MethodProviderAccountsOffers] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProviderAccountsOffers(t.Context(), &client.ProviderAccountsOffersInput{TenantId: tenant, AccountId: fx.keptAccount(t, tenant)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Len(t, res.(*client.ProviderAccountsOffersResult).Data.Items, 1)
		},
	}}
	matrix[api.MethodProviderAccountsUpdate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProviderAccountsUpdate(t.Context(), &client.ProviderAccountsUpdateInput{TenantId: tenant, AccountId: fx.spareAccount(t, tenant),
				Config: []byte(matrixProviderConfig)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.EqualValues(t, 2, res.(*client.ProviderAccountsUpdateResult).Data.Version)
		},
	}}
	matrix[api.MethodProviderAccountsDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProviderAccountsDelete(t.Context(), &client.ProviderAccountsDeleteInput{TenantId: tenant, AccountId: fx.spareAccount(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.ProviderAccountsDeleteResult).Data.Deleted)
		},
	}}
	matrix[api.MethodProviderAccountsBootstrap] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return admittedAs(c.ProviderAccountsBootstrap(t.Context(), &client.ProviderAccountsBootstrapInput{TenantId: tenant,
				AccountId: fx.keptAccount(t, tenant), PoolId: fx.pool(t, tenant), IdempotencyKey: fx.unique(), OfferId: client.NewOptString("small")}))
		},
		tenantRoles: operators, rootRoles: operators, ok: func(*testing.T, any, string) {}, // the matrix env has no PKI bundle nor bootstrap options
	}}
}
