-- name: InsertNode :one
-- The node takes its pool's vCPU allocation ratio; FOR SHARE waits for a
-- pools.update changing it and reads what it committed.
INSERT INTO nodes (node_id, pool_id, site_id, hostname, state, labels, cap_vcpu, cap_memory_mib, cap_disk_gib, gpu_model, cap_gpus, declared,
                   vcpu_allocation_ratio)
VALUES (sqlc.arg(node_id), sqlc.arg(pool_id), sqlc.arg(site_id), sqlc.arg(hostname), sqlc.arg(state), sqlc.arg(labels),
        sqlc.arg(cap_vcpu), sqlc.arg(cap_memory_mib), sqlc.arg(cap_disk_gib), sqlc.narg(gpu_model), sqlc.arg(cap_gpus), sqlc.arg(declared),
        (SELECT p.vcpu_allocation_ratio FROM pools p WHERE p.pool_id = sqlc.arg(pool_id) FOR SHARE))
RETURNING *;

-- name: GetNode :one
SELECT sqlc.embed(n), p.tenant_id AS owner FROM nodes n JOIN pools p USING (pool_id) WHERE n.node_id = sqlc.arg(node_id);

-- name: GetNodeForUpdate :one
SELECT sqlc.embed(n), p.tenant_id AS owner FROM nodes n JOIN pools p USING (pool_id)
WHERE n.node_id = sqlc.arg(node_id) FOR UPDATE OF n;

-- name: ListNodes :many
-- Nodes of a tenant's pools, by pool and hostname; retired ones only when
-- their state is asked for.
SELECT sqlc.embed(n), p.tenant_id AS owner FROM nodes n JOIN pools p USING (pool_id)
WHERE p.tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(pool_id)::text IS NULL OR n.pool_id = sqlc.narg(pool_id))
  AND (sqlc.narg(state)::text IS NULL OR n.state = sqlc.narg(state))
  AND (sqlc.narg(state)::text IS NOT NULL OR n.state <> 'retired')
ORDER BY n.pool_id, n.hostname, n.node_id;

-- name: SetNodeState :one
UPDATE nodes SET state = sqlc.arg(state), version = version + 1, updated_at = now()
WHERE node_id = sqlc.arg(node_id)
RETURNING *;

-- name: SetNodeLabels :one
UPDATE nodes SET labels = sqlc.arg(labels), version = version + 1, updated_at = now()
WHERE node_id = sqlc.arg(node_id)
RETURNING *;

-- name: CountLiveBookings :one
SELECT count(*) FROM bookings WHERE node_id = sqlc.arg(node_id) AND NOT released;

-- name: FleetCensus :one
-- For the self check: daemon-run nodes that count as ready but have no
-- session (their daemon's heartbeat is gone), and nodes or quotas past
-- their bounds (the constraints make both impossible; counted to prove it).
SELECT
    (SELECT count(*) FROM nodes WHERE NOT declared AND state = 'ready' AND session_gateway IS NULL)::bigint AS sessionless,
    (SELECT count(*) FROM nodes WHERE booked_vcpu > alloc_vcpu OR booked_memory_mib > cap_memory_mib
        OR booked_disk_gib > cap_disk_gib OR booked_gpus > cap_gpus)::bigint AS overbooked,
    (SELECT count(*) FROM quotas WHERE used > max)::bigint AS overdrawn;

-- name: PutNodeAttestation :exec
-- A retry of the same join (same node key) attests again: the row takes
-- the newest proof.
INSERT INTO node_attestations (node_id, attestor, endorsement_key_sha256, attestation_key_sha256, node_key_sha256)
VALUES (sqlc.arg(node_id), 'tpm', sqlc.arg(endorsement_key_sha256)::text, sqlc.arg(attestation_key_sha256)::text, sqlc.arg(node_key_sha256)::text)
ON CONFLICT (node_id) DO UPDATE SET attestor = EXCLUDED.attestor, endorsement_key_sha256 = EXCLUDED.endorsement_key_sha256,
    attestation_key_sha256 = EXCLUDED.attestation_key_sha256, node_key_sha256 = EXCLUDED.node_key_sha256,
    instance_id = NULL, account_id = NULL, document_sha256 = NULL, attested_at = now();

-- name: PutCloudAttestation :exec
-- The cloud attestor's proof: the machine, its provider account, and the
-- document presented (a retry of the same join attests again).
INSERT INTO node_attestations (node_id, attestor, instance_id, account_id, document_sha256)
VALUES (sqlc.arg(node_id), 'cloud', sqlc.arg(instance_id)::text, sqlc.arg(account_id)::text, sqlc.arg(document_sha256)::text)
ON CONFLICT (node_id) DO UPDATE SET attestor = EXCLUDED.attestor, instance_id = EXCLUDED.instance_id, account_id = EXCLUDED.account_id,
    document_sha256 = EXCLUDED.document_sha256, endorsement_key_sha256 = NULL, attestation_key_sha256 = NULL, node_key_sha256 = NULL,
    attested_at = now();

-- name: GetNodeAttestation :one
SELECT * FROM node_attestations WHERE node_id = $1;
