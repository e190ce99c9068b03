package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyTx is a transaction whose BEGIN travels in one pipeline with its first
// statement (pgx's Batch.BeginTx), saving each call a round trip, the
// largest cost of a short call (see docs/benchmarks.md). A transaction that
// runs no statement sends nothing at all. Once begun it is pgx's own
// transaction; before that it implements pgx.Tx by beginning.
type lazyTx struct {
	conn *pgxpool.Conn
	opts pgx.TxOptions
	tx   pgx.Tx // nil until the first statement
}

var _ pgx.Tx = (*lazyTx)(nil)

// pipeline sends BEGIN, the call's time limits and the first statement
// together.
func (t *lazyTx) pipeline(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	limits, hasLimits := limitsOf(ctx)
	if hasLimits {
		b.Queue(setLimits, limits...)
	}
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil { // the BEGIN's result
		_ = br.Close()
		return nil, err
	}
	if hasLimits {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	return br, nil
}

// ensure begins alone, for the calls that cannot carry the BEGIN.
func (t *lazyTx) ensure(ctx context.Context) error {
	if t.tx != nil {
		return nil
	}
	tx, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	t.tx = tx
	if limits, ok := limitsOf(ctx); ok {
		_, err = tx.Exec(ctx, setLimits, limits...)
	}
	return err
}

// setLimits bounds each statement of the transaction, and each wait for a
// lock, by what is left of the call's time.
const setLimits = `select set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)`

// MaxLockWait bounds how long a statement of a call waits for a row lock.
// A lock held elsewhere (a stuck transaction, a slow writer) then costs the
// calls that need that row an UNAVAILABLE answer after this long, and their
// connections come back to the pool instead of piling up behind the lock.
const MaxLockWait = time.Second

// limitsOf derives statement_timeout and lock_timeout (milliseconds, as
// set_config wants them) from ctx's deadline; without a deadline the
// server's settings stand.
func limitsOf(ctx context.Context) ([]any, bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil, false
	}
	left := max(time.Until(deadline).Milliseconds(), 1)
	lock := min(left, MaxLockWait.Milliseconds())
	return []any{strconv.FormatInt(left, 10), strconv.FormatInt(lock, 10)}, true
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
	}
	br, err := t.pipeline(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
	}
	br, err := t.pipeline(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.tx != nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	br, err := t.pipeline(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return &batchRow{row: br.QueryRow(), br: br}
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ensure(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if t.tx == nil {
		return pgx.LargeObjects{} // begin with a statement first
	}
	return t.tx.LargeObjects()
}

func (t *lazyTx) Conn() *pgx.Conn { return t.conn.Conn() }

// Commit ends the transaction; one that never began has nothing to commit.
func (t *lazyTx) Commit(ctx context.Context) error {
	if t.tx == nil {
		return nil
	}
	return t.tx.Commit(ctx)
}

// Rollback ends the transaction; one that never began has nothing to undo.
func (t *lazyTx) Rollback(ctx context.Context) error {
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// batchRows closes the pipeline with the rows of its statement.
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r *batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}

type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r *batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// AcquireTimeout bounds the wait for a free connection. Past it the call is
// shed (ErrBusy, answered UNAVAILABLE with a retry hint): a queue of calls
// behind an exhausted pool would only time out later, holding their
// clients.
const AcquireTimeout = 2 * time.Second

// withLazyTx runs fn in a lazy transaction on a connection of the pool: it
// commits when fn returns nil, rolls back otherwise (and on panic), and
// drops a connection it could not roll back, so the pool never hands out a
// connection inside a transaction.
func withLazyTx(ctx context.Context, pool *pgxpool.Pool, readOnly bool, fn func(ctx context.Context, tx pgx.Tx) error) (retErr error) {
	actx, cancel := context.WithTimeout(ctx, AcquireTimeout)
	conn, err := pool.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%w: %w", ErrBusy, err)
		}
		return fmt.Errorf("store: acquire: %w", err)
	}
	tx := &lazyTx{conn: conn, opts: pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite}}
	if readOnly {
		tx.opts.AccessMode = pgx.ReadOnly
	}
	done := false
	defer func() {
		if !done {
			// fn failed or panicked: roll back; the caller's context may be
			// why, so roll back without it.
			if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
				if retErr != nil {
					retErr = errors.Join(retErr, fmt.Errorf("store: rollback: %w", rbErr))
				}
			}
		}
		conn.Release()
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		if !errors.Is(err, pgx.ErrTxCommitRollback) {
			// The connection's state is unknown: never reuse it.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}
