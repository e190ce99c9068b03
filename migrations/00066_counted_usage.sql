-- +goose Up
-- Counted usage (issue 23): a meter a node counts rather than a rate over
-- time, a VM's egress bytes. egress_counters holds, per instance, the last
-- cumulative counters its daemon reported (they restart from zero when the
-- daemon's manager restarts or the VM's tap is re-created); the growth
-- since goes to counted_usage, one row per tenant, project, instance,
-- meter and hour, in the status's transaction.
CREATE TABLE egress_counters (
    instance_id text PRIMARY KEY,
    -- The node that counted: another node's counters are a new count.
    node_id text NOT NULL,
    tx_bytes bigint NOT NULL CHECK (tx_bytes >= 0),
    rx_bytes bigint NOT NULL CHECK (rx_bytes >= 0),
    updated_at timestamptz NOT NULL
);

CREATE INDEX egress_counters_node_idx ON egress_counters (node_id);

-- quantity is in the meter's unit (bytes); the rollup windows a closed
-- hour's quantity - windowed, so bytes added after a window was written
-- (a status of the hour committed late) become an adjustment window.
CREATE TABLE counted_usage (
    counted_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    project_id text,
    instance_id text NOT NULL,
    meter text NOT NULL,
    hour_start timestamptz NOT NULL CHECK (date_trunc('hour', hour_start) = hour_start),
    quantity bigint NOT NULL CHECK (quantity >= 0),
    windowed bigint NOT NULL DEFAULT 0 CHECK (windowed >= 0 AND windowed <= quantity),
    windows integer NOT NULL DEFAULT 0,
    UNIQUE NULLS NOT DISTINCT (tenant_id, project_id, instance_id, meter, hour_start)
);

CREATE INDEX counted_usage_to_roll_idx ON counted_usage (tenant_id, hour_start) WHERE quantity > windowed;

-- A window comes from an allocation (quantity_micro_ms) or from a counted
-- row (quantity_units, in the meter's unit; quantity_micro_ms is 0).
ALTER TABLE usage_windows
    ALTER COLUMN allocation_id DROP NOT NULL,
    ADD COLUMN counted_id text REFERENCES counted_usage (counted_id),
    ADD COLUMN quantity_units bigint CHECK (quantity_units >= 0),
    ADD CONSTRAINT usage_windows_source CHECK ((allocation_id IS NULL) <> (counted_id IS NULL)),
    ADD CONSTRAINT usage_windows_units CHECK ((counted_id IS NULL) = (quantity_units IS NULL));

-- +goose Down
DELETE FROM usage_windows WHERE counted_id IS NOT NULL;
ALTER TABLE usage_windows DROP CONSTRAINT usage_windows_units, DROP CONSTRAINT usage_windows_source,
    DROP COLUMN quantity_units, DROP COLUMN counted_id, ALTER COLUMN allocation_id SET NOT NULL;
DROP TABLE counted_usage;
DROP TABLE egress_counters;
