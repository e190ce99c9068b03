-- +goose Up
-- Outbox dispatch to the configured event and audit sinks.
--
-- audit_log ids have the late-commit problem outbox seq had (see
-- 00007_outbox_order.sql): an identity value is taken when the row is
-- written, not when its transaction commits, so a reader following ids
-- could pass a row that commits later. Audit rows record their transaction
-- id too, and sinks read them in (xid, id) order from finished transactions.
-- Rows written before this migration all take its transaction id, which is
-- finished once it commits.
ALTER TABLE audit_log ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX audit_log_order_idx ON audit_log (xid, id);

-- sink_cursors holds each sink's durable place: the (xid, seq) of the last
-- outbox row an events sink accepted, or the (xid, id) of the last audit row
-- an audit sink accepted. A sink without a row starts at the beginning.
CREATE TABLE sink_cursors (
    sink_kind text NOT NULL CHECK (sink_kind IN ('events', 'audit')),
    sink_id text NOT NULL,
    after_xid xid8 NOT NULL,
    after_seq bigint NOT NULL,
    delivered bigint NOT NULL DEFAULT 0,
    dead_lettered bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink_kind, sink_id)
);

-- sink_dead_letters holds every row a sink gave up on, with the body it
-- was sent and the last error, so an operator can replay it.
CREATE TABLE sink_dead_letters (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink_kind text NOT NULL CHECK (sink_kind IN ('events', 'audit')),
    sink_id text NOT NULL,
    event_id text NOT NULL,
    payload jsonb NOT NULL,
    error text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sink_dead_letters_sink_idx ON sink_dead_letters (sink_kind, sink_id, id);

-- +goose Down
DROP TABLE sink_dead_letters;
DROP TABLE sink_cursors;
DROP INDEX audit_log_order_idx;
ALTER TABLE audit_log DROP COLUMN xid;
