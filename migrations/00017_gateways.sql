-- +goose Up
-- gateways: one row per running gateway process, beside its lease
-- (leases.name = 'gateway/<id>', 20 s, renewed every 5 s). A node's session
-- names its gateway; sessions of a gateway whose lease expired are dead.
CREATE TABLE gateways (
    gateway_id text PRIMARY KEY,
    region text NOT NULL,
    url text NOT NULL,
    server_name text,
    epoch bigint NOT NULL,
    max_streams integer NOT NULL,
    sessions integer NOT NULL DEFAULT 0,
    draining boolean NOT NULL DEFAULT false,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX gateways_region_idx ON gateways (region);

-- The session of a node's daemon: which gateway holds it (session_gateway,
-- already there), a counter that every new session raises (so an old
-- gateway's late writes are fenced), when it closed, its transport, what
-- the daemon last reported. down_from keeps the state a node left when its
-- session was lost, to go back to when it returns.
ALTER TABLE nodes
    ADD COLUMN session_epoch bigint NOT NULL DEFAULT 0,
    ADD COLUMN session_closed_at timestamptz,
    ADD COLUMN session_transport text,
    ADD COLUMN last_seen_at timestamptz,
    ADD COLUMN observed_generation bigint NOT NULL DEFAULT 0,
    ADD COLUMN apply_error text,
    ADD COLUMN inventory jsonb,
    ADD COLUMN instance_status jsonb,
    ADD COLUMN cert_serial text,
    ADD COLUMN down_from text;

CREATE INDEX nodes_session_gateway_idx ON nodes (session_gateway) WHERE session_gateway IS NOT NULL;

-- node_specs: the desired state of a daemon-run node, raised one
-- generation per change; the gateway sends it when the daemon's observed
-- generation is behind.
CREATE TABLE node_specs (
    node_id text PRIMARY KEY REFERENCES nodes (node_id),
    generation bigint NOT NULL CHECK (generation >= 1),
    body jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- node_commands: signed instructions to a daemon, re-sent by the command
-- sweeper until a result arrives or they expire.
CREATE TABLE node_commands (
    command_id text PRIMARY KEY,
    node_id text NOT NULL REFERENCES nodes (node_id),
    kind text NOT NULL,
    args jsonb NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'sent', 'succeeded', 'failed', 'expired')),
    attempts integer NOT NULL DEFAULT 0,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz,
    expires_at timestamptz NOT NULL,
    finished_at timestamptz,
    result jsonb
);

CREATE INDEX node_commands_open_idx ON node_commands (node_id, created_at) WHERE state IN ('pending', 'sent');

-- revocations: node ids and certificate serials gateways refuse; a
-- session of a revoked node or certificate is closed at once.
CREATE TABLE revocations (
    kind text NOT NULL CHECK (kind IN ('node', 'serial')),
    value text NOT NULL,
    reason text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, value)
);

-- +goose Down
DROP TABLE revocations;
DROP TABLE node_commands;
DROP TABLE node_specs;
DROP INDEX nodes_session_gateway_idx;
ALTER TABLE nodes
    DROP COLUMN session_epoch, DROP COLUMN session_closed_at, DROP COLUMN session_transport,
    DROP COLUMN last_seen_at, DROP COLUMN observed_generation, DROP COLUMN apply_error, DROP COLUMN inventory,
    DROP COLUMN instance_status, DROP COLUMN cert_serial, DROP COLUMN down_from;
DROP TABLE gateways;
