-- +goose Up
-- The embedded identity service (internal/iam/embedded) keeps its state in
-- its own schema, so that an external identity service can replace it
-- without touching the control plane's tables. The policy these tables feed
-- is written down in docs/identity.md.
CREATE SCHEMA iam;

CREATE TABLE iam.tenants (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9._:-]{1,128}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- An identity id is unique across tenants; tenant_id is its home tenant.
CREATE TABLE iam.identities (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9._:@-]{1,128}$'),
    tenant_id text NOT NULL REFERENCES iam.tenants (id),
    kind text NOT NULL CHECK (kind IN ('user', 'service', 'agent')),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One role per identity and tenant: keys carry the role of their identity,
-- so a second role would silently widen or narrow keys already issued.
CREATE TABLE iam.role_bindings (
    tenant_id text NOT NULL REFERENCES iam.tenants (id),
    identity_id text NOT NULL REFERENCES iam.identities (id),
    role text NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'viewer')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, identity_id)
);

-- A delegation lets an agent act for an identity; the listed actions are
-- held for confirmation.
CREATE TABLE iam.delegations (
    id text PRIMARY KEY,
    tenant_id text NOT NULL REFERENCES iam.tenants (id),
    identity_id text NOT NULL REFERENCES iam.identities (id),
    agent_id text NOT NULL,
    confirm_actions text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored as the SHA-256 of the whole token, never the token.
CREATE TABLE iam.api_keys (
    id text PRIMARY KEY CHECK (id ~ '^[0-9a-hjkmnp-tv-z]{16}$'),
    tenant_id text NOT NULL REFERENCES iam.tenants (id),
    identity_id text NOT NULL REFERENCES iam.identities (id),
    token_hash bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    mfa boolean NOT NULL DEFAULT false,
    agent_id text,
    delegation_id text REFERENCES iam.delegations (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CHECK ((agent_id IS NULL) = (delegation_id IS NULL))
);

CREATE INDEX api_keys_tenant ON iam.api_keys (tenant_id, created_at);

CREATE TABLE iam.confirmations (
    id text PRIMARY KEY,
    delegation_id text NOT NULL REFERENCES iam.delegations (id),
    action text NOT NULL,
    resource_type text NOT NULL,
    resource_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- The authorization projection: what decisions are made on. A draft is
-- written only so that a create can be decided on it; Put makes it real.
CREATE TABLE iam.resources (
    type text NOT NULL,
    id text NOT NULL,
    tenant_id text NOT NULL CHECK (tenant_id <> ''),
    parent_type text,
    parent_id text,
    owner_id text,
    attributes jsonb NOT NULL DEFAULT '{}',
    draft boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (type, id),
    CHECK ((parent_type IS NULL) = (parent_id IS NULL))
);

CREATE INDEX resources_parent ON iam.resources (parent_type, parent_id) WHERE parent_type IS NOT NULL;

CREATE TABLE iam.relationships (
    resource_type text NOT NULL,
    resource_id text NOT NULL,
    relation text NOT NULL CHECK (relation <> ''),
    identity_id text NOT NULL CHECK (identity_id <> ''),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_type, resource_id, relation, identity_id)
);

CREATE INDEX relationships_identity ON iam.relationships (identity_id, relation);

-- Identity events for the workers (drop caches, close streams). Writers
-- serialize on an advisory lock so that seq order is commit order and a
-- reader paging by seq never skips a row that commits late.
CREATE TABLE iam.inbox (
    seq bigserial PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    type text NOT NULL,
    identity_id text NOT NULL,
    session text NOT NULL,
    at timestamptz NOT NULL
);

-- The billing bridge: one row per usage window handed over, by its
-- idempotency key.
CREATE TABLE iam.usage_records (
    key text PRIMARY KEY CHECK (key <> '' AND length(key) <= 256),
    tenant_id text NOT NULL CHECK (tenant_id <> ''),
    meter text NOT NULL CHECK (meter <> ''),
    quantity double precision NOT NULL CHECK (quantity >= 0 AND quantity < 'Infinity'),
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL,
    tags jsonb NOT NULL DEFAULT '{}',
    outcome text NOT NULL CHECK (outcome IN ('recorded', 'reattributed')),
    recorded_at timestamptz NOT NULL,
    CHECK (window_end > window_start)
);

CREATE INDEX usage_records_tenant ON iam.usage_records (tenant_id, window_start);

-- Windows billing refused, with the error, kept for an operator. No
-- constraints beyond the error: whatever was refused must fit here.
CREATE TABLE iam.usage_dead_letters (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    tenant_id text NOT NULL,
    meter text NOT NULL,
    quantity double precision NOT NULL,
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL,
    tags jsonb NOT NULL DEFAULT '{}',
    error text NOT NULL,
    at timestamptz NOT NULL
);

CREATE INDEX usage_dead_letters_key ON iam.usage_dead_letters (key);

-- +goose Down
DROP SCHEMA iam CASCADE;
