-- +goose Up
-- Readers of the outbox need the order in which rows became visible, which
-- seq alone does not give (a transaction can commit after a later one
-- started). Each row records its transaction id; readers take only rows of
-- transactions older than their snapshot's xmin, which are all finished, in
-- (xid, seq) order, so a cursor over (xid, seq) never skips a late commit.
ALTER TABLE outbox ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX outbox_order_idx ON outbox (xid, seq);
CREATE INDEX outbox_tenant_order_idx ON outbox (tenant_id, xid, seq);
DROP INDEX outbox_tenant_idx;

-- +goose Down
CREATE INDEX outbox_tenant_idx ON outbox (tenant_id, seq);
DROP INDEX outbox_tenant_order_idx;
DROP INDEX outbox_order_idx;
ALTER TABLE outbox DROP COLUMN xid;
