-- +goose Up
-- secrets are write-only values named by a reference: secret://tenants/<tenantId>/<name>
-- for scope tenant, secret://fleet/<name> for scope fleet (owned by the root
-- tenant). One head row per reference records the store holding the versions,
-- the current version and the idempotency key of the put that wrote it; a
-- delete removes every version and keeps the head as a tombstone (deleted),
-- so versions of a reference are never reused.
CREATE TABLE secrets (
    reference text PRIMARY KEY,
    tenant_id text NOT NULL,
    scope text NOT NULL CHECK (scope IN ('tenant', 'fleet')),
    name text NOT NULL,
    store text NOT NULL,
    version bigint NOT NULL CHECK (version >= 1),
    idem_key text,
    deleted boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX secrets_tenant_idx ON secrets (tenant_id, scope, name);

-- secret_versions holds the sealed values of the database store: AES-256-GCM
-- under a key derived from the service secret, a random 12-byte nonce per
-- seal, the reference and version bound as additional data. Never the value.
CREATE TABLE secret_versions (
    reference text NOT NULL REFERENCES secrets (reference) ON DELETE CASCADE,
    version bigint NOT NULL CHECK (version >= 1),
    nonce bytea NOT NULL CHECK (length(nonce) = 12),
    sealed bytea NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (reference, version)
);

-- +goose Down
DROP TABLE secret_versions;
DROP TABLE secrets;
