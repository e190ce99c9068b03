-- Queries of the embedded identity service (internal/iam/embedded), on the
-- iam schema of migrations/00002_iam.sql.

-- name: IAMEnsureTenant :exec
INSERT INTO iam.tenants (id, created_at) VALUES (sqlc.arg(id), sqlc.arg(created_at))
ON CONFLICT (id) DO NOTHING;

-- IAMEnsureIdentity creates the identity when absent; IAMGetIdentity, a
-- statement of its own (so it sees a row a concurrent writer committed),
-- then tells whether it lives in another tenant.
-- name: IAMEnsureIdentity :exec
INSERT INTO iam.identities (id, tenant_id, kind, created_at)
VALUES (sqlc.arg(id), sqlc.arg(tenant_id), sqlc.arg(kind), sqlc.arg(created_at))
ON CONFLICT (id) DO NOTHING;

-- name: IAMGetIdentity :one
SELECT id, tenant_id, kind FROM iam.identities WHERE id = $1;

-- IAMEnsureRoleBinding binds the role when the identity holds none in the
-- tenant; IAMGetRole then answers the role it holds.
-- name: IAMEnsureRoleBinding :exec
INSERT INTO iam.role_bindings (tenant_id, identity_id, role, created_at)
VALUES (sqlc.arg(tenant_id), sqlc.arg(identity_id), sqlc.arg(role), sqlc.arg(created_at))
ON CONFLICT (tenant_id, identity_id) DO NOTHING;

-- name: IAMGetRole :one
SELECT role FROM iam.role_bindings WHERE tenant_id = $1 AND identity_id = $2;

-- name: IAMInsertDelegation :exec
INSERT INTO iam.delegations (id, tenant_id, identity_id, agent_id, confirm_actions, created_at)
VALUES ($1, $2, $3, $4, sqlc.arg(confirm_actions)::text[], $5);

-- name: IAMGetDelegation :one
SELECT id, tenant_id, identity_id, agent_id, confirm_actions FROM iam.delegations WHERE id = $1;

-- name: IAMInsertKey :exec
INSERT INTO iam.api_keys (id, tenant_id, identity_id, token_hash, mfa, agent_id, delegation_id, created_at)
VALUES ($1, $2, $3, $4, $5, sqlc.narg(agent_id), sqlc.narg(delegation_id), $6);

-- name: IAMKeyByHash :one
SELECT k.id, k.tenant_id, k.identity_id, k.mfa, k.agent_id, k.delegation_id, k.revoked_at, i.kind AS identity_kind
FROM iam.api_keys k JOIN iam.identities i ON i.id = k.identity_id
WHERE k.token_hash = $1;

-- name: IAMRevokeKey :one
UPDATE iam.api_keys SET revoked_at = sqlc.arg(revoked_at)
WHERE id = sqlc.arg(id) AND revoked_at IS NULL
RETURNING id, identity_id;

-- name: IAMKeyExists :one
SELECT EXISTS (SELECT 1 FROM iam.api_keys WHERE id = $1) AS found;

-- name: IAMListKeys :many
SELECT k.id, k.tenant_id, k.identity_id, i.kind AS identity_kind,
       coalesce(b.role, '')::text AS role, k.mfa, k.agent_id, k.delegation_id,
       coalesce(d.confirm_actions, '{}')::text[] AS confirm_actions,
       k.created_at, k.revoked_at
FROM iam.api_keys k
JOIN iam.identities i ON i.id = k.identity_id
LEFT JOIN iam.role_bindings b ON b.tenant_id = k.tenant_id AND b.identity_id = k.identity_id
LEFT JOIN iam.delegations d ON d.id = k.delegation_id
WHERE sqlc.arg(tenant_id)::text = '' OR k.tenant_id = sqlc.arg(tenant_id)::text
ORDER BY k.tenant_id, k.created_at, k.id;

-- IAMKeyRowsText returns every key row as PostgreSQL prints it, for the
-- tests that prove no token is stored.
-- name: IAMKeyRowsText :many
SELECT k::text AS row FROM iam.api_keys k ORDER BY k.id;

-- name: IAMTenantHasAdminKey :one
SELECT EXISTS (
    SELECT 1 FROM iam.api_keys k
    JOIN iam.role_bindings b ON b.tenant_id = k.tenant_id AND b.identity_id = k.identity_id
    WHERE k.tenant_id = $1 AND k.revoked_at IS NULL AND b.role IN ('owner', 'admin')
) AS found;

-- name: IAMInsertConfirmation :exec
INSERT INTO iam.confirmations (id, delegation_id, action, resource_type, resource_id, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: IAMGetConfirmation :one
SELECT * FROM iam.confirmations WHERE id = $1;

-- Projection.

-- name: IAMGetResource :one
SELECT * FROM iam.resources WHERE type = $1 AND id = $2;

-- IAMPutDraft writes a draft; it never turns a real resource back into a
-- draft nor changes it (a retried create is decided on what exists): it
-- then writes no row.
-- name: IAMPutDraft :execrows
INSERT INTO iam.resources (type, id, tenant_id, parent_type, parent_id, owner_id, attributes, draft, created_at, updated_at)
VALUES (sqlc.arg(type), sqlc.arg(id), sqlc.arg(tenant_id), sqlc.narg(parent_type), sqlc.narg(parent_id),
        sqlc.narg(owner_id), sqlc.arg(attributes), true, sqlc.arg(now), sqlc.arg(now))
ON CONFLICT (type, id) DO UPDATE SET
    tenant_id = excluded.tenant_id,
    parent_type = excluded.parent_type,
    parent_id = excluded.parent_id,
    owner_id = excluded.owner_id,
    attributes = excluded.attributes,
    updated_at = excluded.updated_at
WHERE iam.resources.draft;

-- name: IAMDropDraft :exec
DELETE FROM iam.resources WHERE type = $1 AND id = $2 AND draft;

-- name: IAMSweepDrafts :execrows
-- Drafts older than the bound: a process killed between PutDraft and the
-- end of its call left them; no live call holds a draft that long.
DELETE FROM iam.resources WHERE draft AND updated_at < sqlc.arg(before);

-- IAMPutResource writes a real resource (or makes a draft real). An empty
-- owner keeps the one recorded: writers that update need not know it.
-- name: IAMPutResource :exec
INSERT INTO iam.resources (type, id, tenant_id, parent_type, parent_id, owner_id, attributes, draft, created_at, updated_at)
VALUES (sqlc.arg(type), sqlc.arg(id), sqlc.arg(tenant_id), sqlc.narg(parent_type), sqlc.narg(parent_id),
        sqlc.narg(owner_id), sqlc.arg(attributes), false, sqlc.arg(now), sqlc.arg(now))
ON CONFLICT (type, id) DO UPDATE SET
    tenant_id = excluded.tenant_id,
    parent_type = excluded.parent_type,
    parent_id = excluded.parent_id,
    owner_id = coalesce(excluded.owner_id, iam.resources.owner_id),
    attributes = excluded.attributes,
    draft = false,
    updated_at = excluded.updated_at;

-- name: IAMDeleteResource :exec
DELETE FROM iam.resources WHERE type = $1 AND id = $2;

-- name: IAMDeleteRelationshipsOf :exec
DELETE FROM iam.relationships WHERE resource_type = $1 AND resource_id = $2;

-- name: IAMRelate :exec
INSERT INTO iam.relationships (resource_type, resource_id, relation, identity_id, created_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING;

-- name: IAMUnrelate :exec
DELETE FROM iam.relationships
WHERE resource_type = $1 AND resource_id = $2 AND relation = $3 AND identity_id = $4;

-- IAMProjectMember reports whether the identity holds relation member on a
-- real project of the tenant that is one of the resource's ancestors
-- (followed through the projection, at most 8 levels up) or, with
-- include_self, the resource itself.
-- name: IAMProjectMember :one
WITH RECURSIVE chain (type, id, depth) AS (
    SELECT sqlc.arg(type)::text, sqlc.arg(id)::text, 0
    UNION ALL
    SELECT sqlc.arg(parent_type)::text, sqlc.arg(parent_id)::text, 1
    WHERE sqlc.arg(parent_type)::text <> ''
    UNION ALL
    SELECT r.parent_type, r.parent_id, c.depth + 1
    FROM chain c JOIN iam.resources r ON r.type = c.type AND r.id = c.id
    WHERE r.parent_type IS NOT NULL AND c.depth BETWEEN 1 AND 7
)
SELECT EXISTS (
    SELECT 1 FROM chain c
    JOIN iam.resources p ON p.type = c.type AND p.id = c.id AND p.tenant_id = sqlc.arg(tenant_id)::text AND NOT p.draft
    JOIN iam.relationships rel ON rel.resource_type = c.type AND rel.resource_id = c.id
    WHERE c.type = sqlc.arg(project_type)::text
      AND (c.depth > 0 OR sqlc.arg(include_self)::boolean)
      AND rel.relation = 'member' AND rel.identity_id = sqlc.arg(identity_id)::text
) AS member;

-- Inbox.

-- name: IAMInsertEvent :exec
INSERT INTO iam.inbox (event_id, type, identity_id, session, at) VALUES ($1, $2, $3, $4, $5);

-- name: IAMInsertEventOnce :execrows
-- An event from the identity service's signed webhook: a second delivery of
-- the same event id records nothing.
INSERT INTO iam.inbox (event_id, type, identity_id, session, at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (event_id) DO NOTHING;

-- name: IAMEventSeq :one
SELECT seq FROM iam.inbox WHERE event_id = $1;

-- name: IAMEventsAfter :many
SELECT seq, event_id, type, identity_id, session, at FROM iam.inbox
WHERE seq > sqlc.arg(after_seq)::bigint
ORDER BY seq
LIMIT sqlc.arg(max_rows)::int;

-- Billing bridge.

-- name: IAMInsertUsage :one
INSERT INTO iam.usage_records (key, tenant_id, meter, quantity, window_start, window_end, tags, outcome, recorded_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'recorded', $8)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: IAMGetUsageForUpdate :one
SELECT * FROM iam.usage_records WHERE key = $1 FOR UPDATE;

-- name: IAMReattributeUsage :exec
UPDATE iam.usage_records SET tenant_id = $2, outcome = 'reattributed', recorded_at = $3 WHERE key = $1;

-- name: IAMGetUsage :one
SELECT * FROM iam.usage_records WHERE key = $1;

-- name: IAMInsertDeadLetter :exec
INSERT INTO iam.usage_dead_letters (key, tenant_id, meter, quantity, window_start, window_end, tags, error, at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: IAMListDeadLetters :many
SELECT * FROM iam.usage_dead_letters WHERE key = $1 ORDER BY id;

-- name: IAMRelated :many
-- The identities related to a resource by a relation, by id.
SELECT identity_id FROM iam.relationships
WHERE resource_type = sqlc.arg(resource_type) AND resource_id = sqlc.arg(resource_id) AND relation = sqlc.arg(relation)
ORDER BY identity_id;

-- name: IAMSetRole :exec
-- Binds role to an identity in a tenant, replacing the role it held.
INSERT INTO iam.role_bindings (tenant_id, identity_id, role, created_at)
VALUES (sqlc.arg(tenant_id), sqlc.arg(identity_id), sqlc.arg(role), sqlc.arg(created_at))
ON CONFLICT (tenant_id, identity_id) DO UPDATE SET role = excluded.role;

-- External decisions (internal/iam/spicedb) mirror the projection, the
-- relationships and the role bindings the embedded service keeps.

-- name: IAMAllResources :many
SELECT type, id, tenant_id, parent_type, parent_id, owner_id, attributes, draft
FROM iam.resources ORDER BY type, id;

-- name: IAMAllRelationships :many
SELECT resource_type, resource_id, relation, identity_id
FROM iam.relationships ORDER BY resource_type, resource_id, relation, identity_id;

-- name: IAMAllRoleBindings :many
SELECT tenant_id, identity_id, role FROM iam.role_bindings ORDER BY tenant_id, identity_id;
