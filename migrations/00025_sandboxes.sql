-- +goose Up
-- Sandboxes run in instances rows: kind says what an instance is (a VPS,
-- a template's warm instance, a sandbox's VM). A warm instance claimed by
-- a sandbox becomes kind sandbox with a new identity generation.
ALTER TABLE instances
    ADD COLUMN kind text NOT NULL DEFAULT 'vps' CHECK (kind IN ('vps', 'warm', 'sandbox')),
    ADD COLUMN template_id text REFERENCES sandbox_templates (template_id),
    ADD COLUMN hostname text,
    ADD COLUMN machine_id text,
    ADD COLUMN env jsonb,
    ADD COLUMN identity_generation bigint NOT NULL DEFAULT 0,
    ADD COLUMN reported_identity bigint NOT NULL DEFAULT 0,
    ADD COLUMN memory_file boolean NOT NULL DEFAULT false,
    ADD COLUMN restore_snapshot text,
    ADD COLUMN volumes jsonb,
    ADD COLUMN host_timings jsonb,
    ADD COLUMN identity_ready_at timestamptz;

CREATE INDEX instances_warm_idx ON instances (template_id, created_at) WHERE kind = 'warm' AND desired_state <> 'deleted';

-- sandboxes: what a tenant sees of a sandbox; its VM is instance_id.
CREATE TABLE sandboxes (
    sandbox_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    template_id text NOT NULL REFERENCES sandbox_templates (template_id),
    from_snapshot text,
    instance_id text NOT NULL REFERENCES instances (instance_id),
    pool_id text NOT NULL REFERENCES pools (pool_id),
    node_id text NOT NULL REFERENCES nodes (node_id),
    how text NOT NULL CHECK (how IN ('warm', 'cold', 'restore')),
    max_ttl_seconds integer NOT NULL,
    expires_at timestamptz NOT NULL,
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ready_at timestamptz,
    deleted_at timestamptz,
    delete_reason text
);

CREATE INDEX sandboxes_tenant_idx ON sandboxes (tenant_id, created_at DESC);
CREATE INDEX sandboxes_expiry_idx ON sandboxes (expires_at) WHERE deleted_at IS NULL;

-- sandbox_attachments: the volumes a sandbox attaches. A live read-write
-- attachment excludes every other live attachment of its volume.
CREATE TABLE sandbox_attachments (
    sandbox_id text NOT NULL REFERENCES sandboxes (sandbox_id),
    volume_id text NOT NULL REFERENCES sandbox_volumes (volume_id),
    mount_path text NOT NULL,
    read_only boolean NOT NULL,
    released boolean NOT NULL DEFAULT false,
    PRIMARY KEY (sandbox_id, volume_id)
);

CREATE UNIQUE INDEX sandbox_attachments_rw_idx ON sandbox_attachments (volume_id) WHERE NOT read_only AND NOT released;
CREATE INDEX sandbox_attachments_live_idx ON sandbox_attachments (volume_id) WHERE NOT released;

-- sandbox_snapshots: memory and disks of a sandbox, kept on its node;
-- command_id is the node command that takes it.
CREATE TABLE sandbox_snapshots (
    snapshot_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    sandbox_id text NOT NULL REFERENCES sandboxes (sandbox_id),
    node_id text NOT NULL REFERENCES nodes (node_id),
    keep boolean NOT NULL,
    state text NOT NULL CHECK (state IN ('creating', 'ready', 'failed', 'deleted')),
    error text,
    size_bytes bigint,
    paused_ms bigint,
    command_id text NOT NULL,
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    ready_at timestamptz,
    deleted_at timestamptz
);

CREATE INDEX sandbox_snapshots_tenant_idx ON sandbox_snapshots (tenant_id, created_at DESC);
CREATE INDEX sandbox_snapshots_command_idx ON sandbox_snapshots (command_id);

-- +goose Down
DROP TABLE sandbox_snapshots;
DROP TABLE sandbox_attachments;
DROP TABLE sandboxes;
DROP INDEX instances_warm_idx;
ALTER TABLE instances DROP COLUMN kind, DROP COLUMN template_id, DROP COLUMN hostname, DROP COLUMN machine_id, DROP COLUMN env,
    DROP COLUMN identity_generation, DROP COLUMN reported_identity, DROP COLUMN memory_file, DROP COLUMN restore_snapshot,
    DROP COLUMN volumes, DROP COLUMN host_timings, DROP COLUMN identity_ready_at;
