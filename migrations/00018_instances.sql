-- +goose Up
-- instances: VPS virtual machines. desired_state is what the tenant asks,
-- state what the node's daemon last reported (pending until it reports).
-- The image is resolved at creation and kept (boot), so a later change in
-- the image source never changes a running instance.
CREATE TABLE instances (
    instance_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    node_id text REFERENCES nodes (node_id),
    booking_id text,
    flavor text NOT NULL,
    image_id text NOT NULL,
    boot jsonb NOT NULL,
    name text NOT NULL,
    user_data text,
    vcpu integer NOT NULL CHECK (vcpu >= 1),
    memory_mib bigint NOT NULL CHECK (memory_mib >= 1),
    disk_gib bigint NOT NULL CHECK (disk_gib >= 0),
    desired_state text NOT NULL CHECK (desired_state IN ('running', 'stopped', 'paused', 'deleted')),
    state text NOT NULL CHECK (state IN ('pending', 'starting', 'running', 'stopped', 'paused', 'failed', 'deleted')),
    error text,
    reboots integer NOT NULL DEFAULT 0,
    version bigint NOT NULL DEFAULT 1,
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    ready_at timestamptz,
    deleted_at timestamptz
);

CREATE INDEX instances_tenant_idx ON instances (tenant_id, created_at DESC);
CREATE INDEX instances_node_idx ON instances (node_id) WHERE state <> 'deleted';

-- +goose Down
DROP TABLE instances;
