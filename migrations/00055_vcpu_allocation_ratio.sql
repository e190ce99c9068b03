-- +goose Up
-- A pool's vCPU allocation ratio (OpenStack's cpu_allocation_ratio):
-- placement books up to floor(cap_vcpu * ratio) vCPU on each of its nodes,
-- so a sandbox pool can run more 1-vCPU guests than its hosts have cores.
-- Memory, disk and GPUs are never overcommitted. Each node keeps a copy of
-- its pool's ratio so that what it can take stays a stored column of its
-- own row: the conditional booking UPDATE, the capacity CHECK and
-- placement's index all read it without a join.
ALTER TABLE pools ADD COLUMN vcpu_allocation_ratio numeric(4, 2) NOT NULL DEFAULT 1.0
    CHECK (vcpu_allocation_ratio BETWEEN 1 AND 16);
ALTER TABLE nodes ADD COLUMN vcpu_allocation_ratio numeric(4, 2) NOT NULL DEFAULT 1.0
    CHECK (vcpu_allocation_ratio BETWEEN 1 AND 16);

DROP INDEX nodes_placement_idx;
ALTER TABLE nodes DROP CONSTRAINT nodes_booked_within_capacity;
ALTER TABLE nodes DROP COLUMN free_vcpu;
ALTER TABLE nodes
    ADD COLUMN alloc_vcpu integer NOT NULL GENERATED ALWAYS AS (floor(cap_vcpu * vcpu_allocation_ratio)::integer) STORED,
    ADD COLUMN free_vcpu integer NOT NULL GENERATED ALWAYS AS (floor(cap_vcpu * vcpu_allocation_ratio)::integer - booked_vcpu) STORED;
ALTER TABLE nodes ADD CONSTRAINT nodes_booked_within_capacity CHECK (
    booked_vcpu BETWEEN 0 AND alloc_vcpu
    AND booked_memory_mib BETWEEN 0 AND cap_memory_mib
    AND booked_disk_gib BETWEEN 0 AND cap_disk_gib
    AND booked_gpus BETWEEN 0 AND cap_gpus);
CREATE INDEX nodes_placement_idx ON nodes (pool_id, free_vcpu, node_id) WHERE state = 'ready';

-- +goose Down
DROP INDEX nodes_placement_idx;
ALTER TABLE nodes DROP CONSTRAINT nodes_booked_within_capacity;
ALTER TABLE nodes DROP COLUMN free_vcpu, DROP COLUMN alloc_vcpu;
ALTER TABLE nodes ADD COLUMN free_vcpu integer GENERATED ALWAYS AS (cap_vcpu - booked_vcpu) STORED;
ALTER TABLE nodes ADD CONSTRAINT nodes_booked_within_capacity CHECK (
    booked_vcpu BETWEEN 0 AND cap_vcpu
    AND booked_memory_mib BETWEEN 0 AND cap_memory_mib
    AND booked_disk_gib BETWEEN 0 AND cap_disk_gib
    AND booked_gpus BETWEEN 0 AND cap_gpus);
CREATE INDEX nodes_placement_idx ON nodes (pool_id, free_vcpu, node_id) WHERE state = 'ready';
ALTER TABLE nodes DROP COLUMN vcpu_allocation_ratio;
ALTER TABLE pools DROP COLUMN vcpu_allocation_ratio;
