-- +goose Up
-- Tunnels of kind ssh (docs/tunnels.md, "SSH"): a byte stream to the
-- guest's SSH server.
ALTER TABLE tunnels DROP CONSTRAINT tunnels_kind_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_kind_check CHECK (kind IN ('exec', 'ssh'));

-- +goose Down
DELETE FROM tunnels WHERE kind = 'ssh';
ALTER TABLE tunnels DROP CONSTRAINT tunnels_kind_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_kind_check CHECK (kind IN ('exec'));
