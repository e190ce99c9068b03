-- name: InsertAudit :exec
INSERT INTO audit_log (
    tenant_id, identity_id, identity_kind, agent_id, delegation_id, method,
    resource_type, resource_id, request_id, traceparent, outcome
) VALUES (
    sqlc.arg(tenant_id), sqlc.arg(identity_id), sqlc.arg(identity_kind), sqlc.narg(agent_id),
    sqlc.narg(delegation_id), sqlc.arg(method), sqlc.arg(resource_type), sqlc.arg(resource_id),
    sqlc.arg(request_id), sqlc.narg(traceparent), sqlc.arg(outcome)
);

-- name: CountAudit :one
SELECT count(*) FROM audit_log;
