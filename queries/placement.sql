-- Placement: candidate nodes, bookings and quota charges. Every write is
-- conditional, and the tables' constraints refuse what a wrong condition
-- would let through (migrations/00011_fleet.sql).

-- name: PlacementCandidatesPack :many
-- Ready nodes of a live (unarchived) pool with room for the shape (vCPU:
-- within the allocatable figure, the pool's ratio applied) that offer the
-- VM network mode asked for (network: the hello's inventory.networks;
-- null asks none), least free
-- vCPU first (bin packing), at most lim of them: a walk of
-- nodes_placement_idx.
SELECT node_id, alloc_vcpu, cap_memory_mib, cap_disk_gib, cap_gpus,
       free_vcpu::integer AS free_vcpu, free_memory_mib::bigint AS free_memory_mib, (cap_disk_gib - booked_disk_gib)::bigint AS free_disk_gib, (cap_gpus - booked_gpus)::integer AS free_gpus
FROM nodes
WHERE nodes.pool_id = sqlc.arg(pool_id) AND state = 'ready'
  AND EXISTS (SELECT 1 FROM pools p WHERE p.pool_id = sqlc.arg(pool_id) AND NOT p.archived)
  AND free_vcpu >= sqlc.arg(vcpu)::integer AND free_memory_mib >= sqlc.arg(memory_mib)::bigint
  AND cap_disk_gib - booked_disk_gib >= sqlc.arg(disk_gib)::bigint AND cap_gpus - booked_gpus >= sqlc.arg(gpus)::integer
  AND (sqlc.narg(gpu_model)::text IS NULL OR gpu_model = sqlc.narg(gpu_model))
  AND (sqlc.narg(node_id)::text IS NULL OR node_id = sqlc.narg(node_id))
  AND (sqlc.narg(network)::text IS NULL OR coalesce(inventory->'networks', '[]'::jsonb) @> jsonb_build_array(sqlc.narg(network)::text))
  AND (NOT sqlc.arg(whole)::boolean OR (booked_vcpu = 0 AND booked_memory_mib = 0 AND booked_disk_gib = 0 AND booked_gpus = 0))
ORDER BY free_vcpu, node_id
LIMIT sqlc.arg(lim);

-- name: PlacementCandidatesSpread :many
-- As PlacementCandidatesPack, most free vCPU first (spreading).
SELECT node_id, alloc_vcpu, cap_memory_mib, cap_disk_gib, cap_gpus,
       free_vcpu::integer AS free_vcpu, free_memory_mib::bigint AS free_memory_mib, (cap_disk_gib - booked_disk_gib)::bigint AS free_disk_gib, (cap_gpus - booked_gpus)::integer AS free_gpus
FROM nodes
WHERE nodes.pool_id = sqlc.arg(pool_id) AND state = 'ready'
  AND EXISTS (SELECT 1 FROM pools p WHERE p.pool_id = sqlc.arg(pool_id) AND NOT p.archived)
  AND free_vcpu >= sqlc.arg(vcpu)::integer AND free_memory_mib >= sqlc.arg(memory_mib)::bigint
  AND cap_disk_gib - booked_disk_gib >= sqlc.arg(disk_gib)::bigint AND cap_gpus - booked_gpus >= sqlc.arg(gpus)::integer
  AND (sqlc.narg(gpu_model)::text IS NULL OR gpu_model = sqlc.narg(gpu_model))
  AND (sqlc.narg(node_id)::text IS NULL OR node_id = sqlc.narg(node_id))
  AND (sqlc.narg(network)::text IS NULL OR coalesce(inventory->'networks', '[]'::jsonb) @> jsonb_build_array(sqlc.narg(network)::text))
  AND (NOT sqlc.arg(whole)::boolean OR (booked_vcpu = 0 AND booked_memory_mib = 0 AND booked_disk_gib = 0 AND booked_gpus = 0))
ORDER BY free_vcpu DESC, node_id DESC
LIMIT sqlc.arg(lim);

-- name: PlacementCandidatesPackOfFlavor :many
-- As PlacementCandidatesPack, the shape being a flavor of the pool read in
-- the same statement (each scalar subquery is evaluated once, as a
-- parameter, so the walk of nodes_placement_idx is the same): a create
-- queues it with its pool and flavor read, before it knows the shape. No
-- flavor, no row.
SELECT node_id, alloc_vcpu, cap_memory_mib, cap_disk_gib, cap_gpus,
       free_vcpu::integer AS free_vcpu, free_memory_mib::bigint AS free_memory_mib, (cap_disk_gib - booked_disk_gib)::bigint AS free_disk_gib, (cap_gpus - booked_gpus)::integer AS free_gpus
FROM nodes
WHERE nodes.pool_id = sqlc.arg(pool_id) AND state = 'ready'
  AND EXISTS (SELECT 1 FROM pools p WHERE p.pool_id = sqlc.arg(pool_id) AND NOT p.archived)
  AND free_vcpu >= (SELECT f.vcpu FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND free_memory_mib >= (SELECT f.memory_mib FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND cap_disk_gib - booked_disk_gib >= (SELECT f.disk_gib FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND cap_gpus - booked_gpus >= (SELECT f.gpus FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND ((SELECT f.gpu_model FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor)) IS NULL
       OR gpu_model = (SELECT f.gpu_model FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor)))
  AND (sqlc.narg(network)::text IS NULL OR coalesce(inventory->'networks', '[]'::jsonb) @> jsonb_build_array(sqlc.narg(network)::text))
ORDER BY free_vcpu, node_id
LIMIT sqlc.arg(lim);

-- name: PlacementCandidatesSpreadOfFlavor :many
-- As PlacementCandidatesPackOfFlavor, most free vCPU first (spreading).
SELECT node_id, alloc_vcpu, cap_memory_mib, cap_disk_gib, cap_gpus,
       free_vcpu::integer AS free_vcpu, free_memory_mib::bigint AS free_memory_mib, (cap_disk_gib - booked_disk_gib)::bigint AS free_disk_gib, (cap_gpus - booked_gpus)::integer AS free_gpus
FROM nodes
WHERE nodes.pool_id = sqlc.arg(pool_id) AND state = 'ready'
  AND EXISTS (SELECT 1 FROM pools p WHERE p.pool_id = sqlc.arg(pool_id) AND NOT p.archived)
  AND free_vcpu >= (SELECT f.vcpu FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND free_memory_mib >= (SELECT f.memory_mib FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND cap_disk_gib - booked_disk_gib >= (SELECT f.disk_gib FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND cap_gpus - booked_gpus >= (SELECT f.gpus FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor))
  AND ((SELECT f.gpu_model FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor)) IS NULL
       OR gpu_model = (SELECT f.gpu_model FROM flavors f WHERE f.pool_id = sqlc.arg(pool_id) AND f.name = sqlc.arg(flavor)))
  AND (sqlc.narg(network)::text IS NULL OR coalesce(inventory->'networks', '[]'::jsonb) @> jsonb_build_array(sqlc.narg(network)::text))
ORDER BY free_vcpu DESC, node_id DESC
LIMIT sqlc.arg(lim);

-- name: BookNode :execrows
-- Adds a booking's amounts to a node if they still fit (a whole-node
-- booking only on an empty node) and writes the booking, in one statement.
-- A node another admission holds is skipped, never waited for: an UPDATE
-- that waits and then finds the row no longer matches keeps it locked, and
-- two admissions each holding one node while waiting for the other's would
-- deadlock.
WITH booked AS (
    UPDATE nodes SET
        booked_vcpu = booked_vcpu + sqlc.arg(vcpu)::integer,
        booked_memory_mib = booked_memory_mib + sqlc.arg(memory_mib)::bigint,
        booked_disk_gib = booked_disk_gib + sqlc.arg(disk_gib)::bigint,
        booked_gpus = booked_gpus + sqlc.arg(gpus)::integer,
        updated_at = now()
    WHERE node_id = (SELECT l.node_id FROM nodes l WHERE l.node_id = sqlc.arg(node_id) FOR NO KEY UPDATE SKIP LOCKED)
      AND state = 'ready'
      AND free_vcpu >= sqlc.arg(vcpu)::integer AND free_memory_mib >= sqlc.arg(memory_mib)::bigint
      AND cap_disk_gib - booked_disk_gib >= sqlc.arg(disk_gib)::bigint AND cap_gpus - booked_gpus >= sqlc.arg(gpus)::integer
      AND (NOT sqlc.arg(whole)::boolean OR (booked_vcpu = 0 AND booked_memory_mib = 0 AND booked_disk_gib = 0 AND booked_gpus = 0))
    RETURNING node_id
)
INSERT INTO bookings (booking_id, node_id, pool_id, tenant_id, owner_type, owner_id, whole,
                      vcpu, memory_mib, disk_gib, gpus, during)
SELECT sqlc.arg(booking_id), booked.node_id, sqlc.arg(pool_id), sqlc.arg(tenant_id), sqlc.arg(owner_type),
       sqlc.arg(owner_id), sqlc.arg(whole), sqlc.arg(vcpu), sqlc.arg(memory_mib), sqlc.arg(disk_gib), sqlc.arg(gpus),
       tstzrange(now(), sqlc.narg(until)::timestamptz)
FROM booked;

-- name: ReleaseBooking :one
-- Closes a live booking's range now, gives its amounts back to its node and
-- returns what it held, in one statement. The booking's row is locked
-- before the node's (the node's UPDATE joins the booking's RETURNING), the
-- order BookNode's admission and a second release of the booking take.
WITH released AS (
    UPDATE bookings SET released = true, during = tstzrange(lower(during), greatest(lower(during), now()))
    WHERE booking_id = sqlc.arg(booking_id) AND NOT released
    RETURNING node_id, pool_id, tenant_id, owner_type, owner_id, whole, vcpu, memory_mib, disk_gib, gpus
), unbooked AS (
    UPDATE nodes n SET
        booked_vcpu = n.booked_vcpu - r.vcpu,
        booked_memory_mib = n.booked_memory_mib - r.memory_mib,
        booked_disk_gib = n.booked_disk_gib - r.disk_gib,
        booked_gpus = n.booked_gpus - r.gpus,
        updated_at = now()
    FROM released r
    WHERE n.node_id = r.node_id
)
SELECT node_id, pool_id, tenant_id, owner_type, owner_id, whole, vcpu, memory_mib, disk_gib, gpus FROM released;

-- name: ChargeQuotas :many
-- An admission's charges in one statement: adds amounts[i] to the tenant's
-- used of resources[i] in a pool where it stays within max and the pool is
-- still offered to the tenant, and returns the position (1-based) of each
-- charge made: a position missing is a charge refused (no row, no longer
-- offered, or max reached), which the caller answers by rolling back. The
-- rows are locked first in the arrays' order (the callers send them in the
-- order of placement.Resources, as RefundQuotas locks them), so that
-- concurrent admissions and releases lock a tenant's rows in one order.
WITH asked AS (
    SELECT i AS ord, (sqlc.arg(resources)::text[])[i] AS resource, (sqlc.arg(amounts)::bigint[])[i] AS amount
    FROM generate_subscripts(sqlc.arg(resources)::text[], 1) AS i
), locked AS MATERIALIZED (
    SELECT q.resource, a.amount, a.ord
    FROM quotas q JOIN asked a ON a.resource = q.resource
    WHERE q.tenant_id = sqlc.arg(tenant_id) AND q.pool_id = sqlc.arg(pool_id)
    ORDER BY a.ord
    FOR UPDATE OF q
)
UPDATE quotas q SET used = q.used + l.amount, updated_at = now()
FROM locked l
WHERE q.tenant_id = sqlc.arg(tenant_id) AND q.pool_id = sqlc.arg(pool_id) AND q.resource = l.resource
  AND q.offered AND q.used + l.amount <= q.max
RETURNING l.ord AS charged;

-- name: RefundQuotas :exec
-- Gives back charges in one statement: subtracts amounts[i] from the
-- tenant's used of resources[i] in a pool. The rows are locked first in the
-- arrays' order, as ChargeQuotas locks them (the callers send both in the
-- order of placement.Resources), so that a refund and a charge of one
-- tenant never wait for each other in a cycle. A resource with no row
-- refunds nothing; a refund past what is used fails the statement (the
-- table's CHECK: used is never below 0).
WITH asked AS (
    SELECT i AS ord, (sqlc.arg(resources)::text[])[i] AS resource, (sqlc.arg(amounts)::bigint[])[i] AS amount
    FROM generate_subscripts(sqlc.arg(resources)::text[], 1) AS i
), locked AS MATERIALIZED (
    SELECT q.resource, a.amount, a.ord
    FROM quotas q JOIN asked a ON a.resource = q.resource
    WHERE q.tenant_id = sqlc.arg(tenant_id) AND q.pool_id = sqlc.arg(pool_id)
    ORDER BY a.ord
    FOR UPDATE OF q
)
UPDATE quotas q SET used = q.used - l.amount, updated_at = now()
FROM locked l
WHERE q.tenant_id = sqlc.arg(tenant_id) AND q.pool_id = sqlc.arg(pool_id) AND q.resource = l.resource;

-- name: GetQuota :one
SELECT tenant_id, pool_id, resource, max, used, offered FROM quotas
WHERE tenant_id = sqlc.arg(tenant_id) AND pool_id = sqlc.arg(pool_id) AND resource = sqlc.arg(resource);

-- name: EnqueuePlacement :exec
INSERT INTO placement_queue (item_id, pool_id, tenant_id, request)
VALUES (sqlc.arg(item_id), sqlc.arg(pool_id), sqlc.arg(tenant_id), sqlc.arg(request));

-- name: ClaimQueued :many
-- The oldest queued items of a pool, locked for one batch.
SELECT item_id, request, attempts FROM placement_queue
WHERE pool_id = sqlc.arg(pool_id) AND state = 'queued'
ORDER BY created_at, item_id
LIMIT sqlc.arg(lim)
FOR UPDATE SKIP LOCKED;

-- name: DecidePlacement :exec
UPDATE placement_queue SET state = sqlc.arg(state), attempts = attempts + 1, booking_id = sqlc.narg(booking_id),
    node_id = sqlc.narg(node_id), error = sqlc.narg(error),
    decided_at = CASE WHEN sqlc.arg(state) = 'queued' THEN NULL ELSE now() END
WHERE item_id = sqlc.arg(item_id);

-- name: GetPlacement :one
SELECT * FROM placement_queue WHERE item_id = sqlc.arg(item_id);

-- name: QueuedPools :many
SELECT DISTINCT pool_id FROM placement_queue WHERE state = 'queued';

-- name: PoolNodesOffering :one
-- How many ready nodes of a pool offer a VM network mode (their hello's
-- inventory.networks): a refusal says whether room or the mode is missing.
SELECT count(*) FROM nodes
WHERE pool_id = sqlc.arg(pool_id) AND state = 'ready'
  AND coalesce(inventory->'networks', '[]'::jsonb) @> jsonb_build_array(sqlc.arg(network)::text);

-- name: NodeOffers :one
-- Whether a node offers a VM network mode (its hello's inventory.networks).
SELECT (coalesce(inventory->'networks', '[]'::jsonb) @> jsonb_build_array(sqlc.arg(network)::text))::boolean AS offers
FROM nodes WHERE node_id = sqlc.arg(node_id);
