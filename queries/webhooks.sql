-- Webhooks and their delivery queue (migrations/00009_webhooks.sql). Every
-- transaction that locks both takes the webhook row first, then its
-- deliveries, so they never deadlock: the API's changes and the delivery
-- worker's claims lock the webhook FOR NO KEY UPDATE, the fan-out FOR KEY
-- SHARE (which only a delete waits for).

-- name: LockTenantWebhooks :exec
-- Serializes creates of one tenant, so the per-tenant limit holds under
-- concurrency.
SELECT pg_advisory_xact_lock(hashtextextended('webhooks/' || sqlc.arg(tenant_id)::text, 0));

-- name: CountTenantWebhooks :one
SELECT count(*) FROM webhooks WHERE tenant_id = sqlc.arg(tenant_id);

-- name: InsertWebhook :one
-- since_snapshot takes this statement's snapshot (its default).
INSERT INTO webhooks (webhook_id, tenant_id, url, events, description, secret_gen, secret_nonce, secret_sealed,
                      created_by, created_at, updated_at)
VALUES (sqlc.arg(webhook_id), sqlc.arg(tenant_id), sqlc.arg(url), sqlc.arg(events)::text[], sqlc.arg(description),
        1, sqlc.arg(secret_nonce), sqlc.arg(secret_sealed), sqlc.arg(created_by), sqlc.arg(now)::timestamptz, sqlc.arg(now)::timestamptz)
RETURNING *;

-- name: ListWebhooks :many
SELECT * FROM webhooks WHERE tenant_id = sqlc.arg(tenant_id) ORDER BY created_at, webhook_id;

-- name: GetWebhook :one
SELECT * FROM webhooks WHERE webhook_id = sqlc.arg(webhook_id);

-- name: GetWebhookForUpdate :one
-- NO KEY UPDATE: changes wait for each other and for claims, not for the
-- fan-out's KEY SHARE.
SELECT * FROM webhooks WHERE webhook_id = sqlc.arg(webhook_id) FOR NO KEY UPDATE;

-- name: UpdateWebhook :one
-- A re-activation takes this statement's snapshot as the new lower bound
-- of what is delivered: events committed while paused are not.
UPDATE webhooks
SET url = sqlc.arg(url), events = sqlc.arg(events)::text[], description = sqlc.arg(description),
    active = sqlc.arg(active), version = version + 1, updated_at = sqlc.arg(now)::timestamptz,
    since_snapshot = CASE WHEN sqlc.arg(reactivate)::boolean THEN pg_current_snapshot()::text ELSE since_snapshot END
WHERE webhook_id = sqlc.arg(webhook_id)
RETURNING *;

-- name: RotateWebhookSecret :one
-- The new generation becomes current; the previous one is kept (until
-- previous_expires_at) or dropped, as the caller decided.
UPDATE webhooks
SET secret_gen = sqlc.arg(secret_gen), secret_nonce = sqlc.arg(secret_nonce), secret_sealed = sqlc.arg(secret_sealed),
    previous_gen = sqlc.narg(previous_gen), previous_nonce = sqlc.narg(previous_nonce),
    previous_sealed = sqlc.narg(previous_sealed), previous_expires_at = sqlc.narg(previous_expires_at),
    version = version + 1, updated_at = sqlc.arg(now)::timestamptz
WHERE webhook_id = sqlc.arg(webhook_id)
RETURNING *;

-- name: DeleteWebhook :execrows
-- Its deliveries go with it (ON DELETE CASCADE).
DELETE FROM webhooks WHERE webhook_id = sqlc.arg(webhook_id);

-- name: PauseWebhook :exec
UPDATE webhooks SET active = false, version = version + 1, updated_at = sqlc.arg(now)::timestamptz
WHERE webhook_id = sqlc.arg(webhook_id) AND active;

-- name: CancelPendingDeliveries :execrows
-- Pausing cancels every pending delivery, claimed or not: an attempt in
-- flight then records nothing (its claim token no longer finds a pending
-- row).
UPDATE webhook_deliveries
SET state = 'cancelled', next_attempt_at = NULL, claimed_until = NULL, claim_token = NULL, updated_at = sqlc.arg(now)::timestamptz
WHERE webhook_id = sqlc.arg(webhook_id) AND state = 'pending';

-- name: InsertDelivery :one
INSERT INTO webhook_deliveries (delivery_id, webhook_id, tenant_id, event_id, event_type, event_time, body, state,
                                next_attempt_at, created_at, updated_at)
VALUES (sqlc.arg(delivery_id), sqlc.arg(webhook_id), sqlc.arg(tenant_id), sqlc.arg(event_id), sqlc.arg(event_type),
        sqlc.arg(event_time)::timestamptz, sqlc.arg(body), 'pending', sqlc.arg(now)::timestamptz, sqlc.arg(now)::timestamptz, sqlc.arg(now)::timestamptz)
RETURNING *;

-- name: ListDeliveries :many
SELECT * FROM webhook_deliveries
WHERE webhook_id = sqlc.arg(webhook_id)
  AND (sqlc.narg(state)::text IS NULL OR state = sqlc.narg(state)::text)
ORDER BY created_at DESC, delivery_id DESC
LIMIT sqlc.arg(max_rows);

-- name: GetDelivery :one
SELECT * FROM webhook_deliveries WHERE delivery_id = sqlc.arg(delivery_id);

-- name: RedeliverDelivery :one
-- Pending again, due now, attempts reset, same id. Only a finished
-- delivery moves; the caller holds its webhook's lock.
UPDATE webhook_deliveries
SET state = 'pending', attempts = 0, next_attempt_at = sqlc.arg(now)::timestamptz, claimed_until = NULL, claim_token = NULL,
    last_status = NULL, last_error = NULL, last_attempt_at = NULL, updated_at = sqlc.arg(now)::timestamptz
WHERE delivery_id = sqlc.arg(delivery_id) AND state IN ('delivered', 'dead', 'cancelled')
RETURNING *;

-- name: MoveWebhookFanout :exec
UPDATE webhook_fanout
SET after_xid = sqlc.arg(after_xid)::text::xid8, after_seq = sqlc.arg(after_seq), updated_at = now()
WHERE id = 'webhooks';

-- name: InsertFanoutDeliveries :execrows
-- One pending delivery per (webhook, event), due at once; a row that
-- exists already is kept.
INSERT INTO webhook_deliveries (delivery_id, webhook_id, tenant_id, event_id, event_type, event_time, body, state,
                                next_attempt_at, created_at, updated_at)
SELECT x.delivery_id, x.webhook_id, x.tenant_id, x.event_id, x.event_type, x.event_time, x.body, 'pending',
       sqlc.arg(now)::timestamptz, sqlc.arg(now)::timestamptz, sqlc.arg(now)::timestamptz
FROM (
    -- Set-returning functions in one select list advance together.
    SELECT unnest(sqlc.arg(delivery_ids)::text[]) AS delivery_id, unnest(sqlc.arg(webhook_ids)::text[]) AS webhook_id,
           unnest(sqlc.arg(tenant_ids)::text[]) AS tenant_id, unnest(sqlc.arg(event_ids)::text[]) AS event_id,
           unnest(sqlc.arg(event_types)::text[]) AS event_type, unnest(sqlc.arg(event_times)::timestamptz[]) AS event_time,
           unnest(sqlc.arg(bodies)::bytea[]) AS body
) x
ON CONFLICT (webhook_id, event_id) DO NOTHING;

-- name: DueWebhooks :many
-- Webhooks with due, unclaimed deliveries, oldest due first, leaving out
-- those already at their in-flight limit so that saturated (slow or
-- hanging) receivers never take the places of others.
SELECT d.webhook_id
FROM webhook_deliveries d
WHERE d.state = 'pending' AND d.next_attempt_at <= sqlc.arg(now)::timestamptz
  AND (d.claimed_until IS NULL OR d.claimed_until <= sqlc.arg(now)::timestamptz)
  AND d.webhook_id NOT IN (
      SELECT c.webhook_id FROM webhook_deliveries c
      WHERE c.state = 'pending' AND c.claimed_until IS NOT NULL AND c.claimed_until > sqlc.arg(now)::timestamptz
      GROUP BY c.webhook_id
      HAVING count(*) >= sqlc.arg(per_webhook)::bigint)
GROUP BY d.webhook_id
ORDER BY min(d.next_attempt_at), d.webhook_id
LIMIT sqlc.arg(max_rows);

-- name: LockClaimWebhooks :many
-- The webhooks about to be claimed for, locked so that claims for one
-- webhook are made one after another (its in-flight limit holds across
-- processes); one being changed right now is skipped this round.
SELECT * FROM webhooks WHERE webhook_id = ANY(sqlc.arg(webhook_ids)::text[])
ORDER BY webhook_id
FOR NO KEY UPDATE SKIP LOCKED;

-- name: InflightCounts :many
SELECT webhook_id, count(*) AS inflight
FROM webhook_deliveries
WHERE webhook_id = ANY(sqlc.arg(webhook_ids)::text[])
  AND state = 'pending' AND claimed_until IS NOT NULL AND claimed_until > sqlc.arg(now)::timestamptz
GROUP BY webhook_id;

-- name: CancelUnclaimedDeliveries :execrows
-- The delivery worker cancels what is pending for a paused webhook (a ping
-- queued while paused, or a delivery inserted as the webhook was paused).
UPDATE webhook_deliveries
SET state = 'cancelled', next_attempt_at = NULL, claimed_until = NULL, claim_token = NULL, updated_at = sqlc.arg(now)::timestamptz
WHERE webhook_id = ANY(sqlc.arg(webhook_ids)::text[]) AND state = 'pending'
  AND (claimed_until IS NULL OR claimed_until <= sqlc.arg(now)::timestamptz);

-- name: ClaimDeliveries :many
-- Claims up to counts[i] due deliveries of webhook_ids[i], oldest due
-- first, until claimed_until; the token proves the claim when the result
-- is written.
UPDATE webhook_deliveries d
SET claimed_until = sqlc.arg(claimed_until)::timestamptz, claim_token = sqlc.arg(claim_token)::text, updated_at = sqlc.arg(now)::timestamptz
FROM (
    SELECT p.delivery_id
    FROM (SELECT unnest(sqlc.arg(webhook_ids)::text[]) AS webhook_id, unnest(sqlc.arg(counts)::integer[]) AS k) h
    CROSS JOIN LATERAL (
        SELECT x.delivery_id FROM webhook_deliveries x
        WHERE x.webhook_id = h.webhook_id AND x.state = 'pending' AND x.next_attempt_at <= sqlc.arg(now)::timestamptz
          AND (x.claimed_until IS NULL OR x.claimed_until <= sqlc.arg(now)::timestamptz)
        ORDER BY x.next_attempt_at, x.delivery_id
        LIMIT h.k
    ) p
) c
WHERE d.delivery_id = c.delivery_id AND d.state = 'pending'
  AND (d.claimed_until IS NULL OR d.claimed_until <= sqlc.arg(now)::timestamptz)
RETURNING d.*;

-- name: FinishDelivery :execrows
-- Records an attempt under its claim: a lost claim (expired and taken, or
-- the delivery cancelled or reset meanwhile) records nothing.
UPDATE webhook_deliveries
SET state = sqlc.arg(state), attempts = attempts + 1, next_attempt_at = sqlc.narg(next_attempt_at),
    last_status = sqlc.narg(last_status), last_error = sqlc.narg(last_error), last_attempt_at = sqlc.arg(now)::timestamptz,
    claimed_until = NULL, claim_token = NULL, updated_at = sqlc.arg(now)::timestamptz
WHERE delivery_id = sqlc.arg(delivery_id) AND claim_token = sqlc.arg(claim_token)::text AND state = 'pending';

-- name: ReleaseDelivery :execrows
-- Gives a claim back without counting an attempt (the worker stopped).
UPDATE webhook_deliveries SET claimed_until = NULL, claim_token = NULL, updated_at = sqlc.arg(now)::timestamptz
WHERE delivery_id = sqlc.arg(delivery_id) AND claim_token = sqlc.arg(claim_token)::text AND state = 'pending';

-- name: OldestPendingDelivery :one
-- For the lag gauge: when the oldest pending delivery's event happened
-- (now when none is pending).
SELECT coalesce(min(event_time), sqlc.arg(now)::timestamptz)::timestamptz AS oldest
FROM webhook_deliveries WHERE state = 'pending';

-- ReleaseClaims gives back every live claim. The delivery engine runs under
-- one lease; a new holder calls it first, since the claims it finds were
-- made under an older epoch whose holder can no longer record a result.
-- name: ReleaseClaims :execrows
UPDATE webhook_deliveries
SET claimed_until = NULL, claim_token = NULL, updated_at = sqlc.arg(now)::timestamptz
WHERE state = 'pending' AND claimed_until IS NOT NULL AND claimed_until > sqlc.arg(now)::timestamptz;

-- name: FanoutBatch :many
-- A fan-out's batch in one statement, instead of four (the place's lock, the
-- outbox's read as ListOutboxCommitted, the webhooks' read, the held check): the
-- fan-out's place, locked for its transaction (no row at all when another
-- fan-out holds it); up to max_rows committed outbox rows after it, in the
-- order ListOutboxCommitted reads them (no outbox columns, one row, when
-- none); with each, the active webhooks of its tenant as JSON (held KEY
-- SHARE, so that none is deleted before the deliveries referencing it are
-- inserted); and held: whether rows after the place wait behind an older
-- transaction still running (the fan-out looks again soon).
WITH cur AS (
    SELECT after_xid, after_seq FROM webhook_fanout WHERE id = 'webhooks' FOR UPDATE SKIP LOCKED
), frontier AS (
    SELECT frontier FROM visibility_frontier_now
), batch AS (
    SELECT o.seq, o.xid, o.id, o.type, o.source, o.subject, o.tenant_id, o.time, o.data
    FROM outbox o, cur
    WHERE o.xid < (SELECT frontier FROM frontier)
      AND (o.xid, o.seq) > (cur.after_xid, cur.after_seq)
    ORDER BY o.xid, o.seq
    LIMIT sqlc.arg(max_rows)
), hooks AS (
    SELECT w.webhook_id, w.tenant_id, w.events, w.since_snapshot, w.created_at
    FROM webhooks w
    WHERE w.active AND w.tenant_id IN (SELECT DISTINCT b.tenant_id FROM batch b)
    FOR KEY SHARE
)
SELECT EXISTS (
           SELECT 1 FROM outbox o, cur
           WHERE (o.xid, o.seq) > (cur.after_xid, cur.after_seq) AND o.xid >= (SELECT frontier FROM frontier)
       )::boolean AS held,
       b.seq, coalesce(b.xid::text, '')::text AS xid, b.id, b.type, b.source, b.subject, b.tenant_id, b.time, b.data,
       (SELECT coalesce(json_agg(json_build_object('id', h.webhook_id, 'events', h.events, 'since', h.since_snapshot)
                                 ORDER BY h.created_at, h.webhook_id), '[]')
        FROM hooks h WHERE h.tenant_id = b.tenant_id)::jsonb AS hooks
FROM cur LEFT JOIN batch b ON true
ORDER BY b.xid, b.seq;
