package dbtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/store"
)

// StatementConn opens a connection to st's database whose statements are
// counted into the returned counter: each statement sent alone and each
// statement of a batch or pipeline is one (a pipeline of 4 is 4). Tests
// hold a path to its number of statements with it, which the round-trip
// count (store.CountRoundTrips) does not see. Closed when the test ends.
func StatementConn(t testing.TB, st *store.Store) (*pgx.Conn, *atomic.Int64) {
	t.Helper()
	n := &atomic.Int64{}
	cfg := st.Pool().Config().ConnConfig.Copy()
	cfg.Tracer = statementCounter{n}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c, n
}

type statementCounter struct{ n *atomic.Int64 }

func (s statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}

func (statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	s.n.Add(int64(d.Batch.Len()))
	return ctx
}

func (statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
