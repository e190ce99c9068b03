-- +goose Up
-- sandbox_volumes: persistent single-host disks (sparse raw files on the
-- host, named by serial). Bookings hold their size as diskGiB on the
-- host (owner_type 'sandbox-volume'); a resize adds a booking for the
-- growth.
CREATE TABLE sandbox_volumes (
    volume_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    node_id text NOT NULL REFERENCES nodes (node_id),
    name text NOT NULL,
    size_gib bigint NOT NULL CHECK (size_gib BETWEEN 1 AND 16384),
    serial text NOT NULL UNIQUE,
    state text NOT NULL CHECK (state IN ('ready', 'deleting', 'deleted')),
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- when its size last changed: growth the host has not reported yet
    -- still counts against the host's store.
    sized_at timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX sandbox_volumes_live_name_idx ON sandbox_volumes (tenant_id, name) WHERE state <> 'deleted';
CREATE INDEX sandbox_volumes_tenant_idx ON sandbox_volumes (tenant_id, created_at);
CREATE INDEX sandbox_volumes_node_idx ON sandbox_volumes (node_id) WHERE state <> 'deleted';

-- +goose Down
DROP TABLE sandbox_volumes;
