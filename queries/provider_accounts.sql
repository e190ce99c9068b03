-- name: InsertProviderAccount :one
INSERT INTO provider_accounts (account_id, tenant_id, provider, name, config, created_by, idem_request)
VALUES (sqlc.arg(account_id), sqlc.arg(tenant_id), sqlc.arg(provider), sqlc.arg(name), sqlc.arg(config), sqlc.arg(created_by),
    sqlc.narg(idem_request))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetProviderAccount :one
SELECT * FROM provider_accounts WHERE account_id = sqlc.arg(account_id);

-- name: GetProviderAccountForUpdate :one
SELECT * FROM provider_accounts WHERE account_id = sqlc.arg(account_id) FOR UPDATE;

-- name: ProviderAccountByName :one
SELECT * FROM provider_accounts WHERE tenant_id = sqlc.arg(tenant_id) AND name = sqlc.arg(name);

-- name: ListProviderAccounts :many
SELECT * FROM provider_accounts WHERE tenant_id = sqlc.arg(tenant_id) ORDER BY name;

-- name: UpdateProviderAccountConfig :one
UPDATE provider_accounts SET config = sqlc.arg(config), version = version + 1, updated_at = now()
WHERE account_id = sqlc.arg(account_id)
RETURNING *;

-- name: DeleteProviderAccount :execrows
DELETE FROM provider_accounts WHERE account_id = sqlc.arg(account_id);

-- name: ProviderAccountUsers :one
-- What keeps an account from being deleted: its pools that are not
-- archived, and the instances of its pools that are not deleted.
SELECT
    (SELECT count(*) FROM pools p WHERE p.account_id = sqlc.arg(account_id) AND NOT p.archived)::bigint AS pools,
    (SELECT count(*) FROM instances i JOIN pools p ON p.pool_id = i.pool_id
        WHERE p.account_id = sqlc.arg(account_id) AND i.state <> 'deleted')::bigint AS instances;

-- name: InsertProviderBootstrap :one
INSERT INTO provider_bootstraps (bootstrap_id, tenant_id, account_id, pool_id, machine_id, offer_id, state, idem_request, created_by)
VALUES (sqlc.arg(bootstrap_id), sqlc.arg(tenant_id), sqlc.arg(account_id), sqlc.arg(pool_id), sqlc.narg(machine_id),
    sqlc.narg(offer_id), sqlc.arg(state), sqlc.arg(idem_request), sqlc.arg(created_by))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetProviderBootstrap :one
SELECT * FROM provider_bootstraps WHERE bootstrap_id = sqlc.arg(bootstrap_id);

-- name: GetProviderBootstrapForUpdate :one
SELECT * FROM provider_bootstraps WHERE bootstrap_id = sqlc.arg(bootstrap_id) FOR UPDATE;

-- name: DueProviderBootstraps :many
SELECT * FROM provider_bootstraps
WHERE state NOT IN ('joined', 'failed') AND next_attempt_at <= now()
ORDER BY next_attempt_at
LIMIT sqlc.arg(max_rows);

-- name: SaveProviderBootstrap :one
UPDATE provider_bootstraps SET state = sqlc.arg(state), machine_id = sqlc.narg(machine_id), claimed = sqlc.arg(claimed),
    token_id = sqlc.narg(token_id), node_id = sqlc.narg(node_id), error = sqlc.narg(error), attempts = sqlc.arg(attempts),
    next_attempt_at = sqlc.arg(next_attempt_at), machine_at = sqlc.narg(machine_at), installed_at = sqlc.narg(installed_at),
    finished_at = sqlc.narg(finished_at), updated_at = now()
WHERE bootstrap_id = sqlc.arg(bootstrap_id)
RETURNING *;

-- name: JoinedNodeOfToken :one
-- The node a bootstrap's join token made, and its state (null until the
-- token was used).
SELECT t.node_id, t.revoked, n.state AS node_state
FROM join_tokens t LEFT JOIN nodes n ON n.node_id = t.node_id
WHERE t.token_id = sqlc.arg(token_id);

-- name: RevokeJoinToken :exec
UPDATE join_tokens SET revoked = true WHERE token_id = sqlc.arg(token_id) AND used_at IS NULL;
