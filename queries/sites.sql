-- name: InsertSite :one
-- A row for the id exists already when this is a retry: nothing is written
-- and no row returns.
INSERT INTO sites (site_id, tenant_id, kind, region, iam_region, created_by, idem_request)
VALUES (sqlc.arg(site_id), sqlc.arg(tenant_id), sqlc.arg(kind), sqlc.arg(region), sqlc.narg(iam_region),
        sqlc.arg(created_by), sqlc.arg(idem_request))
ON CONFLICT (site_id) DO NOTHING
RETURNING *;

-- name: GetSite :one
SELECT * FROM sites WHERE site_id = sqlc.arg(site_id);

-- name: GetSiteForUpdate :one
SELECT * FROM sites WHERE site_id = sqlc.arg(site_id) FOR UPDATE;

-- name: ListSites :many
-- Sites visible to a tenant: its own and the root tenant's shared sites
-- (the root tenant sees all of its own), in id order after a position.
SELECT * FROM sites
WHERE NOT tombstoned
  AND (tenant_id = sqlc.arg(tenant_id) OR (tenant_id = sqlc.arg(root_tenant_id) AND kind = 'shared'))
  AND site_id > sqlc.arg(after_id)
  AND (sqlc.narg(kind)::text IS NULL OR kind = sqlc.narg(kind))
  AND (sqlc.narg(region)::text IS NULL OR region = sqlc.narg(region))
ORDER BY site_id
LIMIT sqlc.arg(max_rows);

-- name: UpdateSite :one
UPDATE sites
SET region = sqlc.arg(region), iam_region = sqlc.narg(iam_region), version = version + 1, updated_at = now()
WHERE site_id = sqlc.arg(site_id)
RETURNING *;

-- name: DeleteSite :exec
DELETE FROM sites WHERE site_id = sqlc.arg(site_id);

-- name: TombstoneSite :one
UPDATE sites SET tombstoned = true, version = version + 1, updated_at = now()
WHERE site_id = sqlc.arg(site_id)
RETURNING *;
