-- +goose Up
-- The gateway's internal control API (mutual TLS with the internal CA),
-- where the api reaches it at once: wake-ups, revocations.
ALTER TABLE gateways ADD COLUMN internal_url text;

-- +goose Down
ALTER TABLE gateways DROP COLUMN internal_url;
