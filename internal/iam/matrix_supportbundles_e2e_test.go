package iam_test

// Matrix rows of the supportBundles group. The matrix env configures no
// support bundle store, so an admitted call answers INVALID_CONFIG: the
// decision is what the matrix checks (internal/supportbundles' end-to-end
// test runs them against a real S3 server).

import (
	"testing"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
)

// aBundleID is a well-formed bundle id no bundle has.
const aBundleID = "sbun_00000000000000000000000000"

func init() {
	operators := []string{owner, admin}
	admitted := func(*testing.T, any, string) {}
	matrix[api.MethodSupportBundlesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return admittedAs(c.SupportBundlesCreate(t.Context(), &client.SupportBundlesCreateInput{TenantId: tenant, NodeId: fx.node(t, tenant),
				IdempotencyKey: fx.unique()}))
		},
		tenantRoles: operators, rootRoles: operators, ok: admitted,
	}}
	matrix[api.MethodSupportBundlesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return admittedAs(c.SupportBundlesList(t.Context(), &client.SupportBundlesListInput{TenantId: tenant}))
		},
		tenantRoles: operators, rootRoles: operators, ok: admitted,
	}}
	matrix[api.MethodSupportBundlesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return admittedAs(c.SupportBundlesGet(t.Context(), &client.SupportBundlesGetInput{TenantId: tenant, BundleId: aBundleID}))
		},
		tenantRoles: operators, rootRoles: operators, ok: admitted,
	}}
	matrix[api.MethodSupportBundlesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return admittedAs(c.SupportBundlesDelete(t.Context(), &client.SupportBundlesDeleteInput{TenantId: tenant, BundleId: aBundleID}))
		},
		tenantRoles: operators, rootRoles: operators, ok: admitted,
	}}
}
