-- name: InsertJoinToken :exec
INSERT INTO join_tokens (token_id, tenant_id, pool_id, site_id, created_by, expires_at)
VALUES (sqlc.arg(token_id), sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(site_id), sqlc.arg(created_by), sqlc.arg(expires_at));

-- name: GetJoinTokenForUpdate :one
SELECT * FROM join_tokens WHERE token_id = sqlc.arg(token_id) FOR UPDATE;

-- name: UseJoinToken :exec
UPDATE join_tokens SET used_at = now(), bound_key = sqlc.arg(bound_key), node_id = sqlc.arg(node_id)
WHERE token_id = sqlc.arg(token_id) AND used_at IS NULL;

-- name: RevokeSiteJoinTokens :execrows
UPDATE join_tokens SET revoked = true WHERE site_id = sqlc.arg(site_id) AND NOT revoked;
