-- +goose Up
-- sandbox_templates: what a tenant's sandboxes run. volumes holds the
-- mounts as given and the volume each resolved to at the last decision.
CREATE TABLE sandbox_templates (
    template_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    flavor text NOT NULL,
    image_id text NOT NULL,
    runtime text NOT NULL,
    user_data text,
    default_ttl_seconds integer NOT NULL,
    max_ttl_seconds integer NOT NULL,
    warm_min integer NOT NULL,
    warm_max integer NOT NULL,
    env jsonb NOT NULL DEFAULT '{}',
    network text NOT NULL,
    volumes jsonb NOT NULL DEFAULT '[]',
    owner text NOT NULL,
    version bigint NOT NULL DEFAULT 1,
    deleted boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (default_ttl_seconds <= max_ttl_seconds),
    CHECK (warm_min <= warm_max)
);

CREATE UNIQUE INDEX sandbox_templates_live_name_idx ON sandbox_templates (tenant_id, name) WHERE NOT deleted;

-- +goose Down
DROP TABLE sandbox_templates;
