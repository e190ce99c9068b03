-- +goose Up
-- Drafts a killed process left behind are swept by age (the iam role's
-- draft sweep); this index keeps the sweep from reading real resources.
CREATE INDEX resources_drafts ON iam.resources (updated_at) WHERE draft;

-- +goose Down
DROP INDEX iam.resources_drafts;
