package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"computeplane/gen/db"
)

// Pipeline sends several of sqlc's typed statements (gen/db) in one round
// trip: reads that do not depend on each other's answers (a create's
// idempotency read with its pool and flavor), or a write with the reads
// that follow it. Statements are queued as a function that makes calls on
// the *db.Queries it is given, each call unconditional; it is called
// twice, once to learn the statements and their arguments, and once after
// Send to read their results through the generated code (so the scanning
// is sqlc's own). It must do nothing else, and what it assigns on the
// first call (zero values and an error) must not be read by a function
// queued after it. queries/ has no :batch query (rows of one kind are one
// statement over arrays), so a pipeline takes none.
//
// Statements run in order on one connection. A statement that fails (not
// one that finds no rows) fails those after it, as in any transaction.
type Pipeline struct {
	batch pgx.Batch
	runs  []func(*db.Queries)
}

// Queue adds run's statement to the pipeline.
func (p *Pipeline) Queue(run func(q *db.Queries)) {
	c := &capture{b: &p.batch}
	run(db.New(c))
	if c.n == 0 {
		panic("store: a queued function made no statement")
	}
	p.runs = append(p.runs, run)
}

// Len is the number of statements queued.
func (p *Pipeline) Len() int { return len(p.runs) }

// Batcher sends a pipeline: a call's transaction (whose held writes, and
// BEGIN, go first) or a pool.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Send sends the queued statements in one pipeline on tx and hands each
// its result. The error is the pipeline's own (it could not be sent, or a
// statement failed); a statement's outcome (no rows included) is what its
// function kept.
func (p *Pipeline) Send(ctx context.Context, tx Batcher) error {
	if len(p.runs) == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, &p.batch)
	p.read(br)
	err := br.Close()
	p.batch, p.runs = pgx.Batch{}, nil
	return err
}

// errCaptured is what a queued function sees on its first call.
var errCaptured = errors.New("store: statement captured for a pipeline")

// capture queues the statements a queued function makes.
type capture struct {
	b *pgx.Batch
	n int
}

func (c *capture) keep(sql string, args []any) {
	c.b.Queue(sql, args...)
	c.n++
}

func (c *capture) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.keep(sql, args)
	return pgconn.CommandTag{}, errCaptured
}

func (c *capture) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.keep(sql, args)
	return nil, errCaptured
}

func (c *capture) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	c.keep(sql, args)
	return errRow{errCaptured}
}

// replay hands each queued function the next result of the pipeline.
type replay struct{ br pgx.BatchResults }

// read hands each queued function its result from br, where they come
// next (Send, and a transaction's head).
func (p *Pipeline) read(br pgx.BatchResults) {
	q := db.New(&replay{br: br})
	for _, run := range p.runs {
		run(q)
	}
}

func (r *replay) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return r.br.Exec()
}

func (r *replay) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return r.br.Query()
}

func (r *replay) QueryRow(context.Context, string, ...any) pgx.Row {
	return r.br.QueryRow()
}
