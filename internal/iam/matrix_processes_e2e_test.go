package iam_test

// Matrix rows of the sandboxes' background processes and of preview URLs.
// Process calls are guest commands: like exec, they are sent to a paused
// sandbox, so an admitted call answers INVALID_STATE (the matrix env has no
// daemons).

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
)

func init() {
	operators := []string{owner, admin}
	paused := func(t *testing.T, fx *fixture, tenant string) string {
		return fx.sandbox(t, tenant, "paused", "paused")
	}
	guestCommand := func(call func(t *testing.T, c *computeclient.Client, sandbox, tenant string) (any, error)) []matrixCase {
		return []matrixCase{{
			call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
				return call(t, c, paused(t, fx, tenant), tenant)
			},
			tenantRoles: operators, rootRoles: operators,
			ok: func(*testing.T, any, string) {},
		}}
	}
	matrix[api.MethodSandboxesStartProcess] = guestCommand(func(t *testing.T, c *computeclient.Client, sbx, tenant string) (any, error) {
		return refusedAs[*client.SandboxesStartProcessResult]("INVALID_STATE")(c.SandboxesStartProcess(t.Context(),
			&client.SandboxesStartProcessInput{TenantId: tenant, SandboxId: sbx, Argv: []string{"true"}}))
	})
	matrix[api.MethodSandboxesListProcesses] = guestCommand(func(t *testing.T, c *computeclient.Client, sbx, tenant string) (any, error) {
		return refusedAs[*client.SandboxesListProcessesResult]("INVALID_STATE")(c.SandboxesListProcesses(t.Context(),
			&client.SandboxesListProcessesInput{TenantId: tenant, SandboxId: sbx}))
	})
	matrix[api.MethodSandboxesWaitProcess] = guestCommand(func(t *testing.T, c *computeclient.Client, sbx, tenant string) (any, error) {
		return refusedAs[*client.SandboxesWaitProcessResult]("INVALID_STATE")(c.SandboxesWaitProcess(t.Context(),
			&client.SandboxesWaitProcessInput{TenantId: tenant, SandboxId: sbx, Pid: 1}))
	})
	matrix[api.MethodSandboxesSignalProcess] = guestCommand(func(t *testing.T, c *computeclient.Client, sbx, tenant string) (any, error) {
		return refusedAs[*client.SandboxesSignalProcessResult]("INVALID_STATE")(c.SandboxesSignalProcess(t.Context(),
			&client.SandboxesSignalProcessInput{TenantId: tenant, SandboxId: sbx, Pid: 1, Signal: client.SandboxesSignalProcessInputSignalHUP}))
	})
	matrix[api.MethodSandboxesWriteProcessStdin] = guestCommand(func(t *testing.T, c *computeclient.Client, sbx, tenant string) (any, error) {
		return refusedAs[*client.SandboxesWriteProcessStdinResult]("INVALID_STATE")(c.SandboxesWriteProcessStdin(t.Context(),
			&client.SandboxesWriteProcessStdinInput{TenantId: tenant, SandboxId: sbx, Pid: 1, Data: client.NewOptString("x")}))
	})
	matrix[api.MethodSandboxesReadProcessOutput] = guestCommand(func(t *testing.T, c *computeclient.Client, sbx, tenant string) (any, error) {
		return refusedAs[*client.SandboxesReadProcessOutputResult]("INVALID_STATE")(c.SandboxesReadProcessOutput(t.Context(),
			&client.SandboxesReadProcessOutputInput{TenantId: tenant, SandboxId: sbx, Pid: 1}))
	})

	matrix[api.MethodTunnelsPreview] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.TunnelsPreview(t.Context(), &client.TunnelsPreviewInput{TenantId: tenant, Port: 8080,
				Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: fx.sandbox(t, tenant, "running", "tunnel")}})
		},
		tenantRoles: []string{owner, admin, member}, // decided on the tenant, like a tunnel's open
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.TunnelsPreviewResult).Data
			assert.Equal(t, tenant, d.TenantId)
			assert.Equal(t, int64(8080), d.Port)
			assert.False(t, d.Public, "private by default")
		},
	}}
	matrix[api.MethodTunnelsListPreviews] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.TunnelsListPreviews(t.Context(), &client.TunnelsListPreviewsInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member, viewer},
		rootRoles:   operators,
		ok: func(t *testing.T, res any, tenant string) {
			for _, it := range res.(*client.TunnelsListPreviewsResult).Data.Items {
				assert.Equal(t, tenant, it.TenantId)
			}
		},
	}}
}
