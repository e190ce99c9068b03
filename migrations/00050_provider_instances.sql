-- +goose Up
-- Instances of provider pools run on a machine of the pool's provider
-- account rather than on a node: the provider-instances job launches it
-- (provider_offer, the offer chosen for the flavor; provider_machine, what
-- the provider made), watches it, and releases it when the instance is
-- deleted. Provider calls are retried with backoff (provider_attempts,
-- provider_next_at) before the instance fails.
ALTER TABLE instances
    ADD COLUMN provider_machine text,
    ADD COLUMN provider_offer text,
    ADD COLUMN provider_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN provider_next_at timestamptz;
-- The job's work: provider instances to launch, watch or release.
CREATE INDEX instances_provider_due_idx ON instances (provider_next_at)
    WHERE provider_next_at IS NOT NULL;

-- +goose Down
DROP INDEX instances_provider_due_idx;
ALTER TABLE instances DROP COLUMN provider_next_at, DROP COLUMN provider_attempts,
    DROP COLUMN provider_offer, DROP COLUMN provider_machine;
