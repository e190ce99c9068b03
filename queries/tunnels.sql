-- name: InsertTunnel :one
INSERT INTO tunnels (tunnel_id, tenant_id, identity_id, target_kind, target_id, instance_id, node_id, kind, argv, env, tty,
    ticket_hash, source_ip, expires_at, port, term_cols, term_rows, session, caller)
VALUES (sqlc.arg(tunnel_id), sqlc.arg(tenant_id), sqlc.arg(identity_id), sqlc.arg(target_kind), sqlc.arg(target_id),
    sqlc.arg(instance_id), sqlc.arg(node_id), sqlc.arg(kind), sqlc.arg(argv), sqlc.narg(env), sqlc.arg(tty),
    sqlc.arg(ticket_hash), sqlc.arg(source_ip), sqlc.arg(expires_at), sqlc.narg(port), sqlc.narg(term_cols), sqlc.narg(term_rows),
    sqlc.arg(session), sqlc.narg(caller))
RETURNING *;

-- name: RedeemTunnel :one
-- Single use: only an issued, unexpired ticket, from the source address
-- it was issued to, opens, once. One statement checks and consumes: it
-- answers the ticket's row whatever happened (no row: unknown ticket),
-- with redeemed_at set when this statement opened it. The row is as the
-- statement found it (a CTE's update is not seen by its outer select).
WITH redeemed AS (
    UPDATE tunnels SET state = 'open', opened_at = now()
    WHERE ticket_hash = sqlc.arg(ticket_hash) AND state = 'issued' AND expires_at > now()
        AND tunnels.source_ip = sqlc.arg(source_ip)::text
    RETURNING tunnel_id, opened_at
)
SELECT sqlc.embed(tunnels), redeemed.opened_at AS redeemed_at
FROM tunnels LEFT JOIN redeemed ON redeemed.tunnel_id = tunnels.tunnel_id
WHERE tunnels.ticket_hash = sqlc.arg(ticket_hash);

-- name: GetTunnel :one
SELECT * FROM tunnels WHERE tunnel_id = sqlc.arg(tunnel_id);

-- name: GetTunnelForUpdate :one
SELECT * FROM tunnels WHERE tunnel_id = sqlc.arg(tunnel_id) FOR UPDATE;

-- name: TunnelState :one
SELECT state FROM tunnels WHERE tunnel_id = sqlc.arg(tunnel_id);

-- name: TunnelsNotOpen :many
-- Of the tunnels a relay holds open, those closed meanwhile
-- (tunnels.close): one read a second for all of a replica's tunnels.
SELECT tunnel_id FROM tunnels WHERE tunnel_id = ANY(sqlc.arg(tunnel_ids)::text[]) AND state <> 'open';

-- name: FinishTunnel :one
-- The relay's end: counts and the exit code; a tunnel closed by
-- tunnels.close keeps its closed_at.
UPDATE tunnels SET state = 'closed', closed_at = coalesce(closed_at, now()), bytes_in = sqlc.arg(bytes_in),
    bytes_out = sqlc.arg(bytes_out), exit_code = sqlc.narg(exit_code)
WHERE tunnel_id = sqlc.arg(tunnel_id)
RETURNING *;

-- name: CloseTunnel :one
UPDATE tunnels SET state = CASE WHEN state = 'issued' AND expires_at <= now() THEN 'expired' ELSE 'closed' END,
    closed_at = now()
WHERE tunnel_id = sqlc.arg(tunnel_id) AND state IN ('issued', 'open')
RETURNING *;

-- name: ListTunnels :many
SELECT * FROM tunnels
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.arg(include_closed)::boolean OR (state = 'open' OR (state = 'issued' AND expires_at > now())))
ORDER BY created_at DESC, tunnel_id DESC LIMIT 1000;

-- name: EnsurePreview :one
-- Makes the preview of a target's port, or keeps the one there; public
-- changes only when given.
INSERT INTO previews (target_id, port, tenant_id, target_kind, public, nonce)
VALUES (sqlc.arg(target_id), sqlc.arg(port), sqlc.arg(tenant_id), sqlc.arg(target_kind), coalesce(sqlc.narg(public)::boolean, false), sqlc.arg(nonce))
ON CONFLICT (target_id, port) DO UPDATE
SET public = coalesce(sqlc.narg(public)::boolean, previews.public),
    updated_at = CASE WHEN sqlc.narg(public)::boolean IS NULL THEN previews.updated_at ELSE now() END
RETURNING *;

-- name: GetPreview :one
SELECT * FROM previews WHERE target_id = sqlc.arg(target_id) AND port = sqlc.arg(port);

-- name: ListPreviews :many
SELECT * FROM previews WHERE tenant_id = sqlc.arg(tenant_id) ORDER BY target_id, port LIMIT 1000;
