-- name: GetSecretForUpdate :one
-- The head of a reference, locked: puts and deletes of one reference run one
-- after another, so versions are consecutive.
SELECT * FROM secrets WHERE reference = sqlc.arg(reference) FOR UPDATE;

-- name: CreateSecret :one
-- The first put of a reference: the head at version 1 and its sealed value.
-- No row returns when a concurrent put created the head first (the caller
-- then locks it and writes the next version).
WITH head AS (
    INSERT INTO secrets (reference, tenant_id, scope, name, store, version, idem_key)
    VALUES (sqlc.arg(reference), sqlc.arg(tenant_id), sqlc.arg(scope), sqlc.arg(name), sqlc.arg(store), 1, sqlc.arg(idem_key))
    ON CONFLICT (reference) DO NOTHING
    RETURNING reference, version
)
INSERT INTO secret_versions (reference, version, nonce, sealed, created_by, value_digest)
SELECT head.reference, head.version, sqlc.arg(nonce), sqlc.arg(sealed), sqlc.arg(created_by), sqlc.arg(value_digest) FROM head
RETURNING version;

-- name: WriteSecretVersion :one
-- A later put on the locked head: the head moves to version (the one the
-- value was sealed for) and the sealed value is added. A tombstoned head
-- comes back to life in the given store.
WITH head AS (
    UPDATE secrets
    SET version = sqlc.arg(version), idem_key = sqlc.arg(idem_key), store = sqlc.arg(store),
        deleted = false, updated_at = now()
    WHERE secrets.reference = sqlc.arg(reference)
    RETURNING reference, version
)
INSERT INTO secret_versions (reference, version, nonce, sealed, created_by, value_digest)
SELECT head.reference, head.version, sqlc.arg(nonce), sqlc.arg(sealed), sqlc.arg(created_by), sqlc.arg(value_digest) FROM head
RETURNING version;

-- name: DeleteSecret :one
-- Removes every sealed version and keeps the head as a tombstone holding the
-- last version, so a later put continues after it.
WITH gone AS (
    DELETE FROM secret_versions WHERE secret_versions.reference = sqlc.arg(reference)
)
UPDATE secrets SET deleted = true, idem_key = NULL, updated_at = now()
WHERE secrets.reference = sqlc.arg(reference)
RETURNING version;

-- name: GetSecretValue :one
-- The head of a reference and its current sealed value (absent on a
-- tombstone), for the resolver.
SELECT s.reference, s.tenant_id, s.scope, s.store, s.version, s.deleted,
       v.nonce, v.sealed
FROM secrets s
LEFT JOIN secret_versions v ON v.reference = s.reference AND v.version = s.version
WHERE s.reference = sqlc.arg(reference);

-- name: GetSecretVersionCheck :one
-- What a retry is compared with: the keyed digest of the version's value,
-- or, for a version written before digests were kept, its sealed value.
SELECT value_digest, nonce, sealed FROM secret_versions
WHERE reference = sqlc.arg(reference) AND version = sqlc.arg(version);

-- name: ListSecrets :many
-- Live secrets of a tenant's scope by name, after a name, for secrets.list.
SELECT name, reference, version, store, updated_at FROM secrets
WHERE tenant_id = sqlc.arg(tenant_id) AND scope = sqlc.arg(scope) AND NOT deleted
  AND name > sqlc.arg(after)::text
ORDER BY name
LIMIT sqlc.arg(max_rows)::int;
