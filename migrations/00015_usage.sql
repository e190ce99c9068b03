-- +goose Up
-- Usage metering. An allocation measures one meter for one tenant (and
-- project) at a quantity per hour over [started_at, ended_at); it is
-- opened and closed in the transactions of the billable changes. Quantities
-- are integers in micro-units (1e-6 of the meter's unit) per hour, and a
-- window's quantity is an exact integer in micro-unit-milliseconds (the
-- per-hour quantity times the milliseconds of the hour it covers), so
-- prorating and summing never drift; the API shows quantity / 3.6e9.
CREATE TABLE allocations (
    allocation_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    project_id text,
    meter text NOT NULL,
    quantity_micro bigint NOT NULL CHECK (quantity_micro >= 0),
    tags jsonb NOT NULL DEFAULT '{}',
    owner_type text NOT NULL,
    owner_id text NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at timestamptz,
    -- The rollup has windowed every closed hour of the allocation before
    -- rolled_until; dirty marks a change (a close, a backfill) it has not seen.
    rolled_until timestamptz NOT NULL,
    dirty boolean NOT NULL DEFAULT true,
    CHECK (ended_at IS NULL OR ended_at >= started_at)
);

CREATE INDEX allocations_dirty_idx ON allocations (tenant_id) WHERE dirty OR ended_at IS NULL;
CREATE INDEX allocations_owner_idx ON allocations (owner_type, owner_id);

-- usage_windows are the hourly windows handed to billing. A window is never
-- changed once written (but for its hand-over outcome): a later correction
-- is an adjustment window of its own (key ...:adj<n>).
CREATE TABLE usage_windows (
    key text PRIMARY KEY,
    allocation_id text NOT NULL REFERENCES allocations (allocation_id),
    tenant_id text NOT NULL,
    project_id text,
    meter text NOT NULL,
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL,
    quantity_micro_ms bigint NOT NULL CHECK (quantity_micro_ms >= 0),
    tags jsonb NOT NULL DEFAULT '{}',
    adjustment integer NOT NULL DEFAULT 0 CHECK (adjustment >= 0),
    recorded_at timestamptz,
    outcome text CHECK (outcome IN ('recorded', 'duplicate', 'reattributed', 'dead-lettered')),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (allocation_id, window_start, adjustment),
    CHECK ((outcome IS NULL) = (recorded_at IS NULL))
);

CREATE INDEX usage_windows_tenant_idx ON usage_windows (tenant_id, window_start, key);
CREATE INDEX usage_windows_project_idx ON usage_windows (project_id, window_start, key) WHERE project_id IS NOT NULL;
CREATE INDEX usage_windows_pending_idx ON usage_windows (window_end, key) WHERE outcome IS NULL;

-- +goose Down
DROP TABLE usage_windows;
DROP TABLE allocations;
