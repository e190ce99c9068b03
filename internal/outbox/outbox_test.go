package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/dbtest"
	"computeplane/internal/outbox"
)

func write(t *testing.T, tx pgx.Tx, tenant, subject string) {
	t.Helper()
	require.NoError(t, outbox.Write(t.Context(), tx, outbox.Event{
		Type: api.EventSiteDeleted, Subject: subject, TenantID: tenant,
		Data: api.SiteDeletedPayload{SiteID: subject},
	}))
}

// A row of a transaction still open is not read, nor any row after it in
// visibility order, until it commits; then the reader finds it after its
// cursor even though its seq is smaller than rows it already took.
func TestCommittedNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	q := st.Queries()

	slow, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(context.WithoutCancel(ctx)) }()
	write(t, slow, "acme", "late") // smaller seq, commits last

	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		write(t, tx, "acme", "early")
		return nil
	}))
	rows, err := outbox.Committed(ctx, q, "", outbox.Position{}, 100)
	require.NoError(t, err)
	assert.Empty(t, rows, "an open older transaction holds back what follows it")

	require.NoError(t, slow.Commit(ctx))
	// Other transactions of this database (the store's own) may hold the
	// frontier back for a moment.
	require.Eventually(t, func() bool {
		rows, err = outbox.Committed(ctx, q, "", outbox.Position{}, 100)
		return err == nil && len(rows) == 2
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "late", rows[0].Event.Subject, "visibility order: the older transaction first")
	assert.Equal(t, "early", rows[1].Event.Subject)

	// Paging by position; tenant filter.
	page, err := outbox.Committed(ctx, q, "", rows[0].Position, 100)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, "early", page[0].Event.Subject)
	none, err := outbox.Committed(ctx, q, "globex", outbox.Position{}, 100)
	require.NoError(t, err)
	assert.Empty(t, none)

	p, err := outbox.ParsePosition(rows[1].Position.String())
	require.NoError(t, err)
	assert.Equal(t, rows[1].Position, p)
	for _, bad := range []string{"", "x.1", "1", "1.-1", "-1.1"} {
		_, err := outbox.ParsePosition(bad)
		assert.Error(t, err, bad)
	}
	env := rows[0].Event
	assert.Equal(t, "1.0", env.SpecVersion)
	assert.Equal(t, "computeplane/sites", env.Source)
	assert.Equal(t, "application/json", env.DataContentType)
	assert.Equal(t, "acme", env.TenantID)
	assert.Regexp(t, `^evt_`, env.ID)
}

// Transaction ids are cluster-wide, but a transaction of another database
// cannot write this outbox: one left open there does not hold the reader
// back (a shared cluster with a long transaction elsewhere still delivers
// events), while one open here does.
func TestCommittedIgnoresOtherDatabasesTransactions(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	q := st.Queries()

	elsewhere, err := pgx.Connect(ctx, dbtest.EmptyURL(t))
	require.NoError(t, err)
	defer func() { _ = elsewhere.Close(context.WithoutCancel(ctx)) }()
	other, err := elsewhere.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(context.WithoutCancel(ctx)) }()
	var otherXid string
	require.NoError(t, other.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&otherXid))

	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		write(t, tx, "acme", "after-the-other")
		return nil
	}))
	// Other tests' transactions come and go; the open one of the other
	// database stays open throughout.
	require.Eventually(t, func() bool {
		rows, err := outbox.Committed(ctx, q, "", outbox.Position{}, 100)
		return err == nil && len(rows) == 1
	}, 10*time.Second, 10*time.Millisecond, "a transaction open on another database (xid %s) holds nothing back", otherXid)

	// The same open transaction on this database does hold back.
	here, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = here.Rollback(context.WithoutCancel(ctx)) }()
	var hereXid string
	require.NoError(t, here.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&hereXid))
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		write(t, tx, "acme", "after-this-one")
		return nil
	}))
	rows, err := outbox.Committed(ctx, q, "", outbox.Position{}, 100)
	require.NoError(t, err)
	require.Len(t, rows, 1, "an open transaction of this database (xid %s) holds back what follows it", hereXid)
	require.NoError(t, here.Rollback(ctx))
	require.Eventually(t, func() bool {
		rows, err := outbox.Committed(ctx, q, "", outbox.Position{}, 100)
		return err == nil && len(rows) == 2
	}, 10*time.Second, 10*time.Millisecond)
}

// Rows are read in the numeric order of their transaction ids, also where
// the ids gain a digit (9, then 10): ordered as text, "10" came first, the
// cursor moved past it, and the row of transaction 9 was never read. It
// happened for real at every power of ten a cluster's ids crossed.
func TestCommittedOrdersTransactionIDsAsNumbers(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	q := st.Queries()
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		write(t, tx, "acme", "nine")
		write(t, tx, "acme", "ten")
		_, err := tx.Exec(ctx, `UPDATE outbox SET xid = (CASE subject WHEN 'nine' THEN '9' ELSE '10' END)::xid8`)
		return err
	}))
	var got []string
	pos := outbox.Position{}
	for range 3 {
		rows, err := outbox.Committed(ctx, q, "", pos, 1)
		require.NoError(t, err)
		if len(rows) == 0 {
			break
		}
		got = append(got, rows[0].Event.Subject)
		pos = rows[0].Position
	}
	assert.Equal(t, []string{"nine", "ten"}, got)
}

// The visibility-order readers (the outbox's, and the audit log's that
// the sinks use) run after every commit with events: their frontier is a
// subquery of the prepared statement, not a call of visibility_frontier(),
// a SQL function PostgreSQL plans again on every call (0.4 ms of the
// statement's 0.5 to 1 ms, docs/benchmarks-notes.md).
func TestCommittedReadersDoNotCallTheFrontierFunction(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, "SET LOCAL track_functions = 'all'")
	require.NoError(t, err)
	write(t, tx, "acme", "one")
	q := db.New(tx)
	for range 3 {
		_, err := outbox.Committed(ctx, q, "", outbox.Position{}, 100)
		require.NoError(t, err)
		_, err = q.ListAuditCommitted(ctx, db.ListAuditCommittedParams{AfterXid: "0", MaxRows: 100})
		require.NoError(t, err)
	}
	var calls int64
	require.NoError(t, tx.QueryRow(ctx, `select coalesce(sum(calls), 0) from pg_stat_xact_user_functions
		where funcname = 'visibility_frontier'`).Scan(&calls))
	assert.Zero(t, calls, "visibility_frontier() called by the readers")
}
