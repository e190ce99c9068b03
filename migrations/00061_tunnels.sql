-- +goose Up
-- Tunnels (issue 24, docs/tunnels.md): each row is a ticket tunnels.open
-- issued and, once redeemed, the tunnel it opened. The ticket itself is
-- never stored: only its SHA-256, redeemed once by a conditional update.
CREATE TABLE tunnels (
    tunnel_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    identity_id text NOT NULL,
    target_kind text NOT NULL CHECK (target_kind IN ('instance', 'sandbox')),
    target_id text NOT NULL,
    instance_id text NOT NULL,
    node_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('exec')),
    argv jsonb NOT NULL,
    env jsonb,
    tty boolean NOT NULL DEFAULT false,
    ticket_hash bytea NOT NULL UNIQUE,
    source_ip text NOT NULL,
    state text NOT NULL DEFAULT 'issued' CHECK (state IN ('issued', 'open', 'closed', 'expired')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    opened_at timestamptz,
    closed_at timestamptz,
    bytes_in bigint NOT NULL DEFAULT 0,
    bytes_out bigint NOT NULL DEFAULT 0,
    exit_code integer
);
CREATE INDEX tunnels_tenant_idx ON tunnels (tenant_id, created_at DESC);

-- +goose Down
DROP TABLE tunnels;
