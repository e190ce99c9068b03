-- name: InsertSandboxVolume :one
INSERT INTO sandbox_volumes (volume_id, tenant_id, pool_id, node_id, name, size_gib, serial, state, created_by, idem_request)
VALUES (sqlc.arg(volume_id), sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(node_id), sqlc.arg(name), sqlc.arg(size_gib),
    sqlc.arg(serial), 'ready', sqlc.arg(created_by), sqlc.arg(idem_request))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetSandboxVolume :one
SELECT * FROM sandbox_volumes WHERE volume_id = sqlc.arg(volume_id);

-- name: TryVolumeResizeLock :one
-- Takes the volume's resize lock for the transaction without waiting:
-- false while another resize of the volume holds it. Only resizes take it,
-- so a delete or a status report holding the volume's row is no resize
-- in flight.
SELECT pg_try_advisory_xact_lock(hashtextextended('sandbox-volume-resize/' || sqlc.arg(volume_id)::text, 0))::boolean;

-- name: GetSandboxVolumeForUpdate :one
SELECT * FROM sandbox_volumes WHERE volume_id = sqlc.arg(volume_id) FOR UPDATE;

-- name: SandboxVolumeNameTaken :one
SELECT EXISTS (SELECT 1 FROM sandbox_volumes WHERE tenant_id = sqlc.arg(tenant_id) AND name = sqlc.arg(name) AND state <> 'deleted')::boolean;

-- name: ListSandboxVolumes :many
SELECT * FROM sandbox_volumes
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(created_by)::text IS NULL OR created_by = sqlc.narg(created_by))
  AND (sqlc.narg(pool_id)::text IS NULL OR pool_id = sqlc.narg(pool_id))
  AND (sqlc.arg(include_deleted)::boolean OR state <> 'deleted')
ORDER BY created_at, volume_id
LIMIT 500;

-- name: SetSandboxVolumeSize :one
UPDATE sandbox_volumes SET size_gib = sqlc.arg(size_gib), sized_at = now(), updated_at = now()
WHERE volume_id = sqlc.arg(volume_id)
RETURNING *;

-- name: SetSandboxVolumeState :one
UPDATE sandbox_volumes SET state = sqlc.arg(state), updated_at = now()
WHERE volume_id = sqlc.arg(volume_id)
RETURNING *;

-- NodeVolumes are the volumes a node's spec carries.
-- name: NodeVolumes :many
SELECT * FROM sandbox_volumes WHERE node_id = sqlc.arg(node_id) AND state = 'ready' ORDER BY volume_id;

-- VolumeHosts are a pool's ready hosts that reported a volume store, with
-- what it can still take: available minus reserved minus outstanding
-- (bytes), less the volumes booked there and not reported since (created
-- or grown after the report), most room first.
-- name: VolumeHosts :many
SELECT n.node_id,
    (n.volume_available_bytes - n.volume_reserved_bytes - n.volume_outstanding_bytes
     - coalesce((SELECT sum(v.size_gib) * 1073741824 FROM sandbox_volumes v
                 WHERE v.node_id = n.node_id AND v.state = 'ready' AND v.sized_at > n.volume_reported_at), 0))::bigint AS free_bytes
FROM nodes n
WHERE n.pool_id = sqlc.arg(pool_id) AND n.state = 'ready' AND n.volume_reported_at IS NOT NULL
  AND (sqlc.narg(node_id)::text IS NULL OR n.node_id = sqlc.narg(node_id))
ORDER BY free_bytes DESC, n.node_id;

-- GoneVolumes marks deleted the deleting volumes of a node the daemon no
-- longer reports.
-- name: GoneVolumes :many
UPDATE sandbox_volumes SET state = 'deleted', updated_at = now()
WHERE node_id = sqlc.arg(node_id) AND state = 'deleting' AND NOT (serial = ANY(sqlc.arg(reported)::text[]))
RETURNING *;

-- name: VolumeBookings :many
SELECT booking_id FROM bookings WHERE owner_type = 'sandbox-volume' AND owner_id = sqlc.arg(volume_id) AND NOT released ORDER BY booking_id;
