-- +goose Up
-- join_tokens: single-use tokens that let one machine join a pool as a
-- node. The token itself is never stored: it is sealed to the join
-- service's key and carries its id; the row holds its state, and at first
-- use the key of the node's certificate request it is bound to.
CREATE TABLE join_tokens (
    token_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    pool_id text NOT NULL REFERENCES pools (pool_id),
    site_id text NOT NULL REFERENCES sites (site_id),
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked boolean NOT NULL DEFAULT false,
    used_at timestamptz,
    bound_key text,
    node_id text,
    CHECK ((used_at IS NULL) = (bound_key IS NULL))
);

CREATE INDEX join_tokens_site_idx ON join_tokens (site_id) WHERE NOT revoked;

-- +goose Down
DROP TABLE join_tokens;
