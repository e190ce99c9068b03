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
