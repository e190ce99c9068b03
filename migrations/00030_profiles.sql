-- +goose Up
-- profiles: the stored profile versions of tenants (module-shipped ones,
-- tenant builtin, are embedded in the binary and never stored). Ids and
-- tenants sort bytewise (collation C) so that profiles.list can merge the
-- stored rows with the embedded ones in one order. locked_at is set the
-- first time a workflow uses the version: its document is immutable from
-- then on. A delete removes the row: running workflows keep the snapshot
-- of the steps they copied at start.
CREATE TABLE profiles (
    tenant_id text COLLATE "C" NOT NULL,
    profile_id text COLLATE "C" NOT NULL,
    profile_version integer NOT NULL CHECK (profile_version BETWEEN 1 AND 1000000),
    document jsonb NOT NULL,
    visibility text NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'public')),
    version bigint NOT NULL DEFAULT 1,
    locked_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, profile_id, profile_version)
);

CREATE INDEX profiles_public_idx ON profiles (profile_id, profile_version, tenant_id) WHERE visibility = 'public';
CREATE INDEX profiles_order_idx ON profiles (profile_id, profile_version, tenant_id);

-- +goose Down
DROP TABLE profiles;
