-- +goose Up
-- visibility_frontier is the xid below which every transaction that could
-- have written to this database has finished, as the calling statement's
-- snapshot sees it: the oldest transaction of this database still in
-- progress, else the snapshot's xmax. The outbox and audit readers take
-- rows below it, in (xid, seq) order, so a cursor never passes a row that
-- commits later.
--
-- It is the snapshot's xmin except that transactions of other databases
-- of the cluster are left out (they cannot write here): a long transaction
-- elsewhere on a shared cluster no longer holds event delivery back.
-- Whose transaction an xid is comes from pg_stat_activity; an xid not found
-- there (finished meanwhile, a prepared transaction, or a role the service
-- may not see without pg_read_all_stats) counts as this database's, which
-- only ever holds rows back.
--
-- STABLE: it runs in the calling statement's snapshot.
-- +goose StatementBegin
CREATE FUNCTION visibility_frontier() RETURNS xid8 LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(x) FROM pg_snapshot_xip(s.snap) AS x
         WHERE NOT EXISTS (
             SELECT 1 FROM pg_stat_activity a
             WHERE a.backend_xid = x::xid
               AND a.datid IS DISTINCT FROM (SELECT oid FROM pg_database WHERE datname = current_database()))),
        pg_snapshot_xmax(s.snap))
    FROM (SELECT pg_current_snapshot() AS snap) AS s
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION visibility_frontier();
