package sinks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/notify"
	"computeplane/internal/system"
	"computeplane/internal/workers"
)

// Job is the singleton job of one sink: Run drains the sink (DispatchOnce
// until a batch comes back short) under the job's lease, whose fence it is
// given, and returns; Periodic makes it a job of the worker runner.
type Job struct {
	// Name is the lease name: sink:<kind>:<id>.
	Name string
	Sink Sink
	Run  func(ctx context.Context, fence Fence) error
}

// Periodic is the job for the worker runner: a drain at once, then one
// every poll or as soon as n wakes the outbox's readers; a failed drain is
// backed off by the runner.
func (j Job) Periodic(n *notify.Notifier, poll time.Duration) *workers.Periodic {
	return &workers.Periodic{Name: j.Name, Interval: poll, Wake: notify.TopicOutbox, Notifier: n, Backoff: true, Pass: j.Run}
}

// JobName is the singleton job name of a sink.
func JobName(s Sink) string { return "sink:" + s.Kind() + ":" + s.ID() }

// Jobs returns one job per sink, each sending batches of up to batch rows
// (DefaultBatch when 0).
func (d *Dispatcher) Jobs(sinks []Sink, batch int) []Job {
	if batch <= 0 {
		batch = DefaultBatch
	}
	out := make([]Job, 0, len(sinks))
	for _, s := range sinks {
		out = append(out, Job{Name: JobName(s), Sink: s, Run: func(ctx context.Context, fence Fence) error {
			for ctx.Err() == nil {
				n, err := d.DispatchOnce(ctx, s, fence, batch)
				if err != nil {
					return err
				}
				if n < batch {
					return nil
				}
			}
			return ctx.Err()
		}})
	}
	return out
}

// Self-check thresholds.
const (
	LagWarning = 10_000
	LagError   = 100_000
	// StallAfter: a sink with rows waiting whose cursor has not moved for
	// this long is an error (its job is not running, or the sink keeps
	// failing without reaching its dead-letter limit).
	StallAfter = 10 * time.Minute
)

// Check is the sinks' self check: for each sink its lag and dead letters.
// Lag at LagWarning is a warning and at LagError an error; rows waiting
// behind a cursor that has not moved for StallAfter are an error; any
// dead letter is a warning (rows an operator may want to replay).
func Check(sinks []Sink) system.Check {
	return system.Check{Name: "sinks", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		q := db.New(tx)
		now, err := q.DatabaseNow(ctx)
		if err != nil {
			return nil, err
		}
		var out []api.Finding
		for _, s := range sinks {
			f, err := checkOne(ctx, q, s, now)
			if err != nil {
				return nil, fmt.Errorf("%s sink %s: %w", s.Kind(), s.ID(), err)
			}
			out = append(out, f...)
		}
		if len(out) == 0 {
			out = append(out, api.Finding{Check: "sinks", Severity: system.SeverityInfo, Message: "no sinks configured"})
		}
		return out, nil
	}}
}

func checkOne(ctx context.Context, q *db.Queries, s Sink, now time.Time) ([]api.Finding, error) {
	name := s.Kind() + " sink " + s.ID()
	row, err := q.GetSinkCursor(ctx, db.GetSinkCursorParams{SinkKind: s.Kind(), SinkID: s.ID()})
	var at cursorOf
	var moved time.Time
	switch {
	case err == nil:
		at, moved = cursorOf{Xid: row.AfterXid, Seq: row.AfterSeq}, row.UpdatedAt
	case errors.Is(err, pgx.ErrNoRows):
		at = cursorOf{Xid: "0"}
	default:
		return nil, err
	}
	lag, err := Lag(ctx, q, s.Kind(), at)
	if err != nil {
		return nil, err
	}
	dead, err := q.CountSinkDeadLetters(ctx, db.CountSinkDeadLettersParams{SinkKind: s.Kind(), SinkID: s.ID()})
	if err != nil {
		return nil, err
	}
	sev := system.SeverityInfo
	msg := fmt.Sprintf("%s: %d rows behind, %d dead letters", name, lag, dead)
	if lag >= LagCap {
		msg = fmt.Sprintf("%s: at least %d rows behind, %d dead letters", name, lag, dead)
	}
	switch {
	case lag >= LagError:
		sev = system.SeverityError
	case lag > 0 && !moved.IsZero() && now.Sub(moved) >= StallAfter:
		sev = system.SeverityError
		msg += fmt.Sprintf("; no progress for %s", now.Sub(moved).Round(time.Second))
	case lag >= LagWarning, dead > 0:
		sev = system.SeverityWarning
	}
	return []api.Finding{{Check: "sinks", Severity: sev, Message: msg}}, nil
}
