package iam_test

// Matrix rows of the sandboxes and sandboxSnapshots groups. The fixture
// writes sandboxes directly (a template, a VM row on a node of the
// tenant's pool, the sandbox and its projection entry, owned by no one);
// the matrix env has no image source and no daemons, so an admitted
// sandboxes.create answers INVALID_CONFIG and guest commands are sent to
// a paused sandbox (INVALID_STATE once admitted).

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
	"computeplane/internal/sandboxes"
)

// sandbox writes a sandbox of tenant whose VM is in state (running or
// paused, its identity taken); the one prepared for slot (before the
// refused calls are counted) is reused.
func (fx *fixture) sandbox(t *testing.T, tenant, state, slot string) string {
	t.Helper()
	if id, ok := fx.prepared["sandbox/"+slot+"/"+tenant]; ok {
		return id
	}
	tmpl := fx.template(t, tenant)
	node := fx.node(t, tenant)
	id, vm := ids.New("sbx"), ids.New("inst")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		var pool string
		if err := tx.QueryRow(ctx, `select pool_id from nodes where node_id = $1`, node).Scan(&pool); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `insert into instances (instance_id, tenant_id, pool_id, node_id, flavor, image_id, boot, name,
			vcpu, memory_mib, disk_gib, desired_state, state, created_by, idem_request, kind, template_id, hostname, identity_generation, reported_identity)
			values ($1, $2, $3, $4, 'small', 'img', '{}', 'fixture', 1, 512, 0, $5, $5, 'fixture', '{}', 'sandbox', $6, 'fixture', 1, 1)`,
			vm, tenant, pool, node, state, tmpl); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `insert into sandboxes (sandbox_id, tenant_id, template_id, instance_id, pool_id, node_id, how,
			max_ttl_seconds, expires_at, created_by, idem_request, created_at)
			values ($1, $2, $3, $4, $5, $6, 'cold', 86400, now() + interval '1 hour', 'fixture', '{}', now())`, id, tenant, tmpl, vm, pool, node); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + sandboxes.ResourceType, ID: id, TenantID: tenant,
			Parent: &iam.Ref{Type: fx.env.Config.TypePrefix + "pool", ID: pool},
		})
	}), "fixture: a sandbox in %s", tenant)
	return id
}

// snapshot writes a ready snapshot of a sandbox of tenant.
func (fx *fixture) snapshot(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["snapshot/"+tenant]; ok {
		return id
	}
	sbx := fx.sandbox(t, tenant, "running", "run")
	id := ids.New("snap")
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into sandbox_snapshots (snapshot_id, tenant_id, sandbox_id, node_id, keep, state, command_id, created_by, idem_request)
			select $1, $2, $3, node_id, true, 'ready', 'cmd_fixture', 'fixture', '{}' from sandboxes where sandbox_id = $3`, id, tenant, sbx); err != nil {
			return err
		}
		return fx.env.Host.Identity().Projection().Put(ctx, tx, iam.Resource{
			Type: fx.env.Config.TypePrefix + sandboxes.SnapshotResourceType, ID: id, TenantID: tenant,
			Parent: &iam.Ref{Type: fx.env.Config.TypePrefix + sandboxes.ResourceType, ID: sbx},
		})
	}), "fixture: a snapshot in %s", tenant)
	return id
}

// refusedAs counts a refusal with code after admission as admitted.
func refusedAs[T any](code string) func(T, error) (any, error) {
	return func(res T, err error) (any, error) {
		if e, ok := computeclient.AsError(err); ok && e.Code == code {
			return nil, nil
		}
		return res, err
	}
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, objs map[string]string) {
		for slot, state := range map[string]string{"run": "running", "pause": "running", "resume": "paused", "delete": "running", "paused": "paused"} {
			objs["sandbox/"+slot+"/"+tenant] = fx.sandbox(t, tenant, state, slot)
		}
		objs["snapshot/"+tenant] = fx.snapshot(t, tenant)
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	running := func(t *testing.T, fx *fixture, tenant string) string {
		return fx.sandbox(t, tenant, "running", "run")
	}
	matrix[api.MethodSandboxesCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return admittedAs(c.SandboxesCreate(t.Context(), &client.SandboxesCreateInput{TenantId: tenant,
				TemplateId: client.NewOptString(fx.template(t, tenant)), IdempotencyKey: fx.unique()}))
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   operators,
		ok:          func(*testing.T, any, string) {}, // the matrix env has no image source
	}}
	matrix[api.MethodSandboxesGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxesGet(t.Context(), &client.SandboxesGetInput{TenantId: tenant, SandboxId: running(t, fx, tenant)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.SandboxesGetResult).Data
			assert.Equal(t, tenant, d.TenantId)
			assert.Equal(t, "running", string(d.State))
		},
	}}
	matrix[api.MethodSandboxesList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.SandboxesList(t.Context(), &client.SandboxesListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, x := range res.(*client.SandboxesListResult).Data.Items {
				assert.Equal(t, tenant, x.TenantId)
			}
		},
	}}
	matrix[api.MethodSandboxesPause] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxesPause(t.Context(), &client.SandboxesPauseInput{TenantId: tenant, SandboxId: fx.sandbox(t, tenant, "running", "pause")})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(*testing.T, any, string) {},
	}}
	matrix[api.MethodSandboxesResume] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxesResume(t.Context(), &client.SandboxesResumeInput{TenantId: tenant, SandboxId: fx.sandbox(t, tenant, "paused", "resume")})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(*testing.T, any, string) {},
	}}
	matrix[api.MethodSandboxesExtend] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxesExtend(t.Context(), &client.SandboxesExtendInput{TenantId: tenant, SandboxId: running(t, fx, tenant), TtlSeconds: 600})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(*testing.T, any, string) {},
	}}
	matrix[api.MethodSandboxesSetEgressPolicy] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			id := running(t, fx, tenant)
			var vm string
			require.NoError(t, fx.env.Store.Pool().QueryRow(t.Context(), `select instance_id from sandboxes where sandbox_id = $1`, id).Scan(&vm))
			fx.egress(t, vm)
			return c.SandboxesSetEgressPolicy(t.Context(), &client.SandboxesSetEgressPolicyInput{TenantId: tenant, SandboxId: id,
				Egress: client.EgressPolicy{Deny: []string{"198.51.100.7"}}})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, []string{"198.51.100.7/32"}, res.(*client.SandboxesSetEgressPolicyResult).Data.Egress.Deny)
		},
	}}
	matrix[api.MethodSandboxesDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: fx.sandbox(t, tenant, "running", "delete")})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "deleted", string(res.(*client.SandboxesDeleteResult).Data.State))
		},
	}}
	paused := func(t *testing.T, fx *fixture, tenant string) string {
		return fx.sandbox(t, tenant, "paused", "paused")
	}
	matrix[api.MethodSandboxesExec] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return refusedAs[*client.SandboxesExecResult]("INVALID_STATE")(c.SandboxesExec(t.Context(), &client.SandboxesExecInput{TenantId: tenant,
				SandboxId: paused(t, fx, tenant), Argv: []string{"true"}}))
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(*testing.T, any, string) {},
	}}
	matrix[api.MethodSandboxesReadFile] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return refusedAs[*client.SandboxesReadFileResult]("INVALID_STATE")(c.SandboxesReadFile(t.Context(), &client.SandboxesReadFileInput{TenantId: tenant,
				SandboxId: paused(t, fx, tenant), Path: "/etc/hostname"}))
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(*testing.T, any, string) {},
	}}
	matrix[api.MethodSandboxesWriteFile] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return refusedAs[*client.SandboxesWriteFileResult]("INVALID_STATE")(c.SandboxesWriteFile(t.Context(), &client.SandboxesWriteFileInput{TenantId: tenant,
				SandboxId: paused(t, fx, tenant), Path: "/tmp/x", ContentBase64: []byte("hi")}))
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(*testing.T, any, string) {},
	}}
	matrix[api.MethodSandboxSnapshotsCreate] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxSnapshotsCreate(t.Context(), &client.SandboxSnapshotsCreateInput{TenantId: tenant, SandboxId: running(t, fx, tenant),
				IdempotencyKey: fx.unique()})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "creating", string(res.(*client.SandboxSnapshotsCreateResult).Data.State))
		},
	}}
	matrix[api.MethodSandboxSnapshotsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxSnapshotsGet(t.Context(), &client.SandboxSnapshotsGetInput{TenantId: tenant,
				SnapshotId: fx.snapshot(t, tenant)})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.SandboxSnapshotsGetResult).Data.TenantId)
		},
	}}
	matrix[api.MethodSandboxSnapshotsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.SandboxSnapshotsList(t.Context(), &client.SandboxSnapshotsListInput{TenantId: tenant})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, x := range res.(*client.SandboxSnapshotsListResult).Data.Items {
				assert.Equal(t, tenant, x.TenantId)
			}
		},
	}}
	matrix[api.MethodSandboxSnapshotsDelete] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SandboxSnapshotsDelete(t.Context(), &client.SandboxSnapshotsDeleteInput{TenantId: tenant, SnapshotId: fx.snapshot(t, tenant)})
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "deleted", string(res.(*client.SandboxSnapshotsDeleteResult).Data.State))
		},
	}}
}
