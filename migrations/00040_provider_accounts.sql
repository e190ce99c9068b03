-- +goose Up
-- provider_accounts: a tenant's connection to a provider registered on the
-- service. config holds what the tenant gave, secret-like fields only as
-- secret://, vault:// or env:// references: values are resolved when the
-- provider is called and never written here.
CREATE TABLE provider_accounts (
    account_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    provider text NOT NULL,
    name text NOT NULL,
    config jsonb NOT NULL,
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_by text NOT NULL,
    -- The fingerprint of the create that made it under a key (null without
    -- a key): a retry is compared with it.
    idem_request jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

-- provider_bootstraps: turning one machine of an account into a node of a
-- pool, driven by the bootstrap reconciler. The join token it mints is
-- never stored: token_id is the id of its join_tokens row.
CREATE TABLE provider_bootstraps (
    bootstrap_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    account_id text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    machine_id text,
    offer_id text,
    -- claimed: the machine was claimed for this bootstrap (released again
    -- when the bootstrap fails); an identified machine is never released.
    claimed boolean NOT NULL DEFAULT false,
    state text NOT NULL CHECK (state IN ('identifying', 'claiming', 'installing', 'joining', 'joined', 'failed')),
    token_id text,
    node_id text,
    error text,
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    idem_request jsonb NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    machine_at timestamptz,   -- the machine identified or claimed
    installed_at timestamptz, -- the daemon delivered
    finished_at timestamptz,  -- joined or failed
    CHECK ((machine_id IS NOT NULL) OR (offer_id IS NOT NULL))
);

CREATE INDEX provider_bootstraps_due_idx ON provider_bootstraps (next_attempt_at) WHERE state NOT IN ('joined', 'failed');
CREATE INDEX provider_bootstraps_account_idx ON provider_bootstraps (account_id);
CREATE INDEX pools_account_idx ON pools (account_id) WHERE account_id IS NOT NULL;

-- +goose Down
DROP INDEX pools_account_idx;
DROP TABLE provider_bootstraps;
DROP TABLE provider_accounts;
