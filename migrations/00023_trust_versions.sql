-- +goose Up
-- trust_versions: the trust bundle's version, by its fingerprint (the
-- CAs and the command key): pki.trustVersion is the lowest, and a changed
-- bundle takes the next version by itself.
CREATE TABLE trust_versions (
    fingerprint text PRIMARY KEY,
    version integer NOT NULL UNIQUE CHECK (version >= 1),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE trust_versions;
