-- +goose Up
-- Tunnels to a guest port (kind tcp) and to an instance's serial console
-- (kind console), and a program's terminal size at the start (exec with
-- tty). The kind check names every kind of issue 24, so the migrations of
-- the kinds built apart (ssh, node-console) need not change it again.
ALTER TABLE tunnels DROP CONSTRAINT tunnels_kind_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_kind_check CHECK (kind IN ('exec', 'tcp', 'console', 'node-console', 'ssh'));
ALTER TABLE tunnels ADD COLUMN port integer CHECK (port BETWEEN 1 AND 65535);
ALTER TABLE tunnels ADD COLUMN term_cols integer;
ALTER TABLE tunnels ADD COLUMN term_rows integer;

-- +goose Down
ALTER TABLE tunnels DROP COLUMN term_rows;
ALTER TABLE tunnels DROP COLUMN term_cols;
ALTER TABLE tunnels DROP COLUMN port;
ALTER TABLE tunnels DROP CONSTRAINT tunnels_kind_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_kind_check CHECK (kind IN ('exec'));
