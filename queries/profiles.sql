-- name: InsertProfile :one
INSERT INTO profiles (tenant_id, profile_id, profile_version, document, visibility)
VALUES (sqlc.arg(tenant_id), sqlc.arg(profile_id), sqlc.arg(profile_version), sqlc.arg(document), sqlc.arg(visibility))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: LookupProfile :one
-- The version a tenant sees: its own first, then a public one (of the
-- first tenant in byte order when several publish it).
SELECT * FROM profiles
WHERE profile_id = sqlc.arg(profile_id) AND profile_version = sqlc.arg(profile_version)
    AND (tenant_id = sqlc.arg(tenant_id) OR visibility = 'public')
ORDER BY (tenant_id = sqlc.arg(tenant_id)) DESC, tenant_id
LIMIT 1;

-- name: LookupLatestProfile :one
-- The latest version a tenant sees: its own latest when it has any
-- version, else the latest public one.
SELECT * FROM profiles
WHERE profile_id = sqlc.arg(profile_id) AND (tenant_id = sqlc.arg(tenant_id) OR visibility = 'public')
ORDER BY (tenant_id = sqlc.arg(tenant_id)) DESC, profile_version DESC, tenant_id
LIMIT 1;

-- name: GetOwnProfileForUpdate :one
SELECT * FROM profiles
WHERE tenant_id = sqlc.arg(tenant_id) AND profile_id = sqlc.arg(profile_id) AND profile_version = sqlc.arg(profile_version)
FOR UPDATE;

-- name: ListProfilesFrom :many
-- A page of what a tenant sees (its own and public versions) from the
-- position (profile_id, profile_version) on, in list order.
SELECT * FROM profiles
WHERE (tenant_id = sqlc.arg(tenant_id) OR visibility = 'public')
    AND (profile_id, profile_version) >= (sqlc.arg(profile_id)::text COLLATE "C", sqlc.arg(profile_version)::integer)
ORDER BY profile_id, profile_version, tenant_id
LIMIT sqlc.arg(max_rows);

-- name: UpdateProfile :one
UPDATE profiles SET document = sqlc.arg(document), visibility = sqlc.arg(visibility), version = version + 1, updated_at = now()
WHERE tenant_id = sqlc.arg(tenant_id) AND profile_id = sqlc.arg(profile_id) AND profile_version = sqlc.arg(profile_version)
RETURNING *;

-- name: LockProfile :execrows
-- The first use by a workflow makes the version's document immutable.
UPDATE profiles SET locked_at = coalesce(locked_at, now())
WHERE tenant_id = sqlc.arg(tenant_id) AND profile_id = sqlc.arg(profile_id) AND profile_version = sqlc.arg(profile_version);

-- name: DeleteProfileVersion :execrows
DELETE FROM profiles
WHERE tenant_id = sqlc.arg(tenant_id) AND profile_id = sqlc.arg(profile_id) AND profile_version = sqlc.arg(profile_version);

-- name: DeleteProfileVersions :execrows
DELETE FROM profiles WHERE tenant_id = sqlc.arg(tenant_id) AND profile_id = sqlc.arg(profile_id);
