-- VM networks: tenants' subnets of a pool and VMs' addresses in them
-- (internal/vmnet).

-- name: LockVMSubnets :exec
-- Serializes the allocations of one pool and mode until commit.
SELECT pg_advisory_xact_lock(hashtextextended('vm_subnets/' || sqlc.arg(pool_id)::text || '/' || sqlc.arg(network)::text, 0));

-- name: GetVMSubnet :one
SELECT subnet FROM vm_subnets WHERE pool_id = sqlc.arg(pool_id) AND network = sqlc.arg(network) AND tenant_id = sqlc.arg(tenant_id);

-- name: VMSubnets :many
SELECT subnet FROM vm_subnets WHERE pool_id = sqlc.arg(pool_id) AND network = sqlc.arg(network);

-- name: InsertVMSubnet :exec
INSERT INTO vm_subnets (pool_id, network, tenant_id, subnet)
VALUES (sqlc.arg(pool_id), sqlc.arg(network), sqlc.arg(tenant_id), sqlc.arg(subnet));

-- name: LiveVMAddresses :many
-- The addresses live VMs of a tenant hold in a pool and mode.
SELECT net_address::text FROM instances
WHERE pool_id = sqlc.arg(pool_id) AND network = sqlc.arg(network) AND tenant_id = sqlc.arg(tenant_id)
  AND net_address IS NOT NULL AND state <> 'deleted';

-- name: SetInstanceNetwork :one
UPDATE instances SET network = sqlc.arg(network), net_address = sqlc.narg(net_address), egress_policy = sqlc.narg(egress_policy)
WHERE instance_id = sqlc.arg(instance_id)
RETURNING *;

-- name: SetInstanceEgressPolicy :one
-- A new egress policy; the spec carries it to the node.
UPDATE instances SET egress_policy = sqlc.narg(egress_policy), version = version + 1, updated_at = now()
WHERE instance_id = sqlc.arg(instance_id)
RETURNING *;

-- name: SetSandboxTemplateEgress :exec
UPDATE sandbox_templates SET egress_policy = sqlc.narg(egress_policy) WHERE template_id = sqlc.arg(template_id);

-- A private network's members are the nodes with a VM on it: a tenant's
-- private VMs of a pool, live and not asked deleted.

-- name: NodePrivatePeers :many
-- The pool's other nodes carrying a private network of a node's VMs, by
-- tenant, with the underlay address their hello reported ('' without).
SELECT DISTINCT o.tenant_id, o.node_id::text AS node_id, coalesce(n.inventory->>'underlay', '')::text AS underlay
FROM instances m
JOIN instances o ON o.pool_id = m.pool_id AND o.network = 'private' AND o.tenant_id = m.tenant_id
    AND o.state <> 'deleted' AND o.desired_state <> 'deleted' AND o.node_id <> m.node_id
JOIN nodes n ON n.node_id = o.node_id
WHERE m.node_id = sqlc.arg(node_id) AND m.network = 'private' AND m.state <> 'deleted' AND m.desired_state <> 'deleted'
ORDER BY 1, 2;

-- name: PrivateNetworkNodes :many
-- The nodes carrying a tenant's private network of a pool, but one.
SELECT DISTINCT node_id::text AS node_id FROM instances
WHERE pool_id = sqlc.arg(pool_id) AND tenant_id = sqlc.arg(tenant_id) AND network = 'private'
  AND state <> 'deleted' AND desired_state <> 'deleted' AND node_id IS NOT NULL AND node_id <> sqlc.arg(exclude)::text
ORDER BY 1;
