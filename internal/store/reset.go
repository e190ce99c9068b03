package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pools are reset when the server goes away. A connection is pinged when
// handed out only after PingAfterIdle, so after a restart or a failover
// every idle connection of every pool would fail one call each before the
// pools noticed. Instead, the first statement that finds its server gone
// (terminated by an administrator, crashed, the socket reset or closed)
// resets every pool opened from the same Open (the read pool, the
// siblings): their idle connections are closed, the ones in use when they
// come back, and the next calls connect afresh. A failure under the
// caller's own cancelled or expired context is not the server's and
// resets nothing.

// resetGap is the least time between two resets: connections made just
// after a reset and failing too mean the server is still away, and
// resetting again would only close the ones that reached it.
const resetGap = time.Second

// poolSet is the pools opened from one Open, reset together.
type poolSet struct {
	mu    sync.Mutex
	pools []*pgxpool.Pool
	last  time.Time // the last reset
	now   func() time.Time
}

func newPoolSet() *poolSet { return &poolSet{now: time.Now} }

func (s *poolSet) add(p *pgxpool.Pool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pools = append(s.pools, p)
}

// fault records a statement's error: one that says the server went away
// resets every pool, at most once per resetGap.
func (s *poolSet) fault(ctx context.Context, err error) {
	if s == nil || err == nil || ctx.Err() != nil || !serverGone(err) {
		return
	}
	s.mu.Lock()
	now := s.now()
	if !s.last.IsZero() && now.Sub(s.last) < resetGap {
		s.mu.Unlock()
		return
	}
	s.last = now
	pools := append([]*pgxpool.Pool(nil), s.pools...)
	s.mu.Unlock()
	for _, p := range pools {
		p.Reset()
	}
}

// serverGone reports whether err says the connection's server is gone:
// the session terminated (admin_shutdown, crash_shutdown, the server
// starting or stopping), a connection exception, or the socket closed or
// reset under the statement. Errors of statements (constraints, timeouts,
// serialization) and of the caller's context are not.
func serverGone(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03":
			return true
		}
		return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08"
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return false
	}
	return socketLost(err) // faults.go, shared with Unavailable
}
