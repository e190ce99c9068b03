-- name: InsertReservation :one
INSERT INTO reservations (reservation_id, tenant_id, pool_id, flavor, count, priority, whole, start_at, end_at, state,
    placement_items, waiting_for_preemption, created_by, idem_request)
VALUES (sqlc.arg(reservation_id), sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(flavor), sqlc.arg(count), sqlc.arg(priority),
    sqlc.arg(whole), sqlc.arg(start_at), sqlc.narg(end_at), sqlc.arg(state), sqlc.arg(placement_items), sqlc.arg(waiting_for_preemption),
    sqlc.arg(created_by), sqlc.arg(idem_request))
ON CONFLICT (reservation_id) DO NOTHING
RETURNING *;

-- name: GetReservation :one
SELECT * FROM reservations WHERE reservation_id = sqlc.arg(reservation_id);

-- name: GetReservationForUpdate :one
SELECT * FROM reservations WHERE reservation_id = sqlc.arg(reservation_id) FOR UPDATE;

-- name: ListReservations :many
SELECT * FROM reservations
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(pool_id)::text IS NULL OR pool_id = sqlc.narg(pool_id))
  AND (sqlc.narg(state)::text IS NULL OR state = sqlc.narg(state))
ORDER BY created_at DESC, reservation_id
LIMIT 1000;

-- name: SetReservationState :one
UPDATE reservations SET state = sqlc.arg(state), error = sqlc.narg(error), preempt_at = sqlc.narg(preempt_at),
    waiting_for_preemption = sqlc.arg(waiting_for_preemption), attempts = attempts + sqlc.arg(attempt)::integer, updated_at = now()
WHERE reservation_id = sqlc.arg(reservation_id)
RETURNING *;

-- ReservationNodes are the nodes of a reservation's live bookings.
-- name: ReservationNodes :many
SELECT DISTINCT node_id FROM bookings WHERE owner_type = 'reservation' AND owner_id = sqlc.arg(reservation_id) AND NOT released ORDER BY node_id;

-- name: ReservationBookings :many
SELECT booking_id FROM bookings WHERE owner_type = 'reservation' AND owner_id = sqlc.arg(reservation_id) AND NOT released ORDER BY booking_id;

-- SpotVictims are a pool's spot reservations holding capacity, newest
-- first: the first to be preempted.
-- name: SpotVictims :many
SELECT r.*, coalesce((SELECT sum(b.vcpu) FROM bookings b WHERE b.owner_type = 'reservation' AND b.owner_id = r.reservation_id AND NOT b.released), 0)::bigint AS vcpu,
       coalesce((SELECT sum(b.memory_mib) FROM bookings b WHERE b.owner_type = 'reservation' AND b.owner_id = r.reservation_id AND NOT b.released), 0)::bigint AS memory_mib,
       coalesce((SELECT count(*) FROM bookings b WHERE b.owner_type = 'reservation' AND b.owner_id = r.reservation_id AND NOT b.released AND b.whole), 0)::bigint AS whole_nodes
FROM reservations r
WHERE r.pool_id = sqlc.arg(pool_id) AND r.priority = 'spot' AND r.state IN ('placed', 'active')
ORDER BY r.created_at DESC
FOR UPDATE OF r SKIP LOCKED;

-- DueReservations are the live reservations with something to do now,
-- for the reservations job.
-- name: DueReservations :many
SELECT * FROM reservations
WHERE (state = 'queued')
   OR (state = 'placed' AND start_at <= now())
   OR (state IN ('placed', 'active') AND end_at <= now())
   OR (state = 'preempting' AND preempt_at <= now())
ORDER BY created_at
LIMIT 200
FOR UPDATE SKIP LOCKED;
