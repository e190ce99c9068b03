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

	"computeplane/gen/db"
)

// lazyTx is a transaction whose BEGIN travels in one pipeline with its first
// statement (pgx's Batch.BeginTx), saving each call a round trip, the
// largest cost of a short call (see docs/benchmarks.md). A transaction that
// runs no statement sends nothing at all. Once begun it is pgx's own
// transaction; before that it implements pgx.Tx by beginning.
//
// Writes whose outcome nobody reads at once are held (Later) and travel in
// the pipeline of the next statement, or of the COMMIT: a call's trailing
// writes (its audit row and events, projection and usage rows, the node's
// spec) then cost no round trip of their own.
type lazyTx struct {
	conn  *pgxpool.Conn
	opts  pgx.TxOptions
	tx    pgx.Tx             // nil until the first statement
	later []*pgx.QueuedQuery // held by Later, sent with the next statement
	// scans read the answers of held writes that return a row (LaterRow).
	scans      map[*pgx.QueuedQuery]func(pgx.Row) error
	savepoints int  // savepoints begun (their names)
	committed  bool // COMMIT went out in a pipeline
	// head goes out after BEGIN, in the first pipeline (WithHead).
	head *Head
	// failed is the head's refusal: the transaction takes nothing more.
	failed error
}

var _ pgx.Tx = (*lazyTx)(nil)

// send sends b in one pipeline after what must precede it: BEGIN and the
// call's time limits when the transaction has not begun, the held writes.
// The results it returns start at b's first statement; a held write's
// failure is its error.
func (t *lazyTx) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if t.failed != nil {
		return nil, t.failed
	}
	if t.tx != nil && len(t.later) == 0 {
		return t.tx.SendBatch(ctx, b), nil
	}
	nb := &pgx.Batch{}
	skip := len(t.later)
	begin := t.tx == nil
	if begin {
		nb.BeginTx(t.opts)
		skip++
		if limits, ok := limitsOf(ctx); ok {
			nb.Queue(setLimits, limits...)
			skip++
		}
	}
	head := t.head
	t.head = nil
	if head != nil {
		nb.QueuedQueries = append(nb.QueuedQueries, head.batch.QueuedQueries...)
	}
	held, scans := t.later, t.scans
	skip -= len(held)
	nb.QueuedQueries = append(nb.QueuedQueries, held...)
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	t.later, t.scans = nil, nil
	var br pgx.BatchResults
	if begin {
		br = t.conn.SendBatch(ctx, nb)
		t.tx = br.Tx()
	} else {
		br = t.tx.SendBatch(ctx, nb)
	}
	for range skip {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	if head != nil {
		head.read(br)
		if err := head.Check(ctx); err != nil {
			// What ran after the head is rolled back with the transaction.
			_ = br.Close()
			t.failed = err
			return nil, err
		}
	}
	for _, q := range held {
		var err error
		if scan := scans[q]; scan != nil {
			err = scan(br.QueryRow())
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	return br, nil
}

// pipeline sends sql alone (after what must precede it).
func (t *lazyTx) pipeline(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	return t.send(ctx, b)
}

// direct reports whether a statement can go straight to pgx's transaction.
func (t *lazyTx) direct() bool { return t.tx != nil && len(t.later) == 0 && t.failed == nil }

// flush begins, and sends the held writes, for the calls that cannot
// carry them (a savepoint, COPY).
func (t *lazyTx) flush(ctx context.Context) error {
	if t.direct() {
		return nil
	}
	if t.tx == nil && len(t.later) == 0 && t.head == nil {
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
	br, err := t.send(ctx, &pgx.Batch{})
	if err != nil {
		return err
	}
	return br.Close()
}

// hold keeps a write for the next pipeline.
func (t *lazyTx) hold(sql string, args []any) {
	t.later = append(t.later, &pgx.QueuedQuery{SQL: sql, Arguments: args})
}

// LaterRow holds a write that answers with one row, as Later does, and
// reads its answer with scan when it came (with tx's next statement or its
// COMMIT; a failure of scan fails that statement). On any other
// transaction it runs at once.
func LaterRow(ctx context.Context, tx pgx.Tx, scan func(pgx.Row) error, sql string, args ...any) error {
	var t *lazyTx
	switch lt := tx.(type) {
	case *lazyTx:
		t = lt
	case *lazySavepoint:
		t = lt.lazyTx
	default:
		return scan(tx.QueryRow(ctx, sql, args...))
	}
	t.hold(sql, args)
	if t.scans == nil {
		t.scans = map[*pgx.QueuedQuery]func(pgx.Row) error{}
	}
	t.scans[t.later[len(t.later)-1]] = scan
	return nil
}

// Outermost reports whether tx is a store transaction itself, not a
// savepoint in one: what a savepoint's rollback undoes, a value handed on
// after the commit (notify.OfferLater) would not.
func Outermost(tx pgx.Tx) bool {
	_, ok := tx.(*lazyTx)
	return ok
}

// Later returns, for db.New, the transaction tx with its Exec held: the
// write travels in one pipeline with tx's next statement or its COMMIT,
// and its failure fails that statement (or the commit) instead. Only for
// :exec writes whose result the caller does not inspect (the tag it
// returns is empty); reads go out at once, after what is held. On any
// other transaction Later is tx itself.
func Later(tx pgx.Tx) db.DBTX {
	switch t := tx.(type) {
	case *lazyTx:
		return laterTx{t}
	case *lazySavepoint:
		return laterTx{t.lazyTx}
	}
	return tx
}

type laterTx struct{ *lazyTx }

func (l laterTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	l.hold(sql, args)
	return pgconn.CommandTag{}, nil
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
	if t.direct() {
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
	if t.direct() {
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
	if t.direct() {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	br, err := t.pipeline(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return &batchRow{row: br.QueryRow(), br: br}
}

// SendBatch sends b, with BEGIN and the held writes before it when there
// are, in one pipeline.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	br, err := t.send(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// Begin starts a savepoint, held like a write: SAVEPOINT, RELEASE and
// ROLLBACK TO travel with the statements around them (a placement's
// savepoint costs no round trip of its own).
func (t *lazyTx) Begin(context.Context) (pgx.Tx, error) {
	t.savepoints++
	sp := &lazySavepoint{lazyTx: t, name: "sp_" + strconv.Itoa(t.savepoints)}
	t.hold("savepoint "+sp.name, nil)
	return sp, nil
}

// lazySavepoint is a savepoint of a lazyTx whose statements go through it.
type lazySavepoint struct {
	*lazyTx
	name string
	done bool
}

// Commit releases the savepoint.
func (sp *lazySavepoint) Commit(context.Context) error {
	if sp.done {
		return pgx.ErrTxClosed
	}
	sp.done = true
	sp.hold("release savepoint "+sp.name, nil)
	return nil
}

// Rollback undoes what ran since the savepoint, at once: after a failed
// statement the transaction takes nothing else (pgx's preparing of the next
// pipeline's statements would fail), and failures are the rare path.
func (sp *lazySavepoint) Rollback(ctx context.Context) error {
	if sp.done {
		return pgx.ErrTxClosed
	}
	sp.done = true
	_, err := sp.lazyTx.Exec(ctx, "rollback to savepoint "+sp.name)
	return err
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if t.tx == nil {
		return pgx.LargeObjects{} // begin with a statement first
	}
	return t.tx.LargeObjects()
}

func (t *lazyTx) Conn() *pgx.Conn { return t.conn.Conn() }

// Commit ends the transaction; one that never began has nothing to commit
// (a head it carries is still sent and checked first, never with the
// COMMIT: a refused head rolls the transaction back).
// Held writes travel with the COMMIT; when one fails the transaction is
// rolled back and its error returned (errRolledBack: the connection is
// clean).
func (t *lazyTx) Commit(ctx context.Context) error {
	if t.head != nil {
		// The head is checked before anything commits: it goes out, with
		// what is held, in a pipeline of its own.
		if err := t.flush(ctx); err != nil && t.failed == nil {
			return err
		}
	}
	if t.failed != nil {
		if t.tx != nil {
			if err := t.tx.Rollback(ctx); err != nil {
				return errors.Join(t.failed, err)
			}
		}
		return errRolledBack{t.failed}
	}
	if t.direct() {
		return t.tx.Commit(ctx)
	}
	if t.tx == nil && len(t.later) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue("commit")
	br, err := t.send(ctx, b)
	if err != nil {
		if t.tx != nil && t.conn.Conn().PgConn().TxStatus() != 'I' {
			if rbErr := t.tx.Rollback(ctx); rbErr != nil {
				return errors.Join(err, rbErr)
			}
		}
		return errRolledBack{err}
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	t.committed = true
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// errRolledBack is a held write's failure at commit: the transaction was
// rolled back and the connection is reusable.
type errRolledBack struct{ error }

func (e errRolledBack) Unwrap() error { return e.error }

// Rollback ends the transaction; one that never began has nothing to undo.
func (t *lazyTx) Rollback(ctx context.Context) error {
	t.later, t.scans = nil, nil
	if t.tx == nil || t.committed {
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
	conn, err := acquire(ctx, pool)
	if err != nil {
		return err
	}
	tx := &lazyTx{conn: conn, opts: pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite}}
	if readOnly {
		tx.opts.AccessMode = pgx.ReadOnly
	} else {
		tx.head = takeHead(ctx)
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
		var rolledBack errRolledBack
		if !errors.Is(err, pgx.ErrTxCommitRollback) && !errors.As(err, &rolledBack) {
			// The connection's state is unknown: never reuse it.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}
