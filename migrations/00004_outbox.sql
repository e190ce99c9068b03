-- +goose Up
-- outbox holds every event a committed change publishes, written in the
-- change's own transaction; sinks, webhooks and /watch read it. Rows are
-- CloudEvents 1.0 envelopes split into columns.
CREATE TABLE outbox (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text NOT NULL UNIQUE,
    type text NOT NULL,
    source text NOT NULL,
    subject text NOT NULL,
    tenant_id text NOT NULL,
    time timestamptz NOT NULL DEFAULT now(),
    data jsonb NOT NULL,
    request_id text,
    traceparent text
);

CREATE INDEX outbox_tenant_idx ON outbox (tenant_id, seq);

-- +goose Down
DROP TABLE outbox;
