package iam_test

// Matrix rows of the workflows group: reads need compute:workflows:read
// and the rest compute:workflows:manage, both decided on the node. The
// matrix env runs no workers, so a workflow stays where the fixture put
// it.

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/nodes"
	"computeplane/internal/workflows"
)

// newWorkflow starts a metal-host workflow on a fresh node of tenant and
// leaves it in state (running, paused or failed); it returns "node wf".
func (fx *fixture) newWorkflow(t *testing.T, tenant, state string) string {
	t.Helper()
	n, err := nodes.Register(t.Context(), fx.env.Store, fx.env.Host.Identity().Projection(), fx.env.Config.TypePrefix,
		nodes.Registration{PoolID: fx.pool(t, tenant), Hostname: fx.unique(), VCPU: 1, MemoryMiB: 256})
	require.NoError(t, err, "fixture: a node in %s", tenant)
	var id string
	require.NoError(t, fx.env.Store.WithTx(t.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		w, err := workflows.Start(ctx, tx, workflows.StartParams{TenantID: tenant, NodeID: n.NodeID, ProfileID: workflows.MetalHostProfile,
			Inputs: map[string]any{"image": "img", "agentImage": "agent", "hostname": "h"}})
		if err != nil {
			return err
		}
		id = w.WorkflowID
		switch state {
		case workflows.StatePaused:
			_, err = tx.Exec(ctx, `update workflows set state = 'paused' where workflow_id = $1`, id)
		case workflows.StateFailed:
			if _, err = tx.Exec(ctx, `update workflow_steps set state = 'failed', attempts = 1, failures = 3, last_error = 'fixture'
				where workflow_id = $1 and position = 0`, id); err == nil {
				_, err = tx.Exec(ctx, `update workflows set state = 'failed', error = 'fixture' where workflow_id = $1`, id)
			}
		}
		return err
	}), "fixture: a workflow in %s", tenant)
	return n.NodeID + " " + id
}

// workflow is the workflow in state kept for tenant (made while
// preparing, so that refused calls create nothing): its node and id.
func (fx *fixture) workflow(t *testing.T, tenant, state string) (node, id string) {
	t.Helper()
	v := fx.keep("workflow-"+state, tenant, func() string { return fx.newWorkflow(t, tenant, state) })
	node, id, _ = strings.Cut(v, " ")
	return node, id
}

// usedWorkflow forgets the kept workflow once an admitted call changed it.
func usedWorkflow(fx *fixture, tenant, state, node, id string, err error) {
	if err == nil {
		fx.used("workflow-"+state, tenant, node+" "+id)
	}
}

func init() {
	preparers = append(preparers, func(t *testing.T, fx *fixture, tenant string, _ map[string]string) {
		for _, state := range []string{workflows.StateRunning, workflows.StatePaused, workflows.StateFailed} {
			fx.workflow(t, tenant, state)
		}
	})
	readers := []string{owner, admin, member, viewer}
	operators := []string{owner, admin}
	matrix[api.MethodWorkflowsGet] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			node, id := fx.workflow(t, tenant, workflows.StateRunning)
			return c.WorkflowsGet(t.Context(), &client.WorkflowsGetInput{TenantId: tenant, NodeId: node, WorkflowId: id})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.WorkflowsGetResult).Data
			assert.Equal(t, tenant, d.TenantId)
			assert.Equal(t, "running", string(d.State))
			assert.NotEmpty(t, d.Steps)
		},
	}}
	matrix[api.MethodWorkflowsList] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			node, _ := fx.workflow(t, tenant, workflows.StateRunning)
			return c.WorkflowsList(t.Context(), &client.WorkflowsListInput{TenantId: tenant, NodeId: node})
		},
		tenantRoles: readers, rootRoles: operators,
		ok: func(t *testing.T, res any, tenant string) {
			items := res.(*client.WorkflowsListResult).Data.Items
			require.Len(t, items, 1)
			assert.Equal(t, tenant, items[0].TenantId)
		},
	}}
	matrix[api.MethodWorkflowsAbort] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			node, id := fx.workflow(t, tenant, workflows.StateRunning)
			res, err := c.WorkflowsAbort(t.Context(), &client.WorkflowsAbortInput{TenantId: tenant, NodeId: node, WorkflowId: id})
			usedWorkflow(fx, tenant, workflows.StateRunning, node, id, err)
			return res, err
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "aborted", string(res.(*client.WorkflowsAbortResult).Data.State))
		},
	}}
	matrix[api.MethodWorkflowsPause] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			node, id := fx.workflow(t, tenant, workflows.StateRunning)
			res, err := c.WorkflowsPause(t.Context(), &client.WorkflowsPauseInput{TenantId: tenant, NodeId: node, WorkflowId: id})
			usedWorkflow(fx, tenant, workflows.StateRunning, node, id, err)
			return res, err
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "paused", string(res.(*client.WorkflowsPauseResult).Data.State))
		},
	}}
	matrix[api.MethodWorkflowsResume] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			node, id := fx.workflow(t, tenant, workflows.StatePaused)
			res, err := c.WorkflowsResume(t.Context(), &client.WorkflowsResumeInput{TenantId: tenant, NodeId: node, WorkflowId: id})
			usedWorkflow(fx, tenant, workflows.StatePaused, node, id, err)
			return res, err
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			assert.Equal(t, "running", string(res.(*client.WorkflowsResumeResult).Data.State))
		},
	}}
	matrix[api.MethodWorkflowsRetry] = []matrixCase{{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			node, id := fx.workflow(t, tenant, workflows.StateFailed)
			res, err := c.WorkflowsRetry(t.Context(), &client.WorkflowsRetryInput{TenantId: tenant, NodeId: node, WorkflowId: id})
			usedWorkflow(fx, tenant, workflows.StateFailed, node, id, err)
			return res, err
		},
		tenantRoles: operators, rootRoles: operators,
		ok: func(t *testing.T, res any, _ string) {
			d := res.(*client.WorkflowsRetryResult).Data
			assert.Equal(t, "running", string(d.State))
			assert.Equal(t, "pending", string(d.Steps[0].State))
			assert.EqualValues(t, 1, d.Steps[0].Attempts)
		},
	}}
}
