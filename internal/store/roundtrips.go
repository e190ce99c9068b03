package store

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Round trips on the wire, counted per call: every statement sent alone
// and every pipeline (a batch, a lazy transaction's BEGIN with its first
// statement) is one. The envelope's tests and the benchmarks read them to
// hold the fleet paths to their budget (docs/benchmarks.md).

type roundTripsKey struct{}

// CountRoundTrips returns a context under which the store counts the
// round trips it makes into n.
func CountRoundTrips(ctx context.Context, n *atomic.Int64) context.Context {
	return context.WithValue(ctx, roundTripsKey{}, n)
}

func countRoundTrip(ctx context.Context) {
	if n, ok := ctx.Value(roundTripsKey{}).(*atomic.Int64); ok {
		n.Add(1)
	}
}

// roundTripTracer is the pools' pgx tracer.
type roundTripTracer struct{}

var (
	_ pgx.QueryTracer = roundTripTracer{}
	_ pgx.BatchTracer = roundTripTracer{}
)

func (roundTripTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	countRoundTrip(ctx)
	return ctx
}

func (roundTripTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (roundTripTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	countRoundTrip(ctx)
	return ctx
}

func (roundTripTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (roundTripTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
