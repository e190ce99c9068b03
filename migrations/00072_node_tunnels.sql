-- +goose Up
-- Break-glass tunnels to a node (tunnels.openNode, docs/tunnels.md "Nodes"):
-- a row's target may be a node; its instance_id is then empty.
ALTER TABLE tunnels DROP CONSTRAINT tunnels_target_kind_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_target_kind_check CHECK (target_kind IN ('instance', 'sandbox', 'node'));

-- +goose Down
DELETE FROM tunnels WHERE target_kind = 'node';
ALTER TABLE tunnels DROP CONSTRAINT tunnels_target_kind_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_target_kind_check CHECK (target_kind IN ('instance', 'sandbox'));
