-- +goose Up
-- projects group a tenant's work. Membership is not here: it is a
-- relationship of the identity service (iam.relationships for the embedded
-- one) on compute-project/{id}.
CREATE TABLE projects (
    project_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    description text NOT NULL DEFAULT '',
    owner text NOT NULL,
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    idem_request jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX projects_name_idx ON projects (tenant_id, name);

-- +goose Down
DROP TABLE projects;
