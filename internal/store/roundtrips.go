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

// roundTripTracer is the pools' pgx tracer: it counts round trips, and
// tells the pools a statement found its server gone (reset.go).
type roundTripTracer struct{ pools *poolSet }

var (
	_ pgx.QueryTracer = roundTripTracer{}
	_ pgx.BatchTracer = roundTripTracer{}
)

func (roundTripTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	countRoundTrip(ctx)
	return ctx
}

func (r roundTripTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	r.pools.fault(ctx, d.Err)
}

func (roundTripTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	countRoundTrip(ctx)
	return ctx
}

func (r roundTripTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.pools.fault(ctx, d.Err)
}

func (r roundTripTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	r.pools.fault(ctx, d.Err)
}
