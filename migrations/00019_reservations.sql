-- +goose Up
-- reservations: capacity held ahead of work, count units of a flavor.
-- Their bookings are rows of bookings (owner_type 'reservation'); queued
-- ones wait for the pool-lease worker (placement_items names the queue
-- items) or for preempted spot capacity (waiting_for_preemption).
CREATE TABLE reservations (
    reservation_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    flavor text NOT NULL,
    count integer NOT NULL CHECK (count BETWEEN 1 AND 64),
    priority text NOT NULL CHECK (priority IN ('on-demand', 'spot')),
    whole boolean NOT NULL,
    start_at timestamptz NOT NULL,
    end_at timestamptz,
    state text NOT NULL CHECK (state IN ('queued', 'placed', 'active', 'ended', 'cancelled', 'failed', 'preempting', 'preempted')),
    error text,
    placement_items text[] NOT NULL DEFAULT '{}',
    waiting_for_preemption boolean NOT NULL DEFAULT false,
    attempts integer NOT NULL DEFAULT 0,
    preempt_at timestamptz,
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (end_at IS NULL OR end_at > start_at)
);

CREATE INDEX reservations_tenant_idx ON reservations (tenant_id, created_at DESC);
CREATE INDEX reservations_live_idx ON reservations (pool_id, state) WHERE state IN ('queued', 'placed', 'active', 'preempting');

-- +goose Down
DROP TABLE reservations;
