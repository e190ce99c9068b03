-- name: InsertWorkflow :one
INSERT INTO workflows (workflow_id, tenant_id, node_id, profile_tenant, profile_id, profile_version, inputs, state, started_by)
VALUES (sqlc.arg(workflow_id), sqlc.arg(tenant_id), sqlc.arg(node_id), sqlc.arg(profile_tenant), sqlc.arg(profile_id),
    sqlc.arg(profile_version), sqlc.arg(inputs), 'running', sqlc.arg(started_by))
RETURNING *;

-- name: InsertWorkflowStep :exec
INSERT INTO workflow_steps (workflow_id, position, name, phase, action, inputs, timeout_ms, retries)
VALUES (sqlc.arg(workflow_id), sqlc.arg(position), sqlc.arg(name), sqlc.arg(phase), sqlc.arg(action), sqlc.arg(inputs),
    sqlc.arg(timeout_ms), sqlc.arg(retries));

-- name: GetWorkflow :one
SELECT * FROM workflows WHERE workflow_id = sqlc.arg(workflow_id);

-- name: GetWorkflowForUpdate :one
SELECT * FROM workflows WHERE workflow_id = sqlc.arg(workflow_id) FOR UPDATE;

-- name: ListNodeWorkflows :many
SELECT * FROM workflows WHERE node_id = sqlc.arg(node_id)
ORDER BY created_at DESC, workflow_id
LIMIT sqlc.arg(max_rows);

-- name: LiveNodeWorkflow :one
SELECT * FROM workflows WHERE node_id = sqlc.arg(node_id) AND state IN ('running', 'pausing', 'paused');

-- name: WorkflowSteps :many
SELECT * FROM workflow_steps WHERE workflow_id = sqlc.arg(workflow_id) ORDER BY position;

-- name: StepsOfWorkflows :many
SELECT * FROM workflow_steps WHERE workflow_id = ANY(sqlc.arg(workflow_ids)::text[]) ORDER BY workflow_id, position;

-- RunnableWorkflows are the workflows a worker has steps to run for.
-- name: RunnableWorkflows :many
SELECT workflow_id FROM workflows
WHERE state IN ('running', 'pausing') AND (not_before IS NULL OR not_before <= now())
ORDER BY created_at
LIMIT sqlc.arg(max_rows);

-- name: SetWorkflowState :one
UPDATE workflows SET state = sqlc.arg(state), error = sqlc.narg(error), not_before = sqlc.narg(not_before),
    finished_at = CASE WHEN sqlc.arg(state)::text IN ('succeeded', 'failed', 'aborted') THEN now() ELSE NULL END,
    version = version + 1, updated_at = now()
WHERE workflow_id = sqlc.arg(workflow_id)
RETURNING *;

-- name: StartWorkflowStep :one
UPDATE workflow_steps SET state = 'running', attempts = attempts + 1, started_at = now(), finished_at = NULL
WHERE workflow_id = sqlc.arg(workflow_id) AND position = sqlc.arg(position)
RETURNING *;

-- name: FinishWorkflowStep :one
UPDATE workflow_steps SET state = sqlc.arg(state), finished_at = now(), output = sqlc.narg(output),
    last_error = coalesce(sqlc.narg(last_error), last_error), failures = failures + sqlc.arg(failed)::integer
WHERE workflow_id = sqlc.arg(workflow_id) AND position = sqlc.arg(position)
RETURNING *;

-- ResetWorkflowStep makes a failed step pending again with a fresh
-- retry budget (workflows.retry).
-- name: ResetWorkflowStep :exec
UPDATE workflow_steps SET state = 'pending', failures = 0
WHERE workflow_id = sqlc.arg(workflow_id) AND position = sqlc.arg(position);

-- name: AbortWorkflowSteps :exec
UPDATE workflow_steps SET state = 'aborted', finished_at = coalesce(finished_at, now())
WHERE workflow_id = sqlc.arg(workflow_id) AND state IN ('pending', 'running');

-- name: InsertMetalHost :exec
INSERT INTO metal_hosts (node_id, driver, config) VALUES (sqlc.arg(node_id), sqlc.arg(driver), sqlc.arg(config));

-- name: GetMetalHost :one
SELECT * FROM metal_hosts WHERE node_id = sqlc.arg(node_id);

-- name: WorkflowNodeOwner :one
SELECT n.node_id, n.pool_id, n.state, p.tenant_id, p.class FROM nodes n JOIN pools p ON p.pool_id = n.pool_id
WHERE n.node_id = sqlc.arg(node_id);

-- name: LockWorkflowNode :one
SELECT n.state, n.pool_id, n.hostname, p.tenant_id FROM nodes n JOIN pools p USING (pool_id)
WHERE n.node_id = sqlc.arg(node_id) FOR UPDATE OF n;

-- JoinMetalNode makes a joining metal host ready with its inventoried capacity.
-- name: JoinMetalNode :exec
UPDATE nodes SET state = 'ready', cap_vcpu = sqlc.arg(cap_vcpu), cap_memory_mib = sqlc.arg(cap_memory_mib),
    cap_disk_gib = sqlc.arg(cap_disk_gib), version = version + 1, updated_at = now()
WHERE node_id = sqlc.arg(node_id) AND state = 'joining';

-- name: WorkflowClock :one
SELECT now()::timestamptz AS now;
