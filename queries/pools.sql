-- name: InsertPool :one
-- A row for the id exists already when this is a retry: nothing is written
-- and no row returns.
INSERT INTO pools (pool_id, tenant_id, site_id, name, class, hosting, account_id, runtime, agent, vcpu_allocation_ratio, created_by, idem_request)
VALUES (sqlc.arg(pool_id), sqlc.arg(tenant_id), sqlc.arg(site_id), sqlc.arg(name), sqlc.arg(class), sqlc.arg(hosting),
        sqlc.narg(account_id), sqlc.narg(runtime), sqlc.narg(agent), sqlc.arg(vcpu_allocation_ratio), sqlc.arg(created_by), sqlc.arg(idem_request))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetPool :one
SELECT * FROM pools WHERE pool_id = sqlc.arg(pool_id);

-- name: GetPoolForUpdate :one
SELECT * FROM pools WHERE pool_id = sqlc.arg(pool_id) FOR UPDATE;

-- name: PoolNameTaken :one
SELECT EXISTS (SELECT 1 FROM pools WHERE tenant_id = sqlc.arg(tenant_id) AND name = sqlc.arg(name)
               AND NOT archived AND pool_id <> sqlc.arg(pool_id))::boolean;

-- name: PoolOfferedTo :one
-- Whether a pool is offered to a tenant (that tenant has an offered quota
-- row in it).
SELECT EXISTS (SELECT 1 FROM quotas WHERE pool_id = sqlc.arg(pool_id) AND tenant_id = sqlc.arg(tenant_id) AND offered)::boolean;

-- name: ListPoolsOfTenant :many
-- Pools a tenant owns or is offered, in name order.
SELECT * FROM pools p
WHERE (p.tenant_id = sqlc.arg(tenant_id)
       OR EXISTS (SELECT 1 FROM quotas q WHERE q.pool_id = p.pool_id AND q.tenant_id = sqlc.arg(tenant_id) AND q.offered))
  AND (sqlc.arg(include_archived)::boolean OR NOT p.archived)
  AND (sqlc.narg(site_id)::text IS NULL OR p.site_id = sqlc.narg(site_id))
ORDER BY p.name, p.pool_id;

-- name: UpdatePool :one
UPDATE pools SET name = sqlc.arg(name), vcpu_allocation_ratio = sqlc.arg(vcpu_allocation_ratio), version = version + 1, updated_at = now()
WHERE pool_id = sqlc.arg(pool_id)
RETURNING *;

-- name: LockPoolNodes :many
-- A pool's nodes locked for a change of its ratio, each with the vCPU
-- booked on it and what it could take at the new ratio; waits for the
-- admissions booking them.
SELECT node_id, booked_vcpu, floor(cap_vcpu * sqlc.arg(vcpu_allocation_ratio)::numeric)::integer AS alloc_vcpu
FROM nodes WHERE pool_id = sqlc.arg(pool_id)
ORDER BY node_id
FOR NO KEY UPDATE;

-- name: SetPoolNodesRatio :exec
UPDATE nodes SET vcpu_allocation_ratio = sqlc.arg(vcpu_allocation_ratio), updated_at = now()
WHERE pool_id = sqlc.arg(pool_id);

-- name: ArchivePool :one
UPDATE pools SET archived = true, version = version + 1, updated_at = now()
WHERE pool_id = sqlc.arg(pool_id)
RETURNING *;

-- name: SetQuota :one
-- Writes a tenant's max for one resource of a pool and (re)opens the pool to
-- it; a max below what is used leaves the row unchanged and returns none.
INSERT INTO quotas (tenant_id, pool_id, resource, max, offered)
VALUES (sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(resource), sqlc.arg(max), true)
ON CONFLICT (tenant_id, pool_id, resource) DO UPDATE
SET max = excluded.max, offered = true, updated_at = now()
WHERE quotas.used <= excluded.max
RETURNING *;

-- name: UnofferPool :execrows
UPDATE quotas SET offered = false, updated_at = now()
WHERE pool_id = sqlc.arg(pool_id) AND tenant_id = sqlc.arg(tenant_id) AND offered;

-- name: SiteReferences :one
-- What still uses a site: live (unarchived pools, nodes not retired) and
-- any reference at all.
SELECT
    (EXISTS (SELECT 1 FROM pools p WHERE p.site_id = sqlc.arg(site_id) AND NOT p.archived)
     OR EXISTS (SELECT 1 FROM nodes n WHERE n.site_id = sqlc.arg(site_id) AND n.state <> 'retired'))::boolean AS live,
    (EXISTS (SELECT 1 FROM pools p WHERE p.site_id = sqlc.arg(site_id))
     OR EXISTS (SELECT 1 FROM nodes n WHERE n.site_id = sqlc.arg(site_id)))::boolean AS referenced;

-- name: SetQuotaMax :one
-- Sets a tenant's max for one resource of a pool, keeping whether it is
-- offered (a new row is); a max below what is used returns none.
INSERT INTO quotas (tenant_id, pool_id, resource, max, offered)
VALUES (sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(resource), sqlc.arg(max), true)
ON CONFLICT (tenant_id, pool_id, resource) DO UPDATE
SET max = excluded.max, updated_at = now()
WHERE quotas.used <= excluded.max
RETURNING *;

-- name: ListQuotas :many
-- Quota rows of a tenant (every pool, or one), or of every tenant in a pool
-- (all_tenants, for its owner).
SELECT * FROM quotas
WHERE (sqlc.arg(all_tenants)::boolean OR tenant_id = sqlc.arg(tenant_id))
  AND (sqlc.narg(pool_id)::text IS NULL OR pool_id = sqlc.narg(pool_id))
ORDER BY pool_id, tenant_id, resource;

-- name: InsertFlavor :one
INSERT INTO flavors (pool_id, name, vcpu, memory_mib, disk_gib, gpu_model, gpus)
VALUES (sqlc.arg(pool_id), sqlc.arg(name), sqlc.arg(vcpu), sqlc.arg(memory_mib), sqlc.arg(disk_gib), sqlc.narg(gpu_model), sqlc.arg(gpus))
ON CONFLICT (pool_id, name) DO NOTHING
RETURNING *;

-- name: GetFlavor :one
SELECT * FROM flavors WHERE pool_id = sqlc.arg(pool_id) AND name = sqlc.arg(name);

-- name: ListFlavors :many
SELECT * FROM flavors WHERE pool_id = sqlc.arg(pool_id) AND (sqlc.arg(include_archived)::boolean OR NOT archived)
ORDER BY name;

-- name: ArchiveFlavor :one
UPDATE flavors SET archived = true WHERE pool_id = sqlc.arg(pool_id) AND name = sqlc.arg(name)
RETURNING *;

-- PoolFlavor reads, in one statement, what a create in a pool needs
-- (instances, reservations): the pool, whether it is offered to tenant,
-- its flavor (NULLs when it has none of that name) and the transaction's
-- time.
-- name: PoolFlavor :one
SELECT sqlc.embed(p),
       EXISTS (SELECT 1 FROM quotas o WHERE o.pool_id = p.pool_id AND o.tenant_id = sqlc.arg(tenant_id) AND o.offered)::boolean AS offered,
       f.name AS flavor_name, f.vcpu AS flavor_vcpu, f.memory_mib AS flavor_memory_mib, f.disk_gib AS flavor_disk_gib,
       f.gpu_model AS flavor_gpu_model, f.gpus AS flavor_gpus, f.archived AS flavor_archived, f.created_at AS flavor_created_at,
       now()::timestamptz AS now
FROM pools p LEFT JOIN flavors f ON f.pool_id = p.pool_id AND f.name = sqlc.arg(flavor)
WHERE p.pool_id = sqlc.arg(pool_id);

-- name: Now :one
SELECT now()::timestamptz AS now;
