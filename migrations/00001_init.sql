-- +goose Up
-- btree_gist gives the range exclusion constraints that make double-booking
-- a node impossible (EXCLUDE USING gist (node_id WITH =, during WITH &&)).
CREATE EXTENSION IF NOT EXISTS btree_gist;

-- service_meta holds deployment-wide facts as key/value pairs.
CREATE TABLE service_meta (
    key text PRIMARY KEY,
    value text NOT NULL
);

-- +goose Down
DROP TABLE service_meta;
DROP EXTENSION IF EXISTS btree_gist;
