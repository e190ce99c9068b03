-- name: DatabaseNow :one
SELECT now()::timestamptz AS now;

-- name: ExtensionInstalled :one
SELECT EXISTS(SELECT 1 FROM pg_catalog.pg_extension WHERE extname = $1) AS installed;

-- AdvisoryLock waits for a session-level advisory lock; the session keeps it
-- until AdvisoryUnlock or until the connection closes.
-- name: AdvisoryLock :exec
SELECT pg_advisory_lock(sqlc.arg(lock_id)::bigint);

-- name: AdvisoryUnlock :one
SELECT pg_advisory_unlock(sqlc.arg(lock_id)::bigint) AS released;

-- AdvisoryXactLock waits for an advisory lock that the transaction releases
-- when it ends.
-- name: AdvisoryXactLock :exec
SELECT pg_advisory_xact_lock(sqlc.arg(lock_id)::bigint);
