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
    state = CASE WHEN sqlc.arg(desired_state)::text = 'deleted' AND node_id IS NULL AND provider_machine IS NULL THEN 'deleted' ELSE state END,
    -- A provider instance's machine is released by the provider-instances job, at once.
    provider_next_at = CASE WHEN sqlc.arg(desired_state)::text = 'deleted' AND provider_machine IS NOT NULL THEN now() ELSE provider_next_at END,
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

-- name: InsertProviderInstance :one
-- An instance of a provider pool: no node; the provider-instances job
-- launches its machine (due at once).
INSERT INTO instances (instance_id, tenant_id, pool_id, flavor, image_id, boot, name, user_data,
    vcpu, memory_mib, disk_gib, desired_state, state, created_by, idem_request, provider_next_at)
VALUES (sqlc.arg(instance_id), sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(flavor),
    sqlc.arg(image_id), sqlc.arg(boot), sqlc.arg(name), sqlc.narg(user_data), sqlc.arg(vcpu), sqlc.arg(memory_mib),
    sqlc.arg(disk_gib), 'running', 'pending', sqlc.arg(created_by), sqlc.arg(idem_request), now())
ON CONFLICT (instance_id) DO NOTHING
RETURNING *;

-- name: DueProviderInstances :many
-- Provider instances whose next step is due, oldest first.
SELECT * FROM instances
WHERE provider_next_at IS NOT NULL AND provider_next_at <= now()
ORDER BY provider_next_at
LIMIT sqlc.arg(lim);

-- name: SaveProviderInstance :one
-- What the provider-instances job found, on a row still as it read it
-- (version): a concurrent delete makes it read again.
UPDATE instances SET state = sqlc.arg(state), error = sqlc.narg(error),
    provider_machine = sqlc.narg(provider_machine), provider_offer = sqlc.narg(provider_offer),
    provider_attempts = sqlc.arg(provider_attempts), provider_next_at = sqlc.narg(provider_next_at),
    ready_at = CASE WHEN sqlc.arg(state)::text = 'running' THEN coalesce(ready_at, now()) ELSE ready_at END,
    deleted_at = CASE WHEN sqlc.arg(state)::text = 'deleted' THEN coalesce(deleted_at, now()) ELSE deleted_at END,
    version = version + 1, updated_at = now()
WHERE instance_id = sqlc.arg(instance_id) AND version = sqlc.arg(version)
RETURNING *;

-- name: RecordProviderLaunch :one
-- A launched machine, recorded whatever happened to the row meanwhile: a
-- deleted instance keeps it for the job to release at once.
UPDATE instances SET provider_machine = sqlc.arg(provider_machine), provider_offer = sqlc.arg(provider_offer),
    provider_attempts = 0, error = NULL,
    state = CASE WHEN desired_state = 'deleted' THEN state ELSE 'running' END,
    ready_at = CASE WHEN desired_state = 'deleted' THEN ready_at ELSE coalesce(ready_at, now()) END,
    provider_next_at = CASE WHEN desired_state = 'deleted' THEN now() ELSE now() + sqlc.arg(watch_every)::interval END,
    version = version + 1, updated_at = now()
WHERE instance_id = sqlc.arg(instance_id)
RETURNING *;
