-- name: RegisterGateway :exec
INSERT INTO gateways (gateway_id, region, url, server_name, epoch, max_streams, internal_url)
VALUES (sqlc.arg(gateway_id), sqlc.arg(region), sqlc.arg(url), sqlc.narg(server_name), sqlc.arg(epoch), sqlc.arg(max_streams), sqlc.narg(internal_url))
ON CONFLICT (gateway_id) DO UPDATE SET epoch = excluded.epoch, draining = false, heartbeat_at = now(), internal_url = excluded.internal_url;

-- name: GatewayInternalURL :one
SELECT coalesce(internal_url, '')::text FROM gateways WHERE gateway_id = sqlc.arg(gateway_id);

-- name: LiveInternalURLs :many
SELECT g.gateway_id, g.internal_url::text AS internal_url FROM gateways g JOIN leases l ON l.name = 'gateway/' || g.gateway_id
WHERE l.expires_at > now() AND g.internal_url IS NOT NULL ORDER BY g.gateway_id;

-- name: HeartbeatGateway :exec
UPDATE gateways SET heartbeat_at = now(), sessions = sqlc.arg(sessions), draining = sqlc.arg(draining)
WHERE gateway_id = sqlc.arg(gateway_id);

-- name: DeleteGateway :exec
DELETE FROM gateways WHERE gateway_id = sqlc.arg(gateway_id);

-- DeleteDeadGateways removes the rows of gateways whose lease is gone and
-- that no node's session names any more.
-- name: DeleteDeadGateways :execrows
DELETE FROM gateways g
WHERE g.heartbeat_at < now() - make_interval(secs => sqlc.arg(older_than_ms)::bigint / 1000.0)
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = 'gateway/' || g.gateway_id AND l.expires_at > now())
  AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.session_gateway = g.gateway_id);

-- ListLiveGateways lists the gateways holding their lease, of a region
-- when one is given, those not draining first, the least loaded first.
-- name: ListLiveGateways :many
SELECT g.* FROM gateways g JOIN leases l ON l.name = 'gateway/' || g.gateway_id
WHERE l.expires_at > now() AND l.holder = g.gateway_id AND l.epoch = g.epoch
  AND (sqlc.narg(region)::text IS NULL OR g.region = sqlc.narg(region))
ORDER BY g.draining, g.sessions, g.gateway_id;

-- OpenSession makes the gateway the holder of a node's session with a new
-- session epoch, recording what the daemon said in its hello. A daemon
-- run host's capacity follows its inventory, never below what is booked
-- (vCPU: never below what its allocatable figure needs to hold the booked).
-- name: OpenSession :one
UPDATE nodes SET
    session_gateway = sqlc.arg(gateway_id), session_epoch = session_epoch + 1, session_since = now(),
    session_closed_at = NULL, session_transport = sqlc.arg(transport), last_seen_at = now(),
    agent_version = sqlc.arg(agent_version), agent_protocol = sqlc.arg(agent_protocol),
    inventory = sqlc.arg(inventory), observed_generation = sqlc.arg(observed_generation),
    cert_not_after = sqlc.arg(cert_not_after), cert_serial = sqlc.arg(cert_serial),
    cap_vcpu = CASE WHEN declared THEN cap_vcpu ELSE greatest(ceil(booked_vcpu / vcpu_allocation_ratio)::integer, sqlc.arg(vcpu)::integer) END,
    cap_memory_mib = CASE WHEN declared THEN cap_memory_mib ELSE greatest(booked_memory_mib, sqlc.arg(memory_mib)::bigint) END,
    cap_disk_gib = CASE WHEN declared THEN cap_disk_gib ELSE greatest(booked_disk_gib, sqlc.arg(disk_gib)::bigint) END,
    cap_gpus = CASE WHEN declared THEN cap_gpus ELSE greatest(booked_gpus, sqlc.arg(gpus)::integer) END,
    gpu_model = CASE WHEN declared THEN gpu_model ELSE sqlc.narg(gpu_model) END,
    status_hash = CASE WHEN observed_generation = sqlc.arg(observed_generation) THEN status_hash END,
    updated_at = now()
WHERE node_id = sqlc.arg(node_id)
RETURNING *;

-- OpenSessions is OpenSession for the hellos that arrived together at a
-- gateway, one row per node (the caller never puts a node twice), in one
-- statement: it opens the sessions of the nodes that need nothing else
-- (ready, cordoned or draining, the same underlay) and returns their new
-- epochs and the hash of their last status (NULL when the hello's observed
-- generation differs from the row's). A node it does not return (missing,
-- joining, down, retired, a new underlay) takes OpenSession's transaction,
-- and so does a node whose row another transaction holds locked (SKIP
-- LOCKED: one busy row never holds up the batch; its own transaction waits
-- for it within its lock timeout). The rows are locked in node order.
-- name: OpenSessions :many
WITH hello AS (
    -- unnest in the select list: the arrays go in parallel, one row per
    -- index (they have one length).
    SELECT unnest(sqlc.arg(node_ids)::text[]) AS node_id, unnest(sqlc.arg(transports)::text[]) AS transport,
        unnest(sqlc.arg(agent_versions)::text[]) AS agent_version, unnest(sqlc.arg(agent_protocols)::integer[]) AS agent_protocol,
        unnest(sqlc.arg(inventories)::text[]) AS inventory, unnest(sqlc.arg(observed_generations)::bigint[]) AS observed_generation,
        unnest(sqlc.arg(cert_not_afters)::timestamptz[]) AS cert_not_after, unnest(sqlc.arg(cert_serials)::text[]) AS cert_serial,
        unnest(sqlc.arg(vcpus)::integer[]) AS vcpu, unnest(sqlc.arg(memory_mibs)::bigint[]) AS memory_mib,
        unnest(sqlc.arg(disk_gibs)::bigint[]) AS disk_gib, unnest(sqlc.arg(gpus)::integer[]) AS gpus,
        unnest(sqlc.arg(gpu_models)::text[]) AS gpu_model, unnest(sqlc.arg(underlays)::text[]) AS underlay
), plain AS (
    SELECT n.node_id FROM nodes n JOIN hello h USING (node_id)
    WHERE n.state IN ('ready', 'cordoned', 'draining') AND coalesce(n.inventory->>'underlay', '') = h.underlay
    ORDER BY n.node_id
    FOR UPDATE OF n SKIP LOCKED
)
UPDATE nodes n SET
    session_gateway = sqlc.arg(gateway_id), session_epoch = n.session_epoch + 1, session_since = now(),
    session_closed_at = NULL, session_transport = h.transport, last_seen_at = now(),
    agent_version = h.agent_version, agent_protocol = h.agent_protocol,
    inventory = h.inventory::jsonb, observed_generation = h.observed_generation,
    cert_not_after = h.cert_not_after, cert_serial = h.cert_serial,
    cap_vcpu = CASE WHEN n.declared THEN n.cap_vcpu ELSE greatest(ceil(n.booked_vcpu / n.vcpu_allocation_ratio)::integer, h.vcpu) END,
    cap_memory_mib = CASE WHEN n.declared THEN n.cap_memory_mib ELSE greatest(n.booked_memory_mib, h.memory_mib) END,
    cap_disk_gib = CASE WHEN n.declared THEN n.cap_disk_gib ELSE greatest(n.booked_disk_gib, h.disk_gib) END,
    cap_gpus = CASE WHEN n.declared THEN n.cap_gpus ELSE greatest(n.booked_gpus, h.gpus) END,
    gpu_model = CASE WHEN n.declared THEN n.gpu_model ELSE nullif(h.gpu_model, '') END,
    status_hash = CASE WHEN n.observed_generation = h.observed_generation THEN n.status_hash END,
    updated_at = now()
FROM hello h
WHERE n.node_id = h.node_id AND n.node_id IN (SELECT node_id FROM plain)
  AND n.state IN ('ready', 'cordoned', 'draining')
RETURNING n.node_id, n.session_epoch, n.status_hash;

-- name: GetNodeSession :one
SELECT n.node_id, n.state, n.down_from, n.declared, n.hostname, n.pool_id, p.tenant_id AS owner,
       coalesce(n.inventory->>'underlay', '')::text AS underlay
FROM nodes n JOIN pools p USING (pool_id) WHERE n.node_id = sqlc.arg(node_id) FOR UPDATE OF n;

-- name: SetNodeSessionState :exec
UPDATE nodes SET state = sqlc.arg(state), down_from = sqlc.narg(down_from), version = version + 1, updated_at = now()
WHERE node_id = sqlc.arg(node_id);

-- CloseSession ends a session if it is still the one the gateway holds.
-- name: CloseSession :execrows
UPDATE nodes SET session_gateway = NULL, session_closed_at = now(), last_seen_at = now()
WHERE node_id = sqlc.arg(node_id) AND session_gateway = sqlc.arg(gateway_id) AND session_epoch = sqlc.arg(session_epoch);

-- TouchSessions records that the daemons of a gateway's sessions were
-- heard from.
-- name: TouchSessions :execrows
UPDATE nodes SET last_seen_at = now()
WHERE node_id = ANY(sqlc.arg(node_ids)::text[]) AND session_gateway = sqlc.arg(gateway_id);

-- ReportStatus writes a daemon's status if its session is still current.
-- name: ReportStatus :execrows
UPDATE nodes SET observed_generation = sqlc.arg(observed_generation), apply_error = sqlc.narg(apply_error),
    instance_status = sqlc.arg(instance_status), last_seen_at = now(),
    volume_available_bytes = sqlc.arg(volume_available_bytes), volume_reserved_bytes = sqlc.arg(volume_reserved_bytes),
    volume_outstanding_bytes = sqlc.arg(volume_outstanding_bytes), volume_reported_at = now(),
    inventory = coalesce(sqlc.narg(inventory), inventory), status_hash = sqlc.arg(status_hash)
WHERE node_id = sqlc.arg(node_id) AND session_gateway = sqlc.arg(gateway_id) AND session_epoch = sqlc.arg(session_epoch);

-- name: SetNodeCertificate :exec
UPDATE nodes SET cert_not_after = sqlc.arg(cert_not_after), cert_serial = sqlc.arg(cert_serial)
WHERE node_id = sqlc.arg(node_id);

-- LostSessions lists the daemon-run nodes out of session for longer than
-- down_after_ms that still count as up: their session closed, or their
-- gateway's lease is gone.
-- name: LostSessions :many
SELECT n.node_id, n.state, p.tenant_id AS owner
FROM nodes n JOIN pools p USING (pool_id)
WHERE NOT n.declared AND n.state IN ('ready', 'cordoned', 'draining')
  AND n.last_seen_at < now() - make_interval(secs => sqlc.arg(down_after_ms)::bigint / 1000.0)
  AND (n.session_gateway IS NULL
       OR NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = 'gateway/' || n.session_gateway AND l.expires_at > now()))
ORDER BY n.node_id
LIMIT 500
FOR UPDATE OF n SKIP LOCKED;

-- name: MarkNodeDown :exec
UPDATE nodes SET state = 'down', down_from = state, session_gateway = NULL, status_hash = NULL,
    session_closed_at = coalesce(session_closed_at, now()), version = version + 1, updated_at = now()
WHERE node_id = sqlc.arg(node_id);

-- name: PutNodeSpec :one
INSERT INTO node_specs (node_id, generation, body) VALUES (sqlc.arg(node_id), 1, sqlc.arg(body))
ON CONFLICT (node_id) DO UPDATE SET generation = node_specs.generation + 1, body = excluded.body, updated_at = now()
RETURNING generation;

-- (nodework's spec push sends this statement as putSpec, held with the
-- commit: keep both the same.)

-- NodeSpecInputs is what a node's spec needs besides its instances, in one
-- statement: the node's gateway (whose topic is woken), the networks of its
-- last spec, its ready volumes.
-- name: NodeSpecInputs :one
SELECT n.session_gateway,
       (SELECT s.body FROM node_specs s WHERE s.node_id = n.node_id)::jsonb AS last_spec,
       coalesce((SELECT jsonb_agg(jsonb_build_object('serial', v.serial, 'sizeGiB', v.size_gib) ORDER BY v.volume_id)
                 FROM sandbox_volumes v WHERE v.node_id = n.node_id AND v.state = 'ready'), '[]'::jsonb)::jsonb AS volumes
FROM nodes n WHERE n.node_id = sqlc.arg(node_id);

-- name: GetNodeSpec :one
SELECT * FROM node_specs WHERE node_id = sqlc.arg(node_id);

-- PendingSpecs lists the specs the daemons of a gateway's sessions have
-- not applied yet.
-- name: PendingSpecs :many
SELECT s.node_id, s.generation, s.body FROM node_specs s JOIN nodes n USING (node_id)
WHERE n.session_gateway = sqlc.arg(gateway_id) AND s.generation > n.observed_generation;

-- PendingSpecsOf is PendingSpecs for the nodes whose sessions just
-- opened on the gateway: their rows by key, where PendingSpecs reads every
-- session of the gateway (a storm of reconnects would read them all once
-- per batch of hellos). No condition on session_gateway: the nodes are
-- the caller's sessions (it sends on the ones still open), and after a
-- restart the statistics know nothing of the new gateway's id, so a plan
-- with it read every session of the gateway through
-- nodes_session_gateway_idx (2 to 9 ms a call at 2,000 sessions).
-- name: PendingSpecsOf :many
SELECT s.node_id, s.generation, s.body FROM node_specs s JOIN nodes n USING (node_id)
WHERE s.node_id = ANY(sqlc.arg(node_ids)::text[]) AND s.generation > n.observed_generation;

-- name: InsertCommand :one
INSERT INTO node_commands (command_id, node_id, kind, args, state, created_by, expires_at)
VALUES (sqlc.arg(command_id), sqlc.arg(node_id), sqlc.arg(kind), sqlc.arg(args), 'pending', sqlc.arg(created_by), sqlc.arg(expires_at))
RETURNING *;

-- name: GetCommand :one
SELECT * FROM node_commands WHERE command_id = sqlc.arg(command_id);

-- PendingCommands lists the commands to send on a gateway's sessions,
-- oldest first, and marks them sent.
-- name: PendingCommands :many
UPDATE node_commands c SET state = 'sent', attempts = attempts + 1, sent_at = now()
FROM nodes n
WHERE c.node_id = n.node_id AND n.session_gateway = sqlc.arg(gateway_id)
  AND c.state = 'pending' AND c.expires_at > now()
  AND c.command_id IN (SELECT command_id FROM node_commands WHERE state = 'pending' ORDER BY created_at LIMIT sqlc.arg(max)::int FOR UPDATE SKIP LOCKED)
RETURNING c.*;

-- PendingCommandsOf is PendingCommands for the nodes whose sessions just
-- opened on the gateway, from the commands locked (node_commands_open_idx
-- by node, then each by key, in custom and generic plans), with no
-- condition on session_gateway for the reason PendingSpecsOf gives: a
-- command of a node whose session went meanwhile is marked sent and not
-- sent, and the sweeper puts it back to pending, as when a session ends
-- after PendingCommands.
-- name: PendingCommandsOf :many
UPDATE node_commands c SET state = 'sent', attempts = c.attempts + 1, sent_at = now()
FROM (SELECT command_id FROM node_commands
      WHERE state = 'pending' AND expires_at > now() AND node_id = ANY(sqlc.arg(node_ids)::text[])
      ORDER BY created_at LIMIT sqlc.arg(max)::int FOR UPDATE SKIP LOCKED) p
WHERE c.command_id = p.command_id
RETURNING c.*;

-- FinishCommand writes a command's result and returns its kind; no row
-- when it was finished already (a result sent again) or is not the node's.
-- name: FinishCommand :one
UPDATE node_commands SET state = sqlc.arg(state), result = sqlc.arg(result), finished_at = now()
WHERE command_id = sqlc.arg(command_id) AND node_id = sqlc.arg(node_id) AND state IN ('pending', 'sent')
RETURNING kind;

-- ResendCommands puts commands sent resend_after_ms ago without a result
-- back to pending and names the gateways to wake.
-- name: ResendCommands :many
UPDATE node_commands c SET state = 'pending'
FROM nodes n
WHERE c.node_id = n.node_id AND c.state = 'sent' AND c.expires_at > now()
  AND c.sent_at < now() - make_interval(secs => sqlc.arg(resend_after_ms)::bigint / 1000.0)
RETURNING c.command_id, n.session_gateway;

-- name: ExpireCommands :execrows
UPDATE node_commands SET state = 'expired', finished_at = now()
WHERE state IN ('pending', 'sent') AND expires_at <= now();

-- name: ListRevocations :many
SELECT kind, value FROM revocations ORDER BY kind, value;

-- name: InsertRevocation :execrows
INSERT INTO revocations (kind, value, reason) VALUES (sqlc.arg(kind), sqlc.arg(value), sqlc.arg(reason))
ON CONFLICT DO NOTHING;

-- name: GatewayFindings :one
-- What system.selfCheck reports about gateways and daemons.
SELECT
    (SELECT count(*) FROM node_commands WHERE state = 'sent' AND sent_at < now() - interval '15 seconds' AND expires_at > now())::bigint AS unresent_commands,
    (SELECT count(*) FROM node_commands WHERE state IN ('pending', 'sent') AND expires_at < now() - interval '15 seconds')::bigint AS unexpired_commands,
    (SELECT coalesce(sum(sessions), 0) FROM gateways g WHERE g.heartbeat_at > now() - interval '20 seconds')::bigint AS sessions,
    (SELECT coalesce(sum(max_streams), 0) FROM gateways g WHERE g.heartbeat_at > now() - interval '20 seconds')::bigint AS max_streams,
    (SELECT count(*) FROM nodes WHERE session_gateway IS NOT NULL AND last_seen_at < now() - interval '30 seconds')::bigint AS stale_heartbeats,
    (SELECT count(*) FROM nodes WHERE session_gateway IS NOT NULL AND agent_protocol < sqlc.arg(min_protocol)::int)::bigint AS protocol_skew,
    (SELECT count(*) FROM nodes WHERE state <> 'retired' AND cert_not_after < now() + interval '7 days')::bigint AS expiring_certs;

-- name: AccelCensus :many
-- The VM acceleration daemons in session report (kvm, tcg), for the self
-- check.
SELECT coalesce(inventory->>'runtime', '') AS runtime, coalesce(inventory->>'accel', '') AS accel, count(*)::bigint AS nodes
FROM nodes WHERE session_gateway IS NOT NULL
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: TrustVersionOf :one
SELECT version FROM trust_versions WHERE fingerprint = sqlc.arg(fingerprint);

-- AddTrustVersion gives a bundle not seen before the next version, at
-- least lowest.
-- name: AddTrustVersion :one
INSERT INTO trust_versions (fingerprint, version)
SELECT sqlc.arg(fingerprint), greatest(sqlc.arg(lowest)::integer, coalesce(max(version), 0) + 1) FROM trust_versions
ON CONFLICT (fingerprint) DO UPDATE SET fingerprint = excluded.fingerprint
RETURNING version;

-- name: NodeGatewayInternalURL :one
-- The internal API of the gateway holding a node's session ('' when none).
SELECT coalesce(g.internal_url, '')::text FROM nodes n JOIN gateways g ON g.gateway_id = n.session_gateway
WHERE n.node_id = sqlc.arg(node_id);
