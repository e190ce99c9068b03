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

-- name: ConsumeCloudIdentityDocument :execrows
-- A document joins once: 0 rows when it was consumed before. Rows older
-- than a day (documents are at most an hour old when accepted) are pruned
-- first.
WITH pruned AS (DELETE FROM cloud_identity_documents WHERE used_at < now() - interval '1 day')
INSERT INTO cloud_identity_documents (document_sha256, instance_id, token_id)
VALUES (sqlc.arg(document_sha256), sqlc.arg(instance_id), sqlc.arg(token_id))
ON CONFLICT (document_sha256) DO NOTHING;

-- name: GetBootstrapOfToken :one
-- The provider bootstrap that minted a join token, with its account's
-- provider: the machine the cloud attestor matches a document against.
SELECT b.bootstrap_id, b.tenant_id, b.account_id, b.machine_id, a.provider
FROM provider_bootstraps b JOIN provider_accounts a ON a.account_id = b.account_id
WHERE b.token_id = sqlc.arg(token_id);
