-- RegisterWorker adds the worker's row, or restarts a row of the same id.
-- name: RegisterWorker :exec
INSERT INTO workers (id, host, pid, jobs, reconcilers, started_at, heartbeat_at)
SELECT sqlc.arg(id)::text, sqlc.arg(host)::text, sqlc.arg(pid)::int, sqlc.arg(jobs)::text[], sqlc.arg(reconcilers)::text[], t.now, t.now
FROM (SELECT coalesce(sqlc.narg('now')::timestamptz, now()) AS now) t
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, jobs = excluded.jobs, reconcilers = excluded.reconcilers,
    started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at;

-- HeartbeatWorker marks the worker alive; it puts the row back if another
-- worker deleted it as stale (this one was paused for a long time).
-- name: HeartbeatWorker :exec
INSERT INTO workers (id, host, pid, jobs, reconcilers, started_at, heartbeat_at)
SELECT sqlc.arg(id)::text, sqlc.arg(host)::text, sqlc.arg(pid)::int, sqlc.arg(jobs)::text[], sqlc.arg(reconcilers)::text[], t.now, t.now
FROM (SELECT coalesce(sqlc.narg('now')::timestamptz, now()) AS now) t
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at;

-- name: DeleteWorker :exec
DELETE FROM workers WHERE id = sqlc.arg(id);

-- DeleteStaleWorkers removes the rows of workers silent for older_than_ms
-- (killed processes).
-- name: DeleteStaleWorkers :exec
DELETE FROM workers
WHERE heartbeat_at < coalesce(sqlc.narg('now')::timestamptz, now()) - make_interval(secs => sqlc.arg(older_than_ms)::bigint / 1000.0);

-- ListLiveWorkers lists the workers whose heartbeat is younger than
-- live_ms; responsive marks those younger than responsive_ms.
-- name: ListLiveWorkers :many
SELECT w.id, w.jobs, w.reconcilers, w.heartbeat_at,
       (w.heartbeat_at > t.now - make_interval(secs => sqlc.arg(responsive_ms)::bigint / 1000.0))::boolean AS responsive
FROM workers w, (SELECT coalesce(sqlc.narg('now')::timestamptz, now()) AS now) t
WHERE w.heartbeat_at > t.now - make_interval(secs => sqlc.arg(live_ms)::bigint / 1000.0)
ORDER BY w.id;

-- AcquireLease takes the lease when it is free or expired, raising its
-- epoch; no row when another holder has it.
-- name: AcquireLease :one
INSERT INTO leases AS l (name, holder, epoch, acquired_at, expires_at)
SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text, 1, t.now, t.now + make_interval(secs => sqlc.arg(ttl_ms)::bigint / 1000.0)
FROM (SELECT coalesce(sqlc.narg('now')::timestamptz, now()) AS now) t
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, epoch = l.epoch + 1, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE l.expires_at <= excluded.acquired_at
RETURNING l.epoch, l.expires_at;

-- RenewLeases extends the leases the holder still has at the same epoch
-- (epochs[i] is the epoch of names[i]) and returns those; a lease missing
-- from the result is lost.
-- name: RenewLeases :many
UPDATE leases l
SET expires_at = coalesce(sqlc.narg('now')::timestamptz, now()) + make_interval(secs => sqlc.arg(ttl_ms)::bigint / 1000.0)
WHERE l.name = ANY(sqlc.arg(names)::text[])
  AND l.epoch = (sqlc.arg(epochs)::bigint[])[array_position(sqlc.arg(names)::text[], l.name)]
  AND l.holder = sqlc.arg(holder)::text
RETURNING l.name, l.epoch, l.expires_at;

-- ReleaseLeases frees the leases the holder still has at the same epoch.
-- name: ReleaseLeases :exec
UPDATE leases l
SET expires_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE l.name = ANY(sqlc.arg(names)::text[])
  AND l.epoch = (sqlc.arg(epochs)::bigint[])[array_position(sqlc.arg(names)::text[], l.name)]
  AND l.holder = sqlc.arg(holder)::text
  AND l.expires_at > coalesce(sqlc.narg('now')::timestamptz, now());

-- FenceLease locks the lease row against takeover until the caller's
-- transaction ends, provided the holder still has it at that epoch and it
-- has not expired. The default time is clock_timestamp(), not now(): the
-- caller's transaction may have started long before.
-- name: FenceLease :one
SELECT epoch FROM leases
WHERE name = sqlc.arg(name) AND holder = sqlc.arg(holder) AND epoch = sqlc.arg(epoch)
  AND expires_at > coalesce(sqlc.narg('now')::timestamptz, clock_timestamp())
FOR SHARE;

-- name: ListLeases :many
SELECT name, holder, epoch, acquired_at, expires_at,
       (expires_at > coalesce(sqlc.narg('now')::timestamptz, now()))::boolean AS active
FROM leases
ORDER BY name;

-- Notify sends one notification per topic on channel, in one statement
-- (one transaction, so one commit of the notification queue) for the batch.
-- name: Notify :exec
SELECT pg_notify(sqlc.arg(channel)::text, t) FROM unnest(sqlc.arg(topics)::text[]) AS t;

-- ListWorkers lists every registered worker with whether it is live, for
-- the self check.
-- name: ListWorkers :many
SELECT id, host, pid, heartbeat_at,
       (heartbeat_at > coalesce(sqlc.narg('now')::timestamptz, now()) - interval '30 seconds')::boolean AS live
FROM workers
ORDER BY id;

-- ReleaseHolder frees every lease the holder still has, whatever its
-- epoch: a stopping worker's last word, which also covers a lease whose
-- acquisition committed while the worker was cancelling it.
-- name: ReleaseHolder :exec
UPDATE leases SET expires_at = now() WHERE holder = sqlc.arg(holder) AND expires_at > now();
