-- +goose Up
-- visibility_frontier (00045) as a view, which the outbox and audit readers
-- read: a SQL function whose body has a FROM is not inlined, so PostgreSQL
-- planned that body again at every call (0.4 ms of the outbox reader's 0.5
-- to 1 ms, and the reader runs after every commit with events), where a
-- view is expanded into the statement that reads it and planned once with
-- its prepared statement. The function now reads the view: one definition.
--
-- The body is 00045's, with pg_stat_activity and pg_database read through
-- the functions beneath them (pg_stat_get_activity; the caller's own
-- backend gives the database's oid), which sqlc knows.
CREATE VIEW visibility_frontier_now AS
SELECT coalesce(
    (SELECT min(x) FROM pg_snapshot_xip(s.snap) AS x
     WHERE NOT EXISTS (
         SELECT 1 FROM pg_stat_get_activity(NULL::integer) AS a
         WHERE a.backend_xid = x::xid
           AND a.datid IS DISTINCT FROM (SELECT me.datid FROM pg_stat_get_activity(pg_backend_pid()) AS me))),
    pg_snapshot_xmax(s.snap)) AS frontier
FROM (SELECT pg_current_snapshot() AS snap) AS s;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION visibility_frontier() RETURNS xid8 LANGUAGE sql STABLE AS $$
    SELECT frontier FROM visibility_frontier_now
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION visibility_frontier() RETURNS xid8 LANGUAGE sql STABLE AS $$
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
DROP VIEW visibility_frontier_now;
