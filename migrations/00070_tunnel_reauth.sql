-- +goose Up
-- The re-authorizer (docs/tunnels.md): an open tunnel remembers the
-- session that asked for it (closed when that session or credential is
-- revoked) and its caller (re-decided when the identity's role changes).
ALTER TABLE tunnels ADD COLUMN session text NOT NULL DEFAULT '';
ALTER TABLE tunnels ADD COLUMN caller jsonb;

-- +goose Down
ALTER TABLE tunnels DROP COLUMN caller;
ALTER TABLE tunnels DROP COLUMN session;
