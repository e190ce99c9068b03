-- +goose Up
-- A daemon's status finds the sandbox of each VM it moved (by instance_id):
-- without an index each lookup scanned every sandbox ever made, deleted
-- ones included.
CREATE INDEX sandboxes_instance_idx ON sandboxes (instance_id);

-- +goose Down
DROP INDEX sandboxes_instance_idx;
