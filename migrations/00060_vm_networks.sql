-- +goose Up
-- VM networks (issue 23, docs/networking.md). Each instances row (a VPS,
-- a warm instance, a sandbox's VM) has a network mode and, in egress and
-- private mode, an address the control plane allocates from its tenant's
-- subnet of the pool (vm_subnets). Rows from before keep 'none': their VMs
-- had no network card and still have none.
ALTER TABLE instances
    ADD COLUMN network text NOT NULL DEFAULT 'none' CHECK (network IN ('none', 'egress', 'private')),
    -- The VM's address with its subnet's length, e.g. 10.200.3.7/24.
    ADD COLUMN net_address text,
    -- The VM's own egress policy: {"allow": [...], "deny": [...]} of CIDRs
    -- and (allow only) domain names, as the API took it.
    ADD COLUMN egress_policy jsonb,
    ADD CONSTRAINT instances_net_address_mode CHECK ((network = 'none') = (net_address IS NULL));

-- No two live VMs of a pool share an address; a row's address is free
-- again once the row is deleted (its VM gone from the node), so a restore
-- or a claim never reuses a live one.
CREATE UNIQUE INDEX instances_net_address_idx ON instances (pool_id, network, net_address)
    WHERE net_address IS NOT NULL AND state <> 'deleted';

-- A tenant's subnet of a pool's range for a mode: one /24 each, taken at
-- its first VM of that mode in the pool and kept (a tenant's egress bridge
-- on each node holds the subnet's first address as the VMs' gateway).
CREATE TABLE vm_subnets (
    pool_id text NOT NULL REFERENCES pools (pool_id),
    network text NOT NULL CHECK (network IN ('egress', 'private')),
    tenant_id text NOT NULL,
    subnet text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool_id, network, tenant_id),
    UNIQUE (pool_id, network, subnet)
);

ALTER TABLE sandbox_templates ADD COLUMN egress_policy jsonb;

-- +goose Down
ALTER TABLE sandbox_templates DROP COLUMN egress_policy;
DROP TABLE vm_subnets;
DROP INDEX instances_net_address_idx;
ALTER TABLE instances DROP CONSTRAINT instances_net_address_mode,
    DROP COLUMN egress_policy, DROP COLUMN net_address, DROP COLUMN network;
