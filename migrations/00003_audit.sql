-- +goose Up
-- audit_log holds one row per committed mutation, written in the
-- mutation's own transaction: a rolled-back call leaves none. It never
-- holds secret values, only who did what to which resource.
CREATE TABLE audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    tenant_id text NOT NULL,
    identity_id text NOT NULL,
    identity_kind text NOT NULL,
    agent_id text,
    delegation_id text,
    method text NOT NULL,
    resource_type text NOT NULL,
    resource_id text NOT NULL,
    request_id text NOT NULL,
    traceparent text,
    outcome text NOT NULL
);

CREATE INDEX audit_log_tenant_idx ON audit_log (tenant_id, id);

-- +goose Down
DROP TABLE audit_log;
