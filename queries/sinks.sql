-- Outbox dispatch to event and audit sinks (migrations/00010_sinks.sql).

-- GetSinkCursor reads a sink's durable place; no row means the beginning.
-- name: GetSinkCursor :one
SELECT after_xid::text AS after_xid, after_seq, delivered, dead_lettered, updated_at
FROM sink_cursors
WHERE sink_kind = sqlc.arg(sink_kind) AND sink_id = sqlc.arg(sink_id);

-- AdvanceSinkCursor moves a sink's cursor from (from_xid, from_seq) to
-- (to_xid, to_seq) and adds to its counters. It changes nothing, and
-- reports 0 rows, when the cursor is no longer where the caller read it:
-- another dispatcher moved it.
-- name: AdvanceSinkCursor :execrows
INSERT INTO sink_cursors AS c (sink_kind, sink_id, after_xid, after_seq, delivered, dead_lettered, updated_at)
VALUES (
    sqlc.arg(sink_kind), sqlc.arg(sink_id), sqlc.arg(to_xid)::text::xid8, sqlc.arg(to_seq)::bigint,
    sqlc.arg(delivered)::bigint, sqlc.arg(dead_lettered)::bigint, now()
)
ON CONFLICT (sink_kind, sink_id) DO UPDATE
SET after_xid = excluded.after_xid,
    after_seq = excluded.after_seq,
    delivered = c.delivered + excluded.delivered,
    dead_lettered = c.dead_lettered + excluded.dead_lettered,
    updated_at = excluded.updated_at
WHERE c.after_xid = sqlc.arg(from_xid)::text::xid8 AND c.after_seq = sqlc.arg(from_seq)::bigint;

-- ListAuditCommitted reads audit rows in visibility order after a cursor
-- (xid, id), only from transactions below visibility_frontier(), as
-- ListOutboxCommitted does for the outbox (through the view, as there).
-- name: ListAuditCommitted :many
SELECT id, xid::text AS xid, at, tenant_id, identity_id, identity_kind, agent_id, delegation_id,
       method, resource_type, resource_id, request_id, traceparent, outcome
FROM audit_log
WHERE xid < (SELECT frontier FROM visibility_frontier_now)
  AND (xid, id) > (sqlc.arg(after_xid)::text::xid8, sqlc.arg(after_id)::bigint)
ORDER BY audit_log.xid, audit_log.id -- the column, not the text alias
LIMIT sqlc.arg(max_rows);

-- InsertSinkDeadLetters records the rows a sink gave up on, in order; each
-- element of letters is {"id": <event or audit id>, "payload": <body>}.
-- name: InsertSinkDeadLetters :exec
INSERT INTO sink_dead_letters (sink_kind, sink_id, event_id, payload, error)
SELECT sqlc.arg(sink_kind), sqlc.arg(sink_id), x.d->>'id', x.d->'payload', sqlc.arg(error)
FROM jsonb_array_elements(sqlc.arg(letters)::jsonb) WITH ORDINALITY AS x(d, ord)
ORDER BY x.ord;

-- CountOutboxAfter counts outbox rows after a cursor, up to cap: an events
-- sink's lag.
-- name: CountOutboxAfter :one
SELECT count(*) FROM (
    SELECT 1 FROM outbox
    WHERE (xid, seq) > (sqlc.arg(after_xid)::text::xid8, sqlc.arg(after_seq)::bigint)
    LIMIT sqlc.arg(max_rows)
) AS behind;

-- CountAuditAfter counts audit rows after a cursor, up to cap: an audit
-- sink's lag.
-- name: CountAuditAfter :one
SELECT count(*) FROM (
    SELECT 1 FROM audit_log
    WHERE (xid, id) > (sqlc.arg(after_xid)::text::xid8, sqlc.arg(after_id)::bigint)
    LIMIT sqlc.arg(max_rows)
) AS behind;

-- CountSinkDeadLetters counts the dead letters a sink holds.
-- name: CountSinkDeadLetters :one
SELECT count(*) FROM sink_dead_letters
WHERE sink_kind = sqlc.arg(sink_kind) AND sink_id = sqlc.arg(sink_id);

-- ListSinkDeadLetters reads a sink's dead letters, oldest first.
-- name: ListSinkDeadLetters :many
SELECT id, event_id, payload, error, at FROM sink_dead_letters
WHERE sink_kind = sqlc.arg(sink_kind) AND sink_id = sqlc.arg(sink_id) AND id > sqlc.arg(after_id)
ORDER BY id
LIMIT sqlc.arg(max_rows);
