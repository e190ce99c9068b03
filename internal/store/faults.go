package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBusy is returned, wrapped, when no connection of the pool came free
// within AcquireTimeout: the process sheds the call rather than queue it
// without bound.
var ErrBusy = errors.New("store: every connection is busy")

// ErrQueueBound is returned, wrapped, when no connection came free within
// the bound the caller set with WithAcquireRules (admission's queue
// bound): the call is shed early rather than wait the full
// AcquireTimeout. It is an ErrBusy too.
var ErrQueueBound = fmt.Errorf("%w: past the queue bound", ErrBusy)

// acquireRules are what a caller set for its calls' waits for a free
// connection: a bound shorter than AcquireTimeout (admission's queue
// bound), and whom each wait is reported to (admission's limit). One
// context value for both: the envelope sets them together on every call,
// and acquire reads them on every connection it takes.
type acquireRules struct {
	bound    time.Duration
	observer AcquireObserver
}

type acquireRulesKey struct{}

// WithAcquireRules bounds the waits of ctx's calls for a free connection
// to bound when it is shorter than AcquireTimeout, and reports each wait
// to o; 0 and nil lift what was set earlier.
func WithAcquireRules(ctx context.Context, bound time.Duration, o AcquireObserver) context.Context {
	if bound <= 0 && o == nil && ctx.Value(acquireRulesKey{}) == nil {
		return ctx
	}
	return context.WithValue(ctx, acquireRulesKey{}, &acquireRules{bound: bound, observer: o})
}

// acquire takes a connection of pool within ctx's acquire bound, or
// answers ErrBusy (ErrQueueBound past the bound of WithAcquireRules), and
// reports the wait to its AcquireObserver.
func acquire(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	wait, bounded := AcquireTimeout, false
	var obs AcquireObserver
	if r, ok := ctx.Value(acquireRulesKey{}).(*acquireRules); ok {
		if r.bound > 0 && r.bound < AcquireTimeout {
			wait, bounded = r.bound, true
		}
		obs = r.observer
	}
	actx, cancel := context.WithTimeout(ctx, wait)
	var start time.Time
	if obs != nil {
		start = time.Now()
	}
	conn, err := pool.Acquire(actx)
	cancel()
	if obs != nil {
		obs.Acquired(time.Since(start))
	}
	if err != nil {
		if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			if bounded {
				return nil, fmt.Errorf("%w: %w", ErrQueueBound, err)
			}
			return nil, fmt.Errorf("%w: %w", ErrBusy, err)
		}
		return nil, fmt.Errorf("store: acquire: %w", err)
	}
	return conn, nil
}

// Unavailable reports whether err means the database could not do the work
// now and nothing was changed: it was unreachable, restarting or shutting
// down, it terminated the session, the call ran out of its time (a lock
// held elsewhere, a slow statement) or the pool had no connection free.
// Such a call is worth retrying; the envelope answers UNAVAILABLE with
// retryAfterMs rather than INTERNAL_ERROR.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources (too many connections, out of memory or disk)
			"57": // operator intervention: admin_shutdown 57P01, crash_shutdown 57P02,
			// cannot_connect_now 57P03, query_canceled 57014 (statement_timeout)
			return true
		}
		return pgErr.Code == "55P03" // lock_not_available (lock_timeout)
	}
	if errors.As(err, &pgErr) {
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) ||
		errors.As(err, &netErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || socketLost(err) ||
		pgconn.Timeout(err) || isClosedConn(err)
}

// socketLost reports whether err is the connection's socket ending under
// a statement: closed or reset by the server, or cut short.
func socketLost(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, pgconn.ErrConnClosed)
}

// isClosedConn matches pgx's answers on a connection that an earlier fault
// closed (the server terminated it mid-call), or that never sent the query.
func isClosedConn(err error) bool {
	return errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, pgx.ErrTxClosed)
}
