-- +goose Up
-- webhooks are per-tenant subscriptions of an https URL to event patterns.
--
-- The signing secret is sealed (AES-256-GCM under a key derived for
-- keys.Webhooks, a random nonce per seal, the webhook id and the secret's
-- generation as additional data); the value is shown once by create and
-- rotateSecret. During a rotation overlap the previous generation is kept
-- until previous_expires_at and both sign.
--
-- since_snapshot is the snapshot (pg_snapshot in text form) of the statement
-- that created or re-activated the webhook: an event is delivered only when
-- its transaction is not visible in it, that is when it had not committed
-- yet when the webhook was written. See internal/webhooks (FanOut).
CREATE TABLE webhooks (
    webhook_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    url text NOT NULL,
    events text[] NOT NULL CHECK (cardinality(events) BETWEEN 1 AND 20),
    description text NOT NULL DEFAULT '',
    active boolean NOT NULL DEFAULT true,
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    secret_gen bigint NOT NULL DEFAULT 1 CHECK (secret_gen >= 1),
    secret_nonce bytea NOT NULL CHECK (length(secret_nonce) = 12),
    secret_sealed bytea NOT NULL,
    previous_gen bigint,
    previous_nonce bytea CHECK (length(previous_nonce) = 12),
    previous_sealed bytea,
    previous_expires_at timestamptz,
    since_snapshot text NOT NULL DEFAULT pg_current_snapshot()::text,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CHECK ((previous_gen IS NULL) = (previous_sealed IS NULL)
       AND (previous_gen IS NULL) = (previous_nonce IS NULL)
       AND (previous_gen IS NULL) = (previous_expires_at IS NULL))
);

CREATE INDEX webhooks_tenant_idx ON webhooks (tenant_id, created_at, webhook_id);

-- webhook_deliveries is each webhook's delivery queue and history: one row
-- per (webhook, event) and per ping, with the exact body sent (the event's
-- CloudEvents JSON). A pending row is due at next_attempt_at; a worker
-- claims it by setting claimed_until (and its claim_token) so that a killed
-- worker's claim comes back once it passes. Deleting a webhook deletes its
-- rows.
CREATE TABLE webhook_deliveries (
    delivery_id text PRIMARY KEY,
    webhook_id text NOT NULL REFERENCES webhooks (webhook_id) ON DELETE CASCADE,
    tenant_id text NOT NULL,
    event_id text NOT NULL,
    event_type text NOT NULL,
    event_time timestamptz NOT NULL,
    body bytea NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'delivered', 'dead', 'cancelled')),
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz,
    claimed_until timestamptz,
    claim_token text,
    last_status integer,
    last_error text,
    last_attempt_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    UNIQUE (webhook_id, event_id),
    CHECK ((state = 'pending') = (next_attempt_at IS NOT NULL))
);

-- Due work, and what is in flight (claimed), stay small partial indexes.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at, webhook_id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_claimed_idx ON webhook_deliveries (webhook_id) WHERE state = 'pending' AND claimed_until IS NOT NULL;
-- deliveries: newest first per webhook.
CREATE INDEX webhook_deliveries_history_idx ON webhook_deliveries (webhook_id, created_at DESC, delivery_id DESC);

-- webhook_fanout is the fan-out's durable place in the outbox: the (xid,
-- seq) of the last outbox row it matched against the webhooks, moved in the
-- transaction that inserts the deliveries for the rows before it.
CREATE TABLE webhook_fanout (
    id text PRIMARY KEY,
    after_xid xid8 NOT NULL,
    after_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO webhook_fanout (id, after_xid, after_seq) VALUES ('webhooks', '0', 0);

-- +goose Down
DROP TABLE webhook_fanout;
DROP TABLE webhook_deliveries;
DROP TABLE webhooks;
