-- +goose Up
-- workers lists the processes running worker roles. A worker is live while
-- its heartbeat is younger than 30 s; a stopping worker deletes its row, a
-- killed one is skipped once its heartbeat is stale and deleted later by
-- the others. jobs and reconcilers name what the worker registered, so that
-- a lease is only ever assigned to a worker able to do its work.
CREATE TABLE workers (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    jobs text[] NOT NULL DEFAULT '{}',
    reconcilers text[] NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX workers_heartbeat_idx ON workers (heartbeat_at);

-- leases grants exclusive work (shard/0..shard/255, job/<name>, a gateway)
-- to one holder until expires_at. Every acquisition raises epoch, and every
-- write done under a lease checks (holder, epoch) in its own transaction,
-- so a holder that lost the lease cannot write. A lease is free when
-- expires_at has passed; releasing sets it to now().
CREATE TABLE leases (
    name text PRIMARY KEY,
    holder text NOT NULL,
    epoch bigint NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE leases;
DROP TABLE workers;
