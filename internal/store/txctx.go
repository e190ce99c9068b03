package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// ContextWithTx returns ctx carrying the transaction a call runs in, so the
// business function of a method reaches the same transaction as the
// envelope's audit and outbox writes.
func ContextWithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the call's transaction, if any.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}
