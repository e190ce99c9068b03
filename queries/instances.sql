-- name: InsertInstance :one
INSERT INTO instances (instance_id, tenant_id, pool_id, node_id, booking_id, flavor, image_id, boot, name, user_data,
    vcpu, memory_mib, disk_gib, desired_state, state, created_by, idem_request, reservation_id, reservation_booking_id)
VALUES (sqlc.arg(instance_id), sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(node_id), sqlc.narg(booking_id), sqlc.arg(flavor),
    sqlc.arg(image_id), sqlc.arg(boot), sqlc.arg(name), sqlc.narg(user_data), sqlc.arg(vcpu), sqlc.arg(memory_mib),
    sqlc.arg(disk_gib), 'running', 'pending', sqlc.arg(created_by), sqlc.arg(idem_request),
    sqlc.narg(reservation_id), sqlc.narg(reservation_booking_id))
ON CONFLICT (instance_id) DO NOTHING
RETURNING *;

-- name: GetInstance :one
SELECT * FROM instances WHERE instance_id = sqlc.arg(instance_id);

-- name: GetInstanceForUpdate :one
SELECT * FROM instances WHERE instance_id = sqlc.arg(instance_id) FOR UPDATE;

-- name: ListInstances :many
SELECT * FROM instances
WHERE tenant_id = sqlc.arg(tenant_id) AND kind = 'vps'
  AND (sqlc.narg(pool_id)::text IS NULL OR pool_id = sqlc.narg(pool_id))
  AND (sqlc.arg(include_deleted)::boolean OR state <> 'deleted')
ORDER BY created_at DESC, instance_id
LIMIT 1000;

-- name: SetInstanceDesired :one
UPDATE instances SET desired_state = sqlc.arg(desired_state), reboots = reboots + sqlc.arg(reboot)::integer,
    state = CASE WHEN sqlc.arg(desired_state)::text = 'deleted' AND node_id IS NULL THEN 'deleted' ELSE state END,
    deleted_at = CASE WHEN sqlc.arg(desired_state)::text = 'deleted' THEN coalesce(deleted_at, now()) ELSE deleted_at END,
    version = version + 1, updated_at = now()
WHERE instance_id = sqlc.arg(instance_id)
RETURNING *;

-- NodeInstances are the instances a node's spec carries: every one not
-- yet gone from the host.
-- name: NodeInstances :many
SELECT * FROM instances WHERE node_id = sqlc.arg(node_id) AND state <> 'deleted' ORDER BY instance_id;

-- ReportInstances writes what a node's status says of its instances, in
-- one statement (a node may run many): an empty error or host_timings
-- stands for none. Only the rows that changed come back. A sandbox's VM
-- (memory_file) is ready when it runs with the identity generation it was
-- given (reported_identity).
-- name: ReportInstances :many
UPDATE instances i SET state = r.state, error = NULLIF(r.error, ''), reported_identity = r.reported_identity,
    host_timings = coalesce(NULLIF(r.host_timings, '')::jsonb, i.host_timings),
    ready_at = CASE WHEN r.state = 'running' THEN coalesce(i.ready_at, now()) ELSE i.ready_at END,
    identity_ready_at = CASE WHEN r.state = 'running' AND r.reported_identity = i.identity_generation
        THEN coalesce(i.identity_ready_at, now()) ELSE i.identity_ready_at END,
    updated_at = now()
FROM (SELECT unnest(sqlc.arg(instance_ids)::text[]) AS instance_id, unnest(sqlc.arg(states)::text[]) AS state,
             unnest(sqlc.arg(errors)::text[]) AS error, unnest(sqlc.arg(reported_identities)::bigint[]) AS reported_identity,
             unnest(sqlc.arg(host_timings)::text[]) AS host_timings) r
WHERE i.instance_id = r.instance_id AND i.node_id = sqlc.arg(node_id) AND i.state <> 'deleted'
  AND (i.state <> r.state OR i.error IS DISTINCT FROM NULLIF(r.error, '') OR i.reported_identity <> r.reported_identity
       OR (r.host_timings <> '' AND i.host_timings IS DISTINCT FROM r.host_timings::jsonb))
RETURNING i.*;

-- GoneInstances marks deleted the instances asked deleted that the
-- daemon no longer reports.
-- name: GoneInstances :many
UPDATE instances SET state = 'deleted', updated_at = now()
WHERE node_id = sqlc.arg(node_id) AND desired_state = 'deleted' AND state <> 'deleted'
  AND NOT (instance_id = ANY(sqlc.arg(reported)::text[]))
RETURNING instance_id;

-- FreeReservationUnit is a unit (booking) of a reservation no live
-- instance runs in, with the node it is on; the caller holds the
-- reservation's row lock, so two creates never take the same unit.
-- name: FreeReservationUnit :one
SELECT b.booking_id, b.node_id, b.vcpu, b.memory_mib, b.disk_gib, b.gpus FROM bookings b
WHERE b.owner_type = 'reservation' AND b.owner_id = sqlc.arg(reservation_id) AND NOT b.released
  AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.reservation_booking_id = b.booking_id AND i.desired_state <> 'deleted')
ORDER BY b.booking_id
LIMIT 1;

-- ReservationInstances are the live instances running in a reservation.
-- name: ReservationInstances :many
SELECT * FROM instances WHERE reservation_id = sqlc.arg(reservation_id) AND desired_state <> 'deleted' ORDER BY instance_id FOR UPDATE;
