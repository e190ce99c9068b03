-- name: InsertOutbox :one
INSERT INTO outbox (id, type, source, subject, tenant_id, data, request_id, traceparent)
VALUES (sqlc.arg(id), sqlc.arg(type), sqlc.arg(source), sqlc.arg(subject), sqlc.arg(tenant_id),
        sqlc.arg(data), sqlc.narg(request_id), sqlc.narg(traceparent))
RETURNING seq, time;

-- name: ListOutboxByTenant :many
SELECT seq, id, type, source, subject, tenant_id, time, data
FROM outbox
WHERE tenant_id = sqlc.arg(tenant_id) AND seq > sqlc.arg(after_seq)
ORDER BY seq
LIMIT sqlc.arg(max_rows);
