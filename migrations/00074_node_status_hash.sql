-- +goose Up
-- The hash of the last status a daemon's session wrote (issue 26 item 7):
-- a daemon that reconnects after a gateway restart sends the status it
-- sent before, and the new session skips writing it again when it hashes
-- the same. NULL when unknown: the session open clears it when the hello's
-- observed generation differs from the row's, and a node marked down
-- loses it, so its first status after coming back is written.
ALTER TABLE nodes ADD COLUMN status_hash bigint;

-- +goose Down
ALTER TABLE nodes DROP COLUMN status_hash;
