package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Reads run without BEGIN and COMMIT on connections of their own pool,
// opened with default_transaction_read_only: each statement is its own
// read-only transaction, one round trip, and a statement that writes fails
// as it would in a READ ONLY transaction (SQLSTATE 25006). At READ
// COMMITTED, which every call uses, a transaction gives its statements no
// common snapshot either (each statement takes its own), so a read loses
// nothing by it; only transaction_timestamp() (now()) differs per
// statement.

// ReadStatementTimeout bounds each statement of a read on the server as
// well; the call's own deadline cancels it sooner from the client.
const ReadStatementTimeout = 10 * time.Second

const readsApplicationName = "computed-reads"

// openReads makes the read pool beside cfg's: same size, connecting lazily.
func openReads(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	rc := cfg.Copy()
	rc.MinConns = 0
	params := rc.ConnConfig.RuntimeParams
	params["default_transaction_read_only"] = "on"
	params["statement_timeout"] = strconv.FormatInt(ReadStatementTimeout.Milliseconds(), 10)
	if params[applicationNameKey] == applicationName {
		params[applicationNameKey] = readsApplicationName
	}
	// target_session_attrs=read-write (a URL naming a primary and its
	// standby, to follow a failover) checks that the session takes writes,
	// which a session opened read-only never does: every read connection
	// would be refused. Reads must still go to the primary (a standby
	// lags), so check for that instead.
	if v := rc.ConnConfig.ValidateConnect; v != nil &&
		reflect.ValueOf(v).Pointer() == reflect.ValueOf(pgconn.ValidateConnectFunc(pgconn.ValidateConnectTargetSessionAttrsReadWrite)).Pointer() {
		rc.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsPrimary
	}
	pool, err := pgxpool.NewWithConfig(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("store: open the read pool: %w", err)
	}
	return pool, nil
}

// withRead runs fn on a read-only connection, each statement on its own.
func withRead(ctx context.Context, pool *pgxpool.Pool, fn func(ctx context.Context, tx pgx.Tx) error) error {
	conn, err := acquire(ctx, pool)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx := &autocommit{conn: conn}
	defer func() {
		if tx.nested != nil {
			// fn began a transaction of its own and left it open.
			if err := tx.nested.Rollback(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}
	}()
	return fn(ctx, tx)
}

// autocommit is the pgx.Tx a read sees: its statements go to the
// connection as they come; Commit and Rollback have nothing to end.
type autocommit struct {
	conn   *pgxpool.Conn
	nested pgx.Tx // a transaction fn began explicitly (rare), ended with the read
}

var _ pgx.Tx = (*autocommit)(nil)

func (t *autocommit) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *autocommit) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *autocommit) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

// SendBatch runs the batch in one implicit transaction (one Sync), read-only
// by the connection's default.
func (t *autocommit) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

func (t *autocommit) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *autocommit) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// Begin starts a real (read-only) transaction, for a read that needs one
// snapshot across statements at a stricter isolation.
func (t *autocommit) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.conn.Begin(ctx)
	if err == nil {
		t.nested = tx
	}
	return tx, err
}

func (t *autocommit) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *autocommit) Conn() *pgx.Conn { return t.conn.Conn() }

func (t *autocommit) Commit(context.Context) error { return nil }

func (t *autocommit) Rollback(context.Context) error { return nil }
