-- InsertAuditWithEvents writes a mutation's audit row and its events in one
-- statement (one round trip before commit); the events keep their order.
-- name: InsertAuditWithEvents :exec
WITH audit AS (
    INSERT INTO audit_log (
        tenant_id, identity_id, identity_kind, agent_id, delegation_id, method,
        resource_type, resource_id, request_id, traceparent, outcome
    ) VALUES (
        sqlc.arg(tenant_id), sqlc.arg(identity_id), sqlc.arg(identity_kind), sqlc.narg(agent_id),
        sqlc.narg(delegation_id), sqlc.arg(method), sqlc.arg(resource_type), sqlc.arg(resource_id),
        sqlc.arg(request_id), sqlc.narg(traceparent), sqlc.arg(outcome)
    )
)
INSERT INTO outbox (id, type, source, subject, tenant_id, data, request_id, traceparent)
SELECT x.ev->>'id', x.ev->>'type', x.ev->>'source', x.ev->>'subject', x.ev->>'tenantId', x.ev->'data',
       sqlc.arg(request_id), sqlc.narg(traceparent)
FROM jsonb_array_elements(sqlc.arg(events)::jsonb) WITH ORDINALITY AS x(ev, ord)
ORDER BY x.ord;
