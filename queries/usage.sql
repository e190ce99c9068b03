-- OpenAllocations opens several allocations (one owner's meters) in one
-- statement; the arrays go in parallel, one row per index, and a project
-- of '' is none. It returns nothing: the caller made the ids, and the write
-- travels with the call's next statement (store.Later).
-- name: OpenAllocations :exec
INSERT INTO allocations (allocation_id, tenant_id, project_id, meter, quantity_micro, tags, owner_type, owner_id, started_at, rolled_until)
SELECT a.allocation_id, a.tenant_id, nullif(a.project_id, ''), a.meter, a.quantity_micro, a.tags::jsonb, a.owner_type, a.owner_id,
       coalesce(sqlc.narg(at)::timestamptz, now()), date_trunc('hour', coalesce(sqlc.narg(at)::timestamptz, now()))
FROM (
    SELECT unnest(sqlc.arg(allocation_ids)::text[]) AS allocation_id, unnest(sqlc.arg(tenant_ids)::text[]) AS tenant_id,
        unnest(sqlc.arg(project_ids)::text[]) AS project_id, unnest(sqlc.arg(meters)::text[]) AS meter,
        unnest(sqlc.arg(quantities_micro)::bigint[]) AS quantity_micro, unnest(sqlc.arg(tags)::text[]) AS tags,
        unnest(sqlc.arg(owner_types)::text[]) AS owner_type, unnest(sqlc.arg(owner_ids)::text[]) AS owner_id
) a;

-- name: CloseAllocation :one
-- Ends an open allocation at at (the transaction's time by default), never
-- before it started.
UPDATE allocations SET ended_at = greatest(started_at, coalesce(sqlc.narg(at)::timestamptz, now())), dirty = true
WHERE allocation_id = sqlc.arg(allocation_id) AND ended_at IS NULL
RETURNING *;

-- name: GetAllocation :one
SELECT * FROM allocations WHERE allocation_id = sqlc.arg(allocation_id);

-- name: CloseAllocationsOf :exec
-- Ends every open allocation of an owner at at (the transaction's time by
-- default), each never before it started, in one statement.
UPDATE allocations SET ended_at = greatest(started_at, coalesce(sqlc.narg(at)::timestamptz, now())), dirty = true
WHERE owner_type = sqlc.arg(owner_type) AND owner_id = sqlc.arg(owner_id) AND ended_at IS NULL;

-- name: TenantsToRoll :many
-- Tenants with allocations the rollup has hours or changes to window for,
-- or counted rows of closed hours not windowed in full.
SELECT tenant_id FROM allocations
WHERE dirty OR (ended_at IS NULL AND rolled_until < sqlc.arg(horizon)::timestamptz)
UNION
SELECT tenant_id FROM counted_usage WHERE quantity > windowed AND hour_start < sqlc.arg(horizon)::timestamptz;

-- name: AllocationsToRoll :many
SELECT * FROM allocations
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (dirty OR (ended_at IS NULL AND rolled_until < sqlc.arg(horizon)::timestamptz))
ORDER BY allocation_id
FOR UPDATE;

-- name: WindowSums :many
-- What the windows of an allocation already hold per hour, adjustments
-- included, and the highest adjustment number per hour.
SELECT window_start, sum(quantity_micro_ms)::bigint AS quantity_micro_ms, max(adjustment)::integer AS last_adjustment
FROM usage_windows WHERE allocation_id = sqlc.arg(allocation_id)
GROUP BY window_start;

-- name: InsertWindow :exec
INSERT INTO usage_windows (key, allocation_id, tenant_id, project_id, meter, window_start, window_end, quantity_micro_ms, tags, adjustment)
VALUES (sqlc.arg(key), sqlc.arg(allocation_id), sqlc.arg(tenant_id), sqlc.narg(project_id), sqlc.arg(meter),
        sqlc.arg(window_start), sqlc.arg(window_end), sqlc.arg(quantity_micro_ms), sqlc.arg(tags), sqlc.arg(adjustment))
ON CONFLICT DO NOTHING;

-- name: MarkRolled :exec
UPDATE allocations SET rolled_until = sqlc.arg(rolled_until), dirty = false WHERE allocation_id = sqlc.arg(allocation_id);

-- name: PendingWindows :many
-- Closed windows not yet handed to billing, oldest first.
SELECT * FROM usage_windows
WHERE outcome IS NULL AND window_end <= sqlc.arg(now)::timestamptz
ORDER BY window_end, key
LIMIT sqlc.arg(lim)
FOR UPDATE SKIP LOCKED;

-- name: RecordOutcome :exec
UPDATE usage_windows SET outcome = sqlc.arg(outcome), recorded_at = sqlc.arg(recorded_at)
WHERE key = sqlc.arg(key) AND outcome IS NULL;

-- name: ListWindows :many
-- Windows of a tenant (or of one of its projects) that end after from and
-- start before to, by window start and key, after a position.
SELECT * FROM usage_windows
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(project_id)::text IS NULL OR project_id = sqlc.narg(project_id))
  AND (sqlc.narg(meter)::text IS NULL OR meter = sqlc.narg(meter))
  AND window_end > sqlc.arg(range_from)::timestamptz AND window_start < sqlc.arg(range_to)::timestamptz
  AND (window_start, key) > (sqlc.arg(after_start)::timestamptz, sqlc.arg(after_key)::text)
ORDER BY window_start, key
LIMIT sqlc.arg(lim);

-- name: UsageCensus :one
-- For the self check: windows billing dead-lettered, and closed windows not
-- handed over since before a bound.
SELECT
    (SELECT count(*) FROM usage_windows WHERE outcome = 'dead-lettered')::bigint AS dead_lettered,
    (SELECT count(*) FROM usage_windows WHERE outcome IS NULL AND window_end <= sqlc.arg(overdue)::timestamptz)::bigint AS backlog;

-- name: MarkDirty :exec
UPDATE allocations SET dirty = true WHERE allocation_id = sqlc.arg(allocation_id);

-- name: EgressCountersOf :many
-- The instances of a node a status reports, with the counters last seen
-- for them (none: never counted). A node's statuses are written one at a
-- time (ReportStatus holds its row), so no other lock is needed.
SELECT i.instance_id, i.tenant_id, i.kind, c.node_id AS counted_on, c.tx_bytes, c.rx_bytes
FROM instances i LEFT JOIN egress_counters c ON c.instance_id = i.instance_id
WHERE i.instance_id = ANY(sqlc.arg(instance_ids)::text[]) AND i.node_id = sqlc.arg(node_id);

-- name: PutEgressCounters :exec
INSERT INTO egress_counters (instance_id, node_id, tx_bytes, rx_bytes, updated_at)
SELECT unnest(sqlc.arg(instance_ids)::text[]), sqlc.arg(node_id), unnest(sqlc.arg(tx)::bigint[]), unnest(sqlc.arg(rx)::bigint[]), sqlc.arg(at)
ON CONFLICT (instance_id) DO UPDATE SET node_id = excluded.node_id, tx_bytes = excluded.tx_bytes,
    rx_bytes = excluded.rx_bytes, updated_at = excluded.updated_at;

-- name: ForgetEgressCounters :exec
-- The counters of a node's instances that are gone (deleted rows).
DELETE FROM egress_counters c USING instances i
WHERE c.node_id = sqlc.arg(node_id) AND i.instance_id = c.instance_id AND i.state = 'deleted';

-- name: AddCounted :exec
-- Adds each instance's growth to its row of the hour.
INSERT INTO counted_usage (counted_id, tenant_id, project_id, instance_id, meter, hour_start, quantity)
SELECT unnest(sqlc.arg(counted_ids)::text[]), unnest(sqlc.arg(tenant_ids)::text[]), NULL, unnest(sqlc.arg(instance_ids)::text[]),
       sqlc.arg(meter), sqlc.arg(hour_start), unnest(sqlc.arg(quantities)::bigint[])
ON CONFLICT (tenant_id, project_id, instance_id, meter, hour_start)
DO UPDATE SET quantity = counted_usage.quantity + excluded.quantity;

-- name: CountedToRoll :many
-- A tenant's counted rows of closed hours not windowed in full.
SELECT * FROM counted_usage
WHERE tenant_id = sqlc.arg(tenant_id) AND quantity > windowed AND hour_start < sqlc.arg(horizon)::timestamptz
ORDER BY counted_id
FOR UPDATE;

-- name: InsertCountedWindow :exec
INSERT INTO usage_windows (key, counted_id, tenant_id, project_id, meter, window_start, window_end, quantity_micro_ms, quantity_units, tags, adjustment)
VALUES (sqlc.arg(key), sqlc.arg(counted_id), sqlc.arg(tenant_id), sqlc.narg(project_id), sqlc.arg(meter),
        sqlc.arg(window_start), sqlc.arg(window_end), 0, sqlc.arg(quantity_units), sqlc.arg(tags), sqlc.arg(adjustment))
ON CONFLICT DO NOTHING;

-- name: MarkCountedWindowed :exec
UPDATE counted_usage SET windowed = sqlc.arg(windowed), windows = windows + 1 WHERE counted_id = sqlc.arg(counted_id);
