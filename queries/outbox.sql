-- name: ListOutboxByTenant :many
SELECT seq, id, type, source, subject, tenant_id, time, data
FROM outbox
WHERE tenant_id = sqlc.arg(tenant_id) AND seq > sqlc.arg(after_seq)
ORDER BY seq
LIMIT sqlc.arg(max_rows);

-- InsertEvents writes the events of one call in one statement, in order.
-- name: InsertEvents :exec
INSERT INTO outbox (id, type, source, subject, tenant_id, data, request_id, traceparent)
SELECT x.ev->>'id', x.ev->>'type', x.ev->>'source', x.ev->>'subject', x.ev->>'tenantId', x.ev->'data',
       sqlc.narg(request_id), sqlc.narg(traceparent)
FROM jsonb_array_elements(sqlc.arg(events)::jsonb) WITH ORDINALITY AS x(ev, ord)
ORDER BY x.ord;
