-- +goose Up
-- Metal hosts: nodes of metal-host pools reached through a bare-metal
-- driver (internal/drivers); config is the driver's (no secrets: only
-- secret references).
CREATE TABLE metal_hosts (
    node_id text PRIMARY KEY REFERENCES nodes (node_id),
    driver text NOT NULL,
    config jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Workflows run a rendered profile's steps against one node. The steps are
-- a snapshot taken at start: a profile changed or deleted later does not
-- change a running workflow.
CREATE TABLE workflows (
    workflow_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    node_id text NOT NULL REFERENCES nodes (node_id),
    profile_tenant text NOT NULL,
    profile_id text NOT NULL,
    profile_version integer NOT NULL,
    inputs jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL CHECK (state IN ('running', 'pausing', 'paused', 'succeeded', 'failed', 'aborted')),
    error text,
    started_by text NOT NULL DEFAULT '',
    -- The next step is not started before this time (a retry's backoff).
    not_before timestamptz,
    version integer NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- One live workflow per node.
CREATE UNIQUE INDEX workflows_live_node_idx ON workflows (node_id) WHERE state IN ('running', 'pausing', 'paused');
CREATE INDEX workflows_node_idx ON workflows (node_id, created_at DESC);
CREATE INDEX workflows_runnable_idx ON workflows (created_at) WHERE state IN ('running', 'pausing');

CREATE TABLE workflow_steps (
    workflow_id text NOT NULL REFERENCES workflows (workflow_id) ON DELETE CASCADE,
    position integer NOT NULL,
    name text NOT NULL,
    phase text NOT NULL,
    action text NOT NULL,
    inputs jsonb NOT NULL DEFAULT '{}',
    timeout_ms bigint NOT NULL,
    retries integer NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'aborted')),
    -- attempts counts every start of the step (an interrupted one too);
    -- failures counts failed attempts since the last start or retry of
    -- the workflow, against retries.
    attempts integer NOT NULL DEFAULT 0,
    failures integer NOT NULL DEFAULT 0,
    started_at timestamptz,
    finished_at timestamptz,
    output jsonb,
    last_error text,
    PRIMARY KEY (workflow_id, position)
);

-- +goose Down
DROP TABLE workflow_steps;
DROP TABLE workflows;
DROP TABLE metal_hosts;
