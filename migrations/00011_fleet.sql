-- +goose Up
-- The fleet core: pools, their flavors, nodes, quotas and the bookings that
-- place work on nodes. Over-commit is prevented by the database itself, not
-- only by the placement code: a node's booked amounts can never pass its
-- capacity (CHECK), a quota's used can never pass its max (CHECK), and two
-- whole-node bookings of one node can never overlap in time (EXCLUDE).

CREATE TABLE pools (
    pool_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    site_id text NOT NULL REFERENCES sites (site_id),
    name text NOT NULL,
    class text NOT NULL CHECK (class IN ('metal-host', 'vps-host')),
    hosting text NOT NULL CHECK (hosting IN ('hosted', 'provider')),
    account_id text,
    runtime text,
    agent text,
    archived boolean NOT NULL DEFAULT false,
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((hosting = 'provider') = (account_id IS NOT NULL))
);

CREATE UNIQUE INDEX pools_live_name_idx ON pools (tenant_id, name) WHERE NOT archived;
CREATE INDEX pools_site_idx ON pools (site_id);

CREATE TABLE flavors (
    pool_id text NOT NULL REFERENCES pools (pool_id),
    name text NOT NULL,
    vcpu integer NOT NULL CHECK (vcpu > 0),
    memory_mib bigint NOT NULL CHECK (memory_mib > 0),
    disk_gib bigint NOT NULL CHECK (disk_gib >= 0),
    gpu_model text,
    gpus integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    archived boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool_id, name),
    CHECK ((gpus = 0) = (gpu_model IS NULL))
);

-- A node's capacity and what is booked on it, in one row so that a booking
-- is one conditional UPDATE; the free amounts are stored so placement can
-- walk an index in score order.
CREATE TABLE nodes (
    node_id text PRIMARY KEY,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    site_id text NOT NULL REFERENCES sites (site_id),
    hostname text NOT NULL,
    state text NOT NULL CHECK (state IN ('joining', 'ready', 'cordoned', 'draining', 'retired', 'down')),
    labels jsonb NOT NULL DEFAULT '{}',
    cap_vcpu integer NOT NULL CHECK (cap_vcpu >= 0),
    cap_memory_mib bigint NOT NULL CHECK (cap_memory_mib >= 0),
    cap_disk_gib bigint NOT NULL CHECK (cap_disk_gib >= 0),
    gpu_model text,
    cap_gpus integer NOT NULL DEFAULT 0 CHECK (cap_gpus >= 0),
    booked_vcpu integer NOT NULL DEFAULT 0,
    booked_memory_mib bigint NOT NULL DEFAULT 0,
    booked_disk_gib bigint NOT NULL DEFAULT 0,
    booked_gpus integer NOT NULL DEFAULT 0,
    -- The volume store the host reported (bytes); null until it reports.
    volume_available_bytes bigint,
    volume_reserved_bytes bigint,
    volume_outstanding_bytes bigint,
    volume_reported_at timestamptz,
    agent_version text,
    agent_protocol integer,
    cert_not_after timestamptz,
    session_gateway text,
    session_since timestamptz,
    -- declared: entered by an operator with a declared capacity (computed
    -- nodes register), run by no daemon, so never down for want of a session.
    declared boolean NOT NULL DEFAULT false,
    free_vcpu integer GENERATED ALWAYS AS (cap_vcpu - booked_vcpu) STORED,
    free_memory_mib bigint GENERATED ALWAYS AS (cap_memory_mib - booked_memory_mib) STORED,
    version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT nodes_booked_within_capacity CHECK (
        booked_vcpu BETWEEN 0 AND cap_vcpu
        AND booked_memory_mib BETWEEN 0 AND cap_memory_mib
        AND booked_disk_gib BETWEEN 0 AND cap_disk_gib
        AND booked_gpus BETWEEN 0 AND cap_gpus)
);

CREATE INDEX nodes_pool_idx ON nodes (pool_id, node_id);
-- Placement's walk: ready nodes of a pool by free vCPU (pack ascending,
-- spread descending).
CREATE INDEX nodes_placement_idx ON nodes (pool_id, free_vcpu, node_id) WHERE state = 'ready';

-- A booking holds capacity of one node for an owner (an instance, a
-- reservation, a volume ...) over a time range; released bookings keep
-- their row with the range closed. Whole-node bookings take the node's
-- full capacity and may not overlap.
CREATE TABLE bookings (
    booking_id text PRIMARY KEY,
    node_id text NOT NULL REFERENCES nodes (node_id),
    pool_id text NOT NULL REFERENCES pools (pool_id),
    tenant_id text NOT NULL,
    owner_type text NOT NULL,
    owner_id text NOT NULL,
    whole boolean NOT NULL DEFAULT false,
    vcpu integer NOT NULL CHECK (vcpu >= 0),
    memory_mib bigint NOT NULL CHECK (memory_mib >= 0),
    disk_gib bigint NOT NULL CHECK (disk_gib >= 0),
    gpus integer NOT NULL CHECK (gpus >= 0),
    during tstzrange NOT NULL,
    released boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT bookings_whole_node_no_overlap
        EXCLUDE USING gist (node_id WITH =, during WITH &&) WHERE (whole AND NOT released)
);

CREATE INDEX bookings_owner_idx ON bookings (owner_type, owner_id);
CREATE INDEX bookings_node_idx ON bookings (node_id) WHERE NOT released;

-- quotas cap what one tenant may hold in one pool, per resource. A missing
-- row grants nothing.
CREATE TABLE quotas (
    tenant_id text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    resource text NOT NULL CHECK (resource IN ('vcpu', 'memoryMiB', 'diskGiB', 'gpus', 'instances', 'sandboxes', 'nodes')),
    max bigint NOT NULL CHECK (max >= 0),
    used bigint NOT NULL DEFAULT 0,
    offered boolean NOT NULL DEFAULT true,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, pool_id, resource),
    CONSTRAINT quotas_used_within_max CHECK (used BETWEEN 0 AND max)
);

-- placement_queue holds admissions waiting for their pool's worker
-- (capacity.placer pool-lease): queued until placed, or failed after
-- capacity.maxAttempts passes without room or at once for a spent quota.
CREATE TABLE placement_queue (
    item_id text PRIMARY KEY,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    tenant_id text NOT NULL,
    request jsonb NOT NULL,
    state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'placed', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    booking_id text,
    node_id text,
    error jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    decided_at timestamptz
);

CREATE INDEX placement_queue_pool_idx ON placement_queue (pool_id, created_at, item_id) WHERE state = 'queued';

-- +goose Down
DROP TABLE placement_queue;
DROP TABLE quotas;
DROP TABLE bookings;
DROP TABLE nodes;
DROP TABLE flavors;
DROP TABLE pools;
