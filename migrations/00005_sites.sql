-- +goose Up
-- sites are boot and failure domains. A deleted site's row is removed, or
-- kept as a tombstone while something still references it. A create keeps
-- its idempotency key's request fingerprint so a retry is compared with it.
CREATE TABLE sites (
    site_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('shared', 'dedicated', 'custom')),
    region text NOT NULL,
    iam_region text,
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    tombstoned boolean NOT NULL DEFAULT false,
    created_by text NOT NULL,
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX sites_tenant_idx ON sites (tenant_id, site_id);

-- +goose Down
DROP TABLE sites;
