-- +goose Up
-- value_digest is HMAC-SHA256 of the reference and the value under a key
-- derived from the service secret (keys.SecretDigests): a put whose
-- idempotency key is the current version's but whose value differs is a
-- CONFLICT, found without opening the sealed value. Never the value itself;
-- versions written before this migration have none (the service then
-- opens the sealed value to compare, see internal/secrets).
ALTER TABLE secret_versions ADD COLUMN value_digest bytea CHECK (length(value_digest) = 32);

-- +goose Down
ALTER TABLE secret_versions DROP COLUMN value_digest;
