package store

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
)

// TestServerGoneIsOnlyTheServersFault: the errors that reset the pools are
// the server's going away, never a statement's own error or the caller's
// context.
func TestServerGoneIsOnlyTheServersFault(t *testing.T) {
	for _, c := range []struct {
		err  error
		gone bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true}, // admin_shutdown: terminated, a fast shutdown
		{&pgconn.PgError{Code: "57P02"}, true}, // crash_shutdown
		{&pgconn.PgError{Code: "57P03"}, true}, // cannot_connect_now
		{&pgconn.PgError{Code: "08006"}, true}, // connection_failure
		{fmt.Errorf("write failed: %w", syscall.EPIPE), true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{io.ErrUnexpectedEOF, true},
		{&pgconn.PgError{Code: "57014"}, false}, // query_canceled: a statement timeout
		{&pgconn.PgError{Code: "23505"}, false}, // unique_violation
		{&pgconn.PgError{Code: "55P03"}, false}, // lock_not_available
		{context.Canceled, false},
		{fmt.Errorf("timeout: %w", context.DeadlineExceeded), false},
	} {
		assert.Equal(t, c.gone, serverGone(c.err), "%v", c.err)
	}
}

// TestAResetWaitsItsGap: faults within resetGap of a reset do not reset
// again (connections made just after it would be closed for nothing), and
// a fault under the caller's own ended context resets nothing.
func TestAResetWaitsItsGap(t *testing.T) {
	s := newPoolSet()
	at := s.now()
	s.now = func() time.Time { return at }
	gone := &pgconn.PgError{Code: "57P01"}
	s.fault(context.Background(), gone)
	assert.Equal(t, at, s.last)
	first := at
	at = at.Add(resetGap / 2)
	s.fault(context.Background(), gone)
	assert.Equal(t, first, s.last, "within the gap")
	at = at.Add(resetGap)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.fault(ctx, gone)
	assert.Equal(t, first, s.last, "the caller's context ended")
	s.fault(context.Background(), gone)
	assert.Equal(t, at, s.last, "past the gap")
}
