-- InsertEvents writes the events of one call in one statement, in order.
-- name: InsertEvents :exec
INSERT INTO outbox (id, type, source, subject, tenant_id, data, request_id, traceparent)
SELECT x.ev->>'id', x.ev->>'type', x.ev->>'source', x.ev->>'subject', x.ev->>'tenantId', x.ev->'data',
       sqlc.narg(request_id), sqlc.narg(traceparent)
FROM jsonb_array_elements(sqlc.arg(events)::jsonb) WITH ORDINALITY AS x(ev, ord)
ORDER BY x.ord;
-- ListOutboxCommitted reads the outbox in visibility order after a cursor
-- (xid, seq): only rows below visibility_frontier() (every transaction of
-- this database older than it has finished), which can no longer change,
-- so a reader never passes a row that commits later. An empty tenant reads every tenant.
-- The frontier is read from the view visibility_frontier_now (00076), not
-- through the function: the function's body was planned again at every
-- call (0.4 ms, most of this statement's 0.5 to 1 ms, run after every
-- commit with events), the view's is planned once with the statement.
-- name: ListOutboxCommitted :many
SELECT seq, xid::text AS xid, id, type, source, subject, tenant_id, time, data
FROM outbox
WHERE xid < (SELECT frontier FROM visibility_frontier_now)
  AND (xid, seq) > (sqlc.arg(after_xid)::text::xid8, sqlc.arg(after_seq)::bigint)
  AND (sqlc.arg(tenant_id)::text = '' OR tenant_id = sqlc.arg(tenant_id))
ORDER BY outbox.xid, outbox.seq -- the column, not the text alias: "10" sorts before "9"
LIMIT sqlc.arg(max_rows);
