-- +goose Up
-- support_bundles (issue 25): a node's logs, state and facts, collected by
-- its daemon (command_id: the collect command, then the upload command)
-- and uploaded to the supportBundles blob store under object_key.
CREATE TABLE support_bundles (
    bundle_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    node_id text NOT NULL REFERENCES nodes (node_id),
    pool_id text NOT NULL,
    state text NOT NULL CHECK (state IN ('collecting', 'uploading', 'ready', 'failed', 'deleted')),
    error text,
    max_bytes bigint NOT NULL CHECK (max_bytes > 0),
    size_bytes bigint CHECK (size_bytes >= 0),
    sha256 text,
    redactions bigint,
    object_key text NOT NULL,
    command_id text NOT NULL,
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    ready_at timestamptz,
    deleted_at timestamptz
);

CREATE INDEX support_bundles_tenant_idx ON support_bundles (tenant_id, created_at DESC);
CREATE INDEX support_bundles_command_idx ON support_bundles (command_id);

-- +goose Down
DROP TABLE support_bundles;
