package iam_test

// Matrix rows of the fleet groups (pools ...), kept beside the others'
// (e2e_test.go) so the groups grow without one file growing without end.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/nodes"
)

// preparers make, for fixture.prepare, the objects of the fleet groups
// that refused calls name, into objs by kind/tenant.
var preparers = []func(t *testing.T, fx *fixture, tenant string, objs map[string]string){
	func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		objs["pool/"+tenant], objs["flavor/"+tenant] = fx.pooledFlavor(t, tenant)
		objs["node/"+tenant] = fx.node(t, tenant)
		objs["project/"+tenant] = fx.project(t, tenant)
	},
}

// project returns a new project of tenant made by an owner of the tenant
// (the prepared one, once there is one).
func (fx *fixture) project(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["project/"+tenant]; ok {
		return id
	}
	res, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).ProjectsCreate(t.Context(), &client.ProjectsCreateInput{
		TenantId: tenant, Name: fx.unique(), IdempotencyKey: fx.unique(),
	})
	require.NoError(t, err, "fixture: a project in %s", tenant)
	return res.Data.ProjectId
}

// node returns a new node registered in a pool of tenant (the prepared
// one, once there is one).
func (fx *fixture) node(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["node/"+tenant]; ok {
		return id
	}
	n, err := nodes.Register(t.Context(), fx.env.Store, fx.env.Host.Identity().Projection(), fx.env.Config.TypePrefix,
		nodes.Registration{PoolID: fx.pool(t, tenant), Hostname: fx.unique(), VCPU: 4, MemoryMiB: 4096})
	require.NoError(t, err, "fixture: a node in %s", tenant)
	return n.NodeID
}

// pool returns a new vps-host pool of tenant in one of its sites, made by
// an owner of the tenant (the prepared one, once there is one).
func (fx *fixture) pool(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["pool/"+tenant]; ok {
		return id
	}
	res, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).PoolsCreate(t.Context(), &client.PoolsCreateInput{
		TenantId: tenant, SiteId: fx.site(t, tenant), Name: fx.unique(), Class: client.PoolsCreateInputClassVpsHost,
		IdempotencyKey: fx.unique(),
	})
	require.NoError(t, err, "fixture: a pool in %s", tenant)
	return res.Data.PoolId
}

func init() {
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodPoolsCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.PoolsCreate(t.Context(), &client.PoolsCreateInput{
				TenantId: tenant, SiteId: fx.site(t, tenant), Name: fx.unique(), Class: client.PoolsCreateInputClassMetalHost,
				IdempotencyKey: fx.unique(),
			})
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			p := res.(*client.PoolsCreateResult).Data
			assert.Equal(t, tenant, p.TenantId)
			assert.Equal(t, "metal-host", string(p.Class))
		},
	}}
	matrix[api.MethodPoolsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.PoolsGet(t.Context(), &client.PoolsGetInput{TenantId: tenant, PoolId: fx.keep("pool", tenant, func() string { return fx.pool(t, tenant) })})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.PoolsGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodPoolsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.PoolsList(t.Context(), &client.PoolsListInput{TenantId: tenant})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, p := range res.(*client.PoolsListResult).Data.Items {
				assert.Equal(t, tenant, p.TenantId)
			}
		},
	}}
	matrix[api.MethodPoolsUpdate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.PoolsUpdate(t.Context(), &client.PoolsUpdateInput{TenantId: tenant, PoolId: fx.pool(t, tenant), Name: client.NewOptString(fx.unique())})
		},
		tenantRoles: operators, // the pool's creator is another identity (its tenant's owner key)
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, int64(2), res.(*client.PoolsUpdateResult).Data.Version)
		},
	}}
	matrix[api.MethodPoolsArchive] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.PoolsArchive(t.Context(), &client.PoolsArchiveInput{TenantId: tenant, PoolId: fx.pool(t, tenant)})
		},
		tenantRoles: operators,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.PoolsArchiveResult).Data.Archived)
		},
	}}
	matrix[api.MethodPoolsOffer] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.PoolsOffer(t.Context(), &client.PoolsOfferInput{
				TenantId: tenant, PoolId: fx.pool(t, tenant), ToTenantId: "partner", Limits: client.Limits{Vcpu: client.NewOptInt64(4)},
			})
		},
		tenantRoles: operators,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.PoolsOfferResult).Data.Offered)
		},
	}}
	matrix[api.MethodPoolsUnoffer] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.PoolsUnoffer(t.Context(), &client.PoolsUnofferInput{TenantId: tenant, PoolId: fx.pool(t, tenant), ToTenantId: "partner"})
		},
		tenantRoles: operators,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.False(t, res.(*client.PoolsUnofferResult).Data.Offered)
		},
	}}
	matrix[api.MethodFlavorsCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: tenant, PoolId: fx.pool(t, tenant), Name: fx.unique(), Vcpu: 1, MemoryMiB: 512})
		},
		tenantRoles: operators, // decided on the pool, which an owner's key made
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, int64(512), res.(*client.FlavorsCreateResult).Data.MemoryMiB)
		},
	}}
	matrix[api.MethodFlavorsArchive] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			pool, flavor := fx.pooledFlavor(t, tenant)
			return c.FlavorsArchive(t.Context(), &client.FlavorsArchiveInput{TenantId: tenant, PoolId: pool, Name: flavor})
		},
		tenantRoles: operators,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.FlavorsArchiveResult).Data.Archived)
		},
	}}
	matrix[api.MethodFlavorsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			pool, flavor := fx.pooledFlavor(t, tenant)
			return c.FlavorsGet(t.Context(), &client.FlavorsGetInput{TenantId: tenant, PoolId: pool, Name: flavor})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, int64(1), res.(*client.FlavorsGetResult).Data.Vcpu)
		},
	}}
	matrix[api.MethodFlavorsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.FlavorsList(t.Context(), &client.FlavorsListInput{TenantId: tenant, PoolId: fx.pool(t, tenant)})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.NotNil(t, res.(*client.FlavorsListResult).Data.Items)
		},
	}}
	matrix[api.MethodQuotasList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.QuotasList(t.Context(), &client.QuotasListInput{TenantId: tenant, PoolId: client.NewOptString(fx.pool(t, tenant))})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, q := range res.(*client.QuotasListResult).Data.Items {
				assert.Equal(t, tenant, q.TenantId)
			}
		},
	}}
	matrix[api.MethodQuotasGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.QuotasGet(t.Context(), &client.QuotasGetInput{TenantId: tenant, PoolId: fx.pool(t, tenant), Resource: client.QuotasGetInputResourceVcpu})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.QuotasGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodQuotasSet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.QuotasSet(t.Context(), &client.QuotasSetInput{TenantId: tenant, PoolId: fx.pool(t, tenant), Resource: client.QuotasSetInputResourceVcpu, Max: 64})
		},
		tenantRoles: operators,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, int64(64), res.(*client.QuotasSetResult).Data.Max)
		},
	}}
	nodeState := func(want string) func(t *testing.T, res any, _ string) {
		return func(t *testing.T, res any, _ string) {
			var n client.Node
			switch r := res.(type) {
			case *client.NodesCordonResult:
				n = r.Data
			case *client.NodesUncordonResult:
				n = r.Data
			case *client.NodesDrainResult:
				n = r.Data
			case *client.NodesRetireResult:
				n = r.Data
			case *client.NodesLabelResult:
				n = r.Data
			case *client.NodesGetResult:
				n = r.Data
			}
			assert.Equal(t, want, string(n.State))
		}
	}
	matrix[api.MethodNodesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.NodesList(t.Context(), &client.NodesListInput{TenantId: tenant})
		},
		tenantRoles: readers,
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, n := range res.(*client.NodesListResult).Data.Items {
				assert.Equal(t, tenant, n.TenantId)
			}
		},
	}}
	matrix[api.MethodNodesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.NodesGet(t.Context(), &client.NodesGetInput{TenantId: tenant, NodeId: fx.node(t, tenant)})
		},
		tenantRoles: readers, rootRoles: operators, ok: nodeState("ready"),
	}}
	matrix[api.MethodNodesCordon] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.NodesCordon(t.Context(), &client.NodesCordonInput{TenantId: tenant, NodeId: fx.node(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators, ok: nodeState("cordoned"),
	}}
	matrix[api.MethodNodesUncordon] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.NodesUncordon(t.Context(), &client.NodesUncordonInput{TenantId: tenant, NodeId: fx.node(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators, ok: nodeState("ready"),
	}}
	matrix[api.MethodNodesDrain] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.NodesDrain(t.Context(), &client.NodesDrainInput{TenantId: tenant, NodeId: fx.node(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators, ok: nodeState("draining"),
	}}
	matrix[api.MethodNodesRetire] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.NodesRetire(t.Context(), &client.NodesRetireInput{TenantId: tenant, NodeId: fx.node(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators, ok: nodeState("retired"),
	}}
	matrix[api.MethodNodesLabel] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.NodesLabel(t.Context(), &client.NodesLabelInput{TenantId: tenant, NodeId: fx.node(t, tenant),
				Set: client.NewOptNodesLabelInputSet(client.NodesLabelInputSet{"zone": "a"})})
		},
		tenantRoles: operators, rootRoles: operators, ok: nodeState("ready"),
	}}
	// Without an image source the matrix env answers INVALID_CONFIG to an
	// admitted call: the decision is what the matrix checks.
	invalidConfig := func(t *testing.T, res any, _ string) {}
	matrix[api.MethodImagesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return admittedAs(c.ImagesList(t.Context(), &client.ImagesListInput{TenantId: tenant}))
		},
		tenantRoles: readers, rootRoles: operators, ok: invalidConfig,
	}}
	matrix[api.MethodImagesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return admittedAs(c.ImagesGet(t.Context(), &client.ImagesGetInput{TenantId: tenant, ImageId: "debian-12"}))
		},
		tenantRoles: readers, rootRoles: operators, ok: invalidConfig,
	}}
	matrix[api.MethodProjectsCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsCreate(t.Context(), &client.ProjectsCreateInput{TenantId: tenant, Name: fx.unique(), IdempotencyKey: fx.unique()})
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.ProjectsCreateResult).Data.TenantId)
		},
	}}
	matrix[api.MethodProjectsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsGet(t.Context(), &client.ProjectsGetInput{TenantId: tenant, ProjectId: fx.project(t, tenant)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.ProjectsGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodProjectsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.ProjectsList(t.Context(), &client.ProjectsListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, p := range res.(*client.ProjectsListResult).Data.Items {
				assert.Equal(t, tenant, p.TenantId)
			}
		},
	}}
	matrix[api.MethodProjectsUpdate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsUpdate(t.Context(), &client.ProjectsUpdateInput{TenantId: tenant, ProjectId: fx.project(t, tenant),
				Description: client.NewOptString(fx.unique())})
		},
		tenantRoles: operators, rootRoles: operators, // the project's creator is its tenant's owner key
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, int64(2), res.(*client.ProjectsUpdateResult).Data.Version)
		},
	}}
	matrix[api.MethodProjectsDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsDelete(t.Context(), &client.ProjectsDeleteInput{TenantId: tenant, ProjectId: fx.project(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.ProjectsDeleteResult).Data.Deleted)
		},
	}}
	matrix[api.MethodProjectsAddMember] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsAddMember(t.Context(), &client.ProjectsAddMemberInput{TenantId: tenant, ProjectId: fx.project(t, tenant), IdentityId: "someone"})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Contains(t, res.(*client.ProjectsAddMemberResult).Data.Members, "someone")
		},
	}}
	matrix[api.MethodProjectsRemoveMember] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsRemoveMember(t.Context(), &client.ProjectsRemoveMemberInput{TenantId: tenant, ProjectId: fx.project(t, tenant), IdentityId: "someone"})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.NotContains(t, res.(*client.ProjectsRemoveMemberResult).Data.Members, "someone")
		},
	}}
	matrix[api.MethodProjectsMembers] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.ProjectsMembers(t.Context(), &client.ProjectsMembersInput{TenantId: tenant, ProjectId: fx.project(t, tenant)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.NotEmpty(t, res.(*client.ProjectsMembersResult).Data.Members)
		},
	}}
	matrix[api.MethodUsageList] = []matrixCase{{
		name: "tenant",
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.UsageList(t.Context(), &client.UsageListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.NotNil(t, res.(*client.UsageListResult).Data.Items)
		},
	}, {
		name: "project",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.UsageList(t.Context(), &client.UsageListInput{TenantId: tenant, ProjectId: client.NewOptString(fx.project(t, tenant))})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.NotNil(t, res.(*client.UsageListResult).Data.Items)
		},
	}}
	matrix[api.MethodUsageExport] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.UsageExport(t.Context(), &client.UsageExportInput{TenantId: tenant, From: 0, To: 24 * 3600 * 1000})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Zero(t, res.(*client.UsageExportResult).Data.Windows)
		},
	}}
	matrix[api.MethodPoolsJoinToken] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return admittedAs(c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: tenant, PoolId: fx.pool(t, tenant)}))
		},
		tenantRoles: operators, rootRoles: operators, ok: invalidConfig, // the matrix env has no PKI bundle
	}}
}

// pooledFlavor returns a pool of tenant and a flavor in it: the prepared
// ones, once there are some.
func (fx *fixture) pooledFlavor(t *testing.T, tenant string) (pool, flavor string) {
	t.Helper()
	if name, ok := fx.prepared["flavor/"+tenant]; ok {
		return fx.prepared["pool/"+tenant], name
	}
	pool, flavor = fx.pool(t, tenant), fx.unique()
	_, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).FlavorsCreate(t.Context(), &client.FlavorsCreateInput{
		TenantId: tenant, PoolId: pool, Name: flavor, Vcpu: 1, MemoryMiB: 256,
	})
	require.NoError(t, err, "fixture: a flavor in %s", tenant)
	return pool, flavor
}

// admittedAs turns the INVALID_CONFIG of a deployment without an image
// source into success: the call was admitted (a refusal is ACCESS_DENIED
// or UNAUTHENTICATED) and reached the method.
func admittedAs[T any](res T, err error) (any, error) {
	if e, ok := computeclient.AsError(err); ok && e.Code == "INVALID_CONFIG" {
		return nil, nil
	}
	return res, err
}
