package usage

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/iam"
)

// Key is a window's billing idempotency key: cmp:<allocationId>:<windowStartMs>
// (cmp:<countedId>:<windowStartMs> for a counted row), with :adj<n> for the
// nth adjustment of that hour.
func Key(sourceID string, windowStart time.Time, adjustment int32) string {
	k := fmt.Sprintf("cmp:%s:%d", sourceID, windowStart.UnixMilli())
	if adjustment > 0 {
		k += fmt.Sprintf(":adj%d", adjustment)
	}
	return k
}

// Rollup writes the windows of tenant's allocations and counted rows for
// every hour closed by now, in tx: for each hour an allocation covered,
// what it measured (the quantity per hour times the milliseconds covered);
// for a counted row, what it counted (see rollCounted). An hour whose
// windows already hold less than that (a backfill, an allocation found
// longer) gains an adjustment window with the difference; windows already
// written are never changed, so running it again over the same hours
// writes nothing. It returns the number of windows written.
func Rollup(ctx context.Context, tx pgx.Tx, tenant string, now time.Time) (int, error) {
	q := db.New(tx)
	horizon := now.UTC().Truncate(time.Hour)
	allocs, err := q.AllocationsToRoll(ctx, db.AllocationsToRollParams{TenantID: tenant, Horizon: horizon})
	if err != nil {
		return 0, err
	}
	written := 0
	for _, a := range allocs {
		n, err := rollAllocation(ctx, q, a, horizon)
		if err != nil {
			return written, err
		}
		written += n
	}
	n, err := rollCounted(ctx, q, tenant, horizon)
	return written + n, err
}

func rollAllocation(ctx context.Context, q *db.Queries, a db.Allocation, horizon time.Time) (int, error) {
	start := a.StartedAt.UTC()
	end := horizon
	if a.EndedAt != nil && a.EndedAt.Before(end) {
		end = a.EndedAt.UTC()
	}
	from := a.RolledUntil.UTC()
	if a.Dirty {
		from = start.Truncate(time.Hour) // a change may reach back to the start
	}
	sums := map[int64]db.WindowSumsRow{}
	if a.Dirty || from.Before(horizon) {
		rows, err := q.WindowSums(ctx, pgtype.Text{String: a.AllocationID, Valid: true})
		if err != nil {
			return 0, err
		}
		for _, r := range rows {
			sums[r.WindowStart.UnixMilli()] = r
		}
	}
	written := 0
	for h := from; h.Before(horizon) && h.Before(end); h = h.Add(time.Hour) {
		lo, hi := maxTime(h, start), minTime(h.Add(time.Hour), end)
		if !hi.After(lo) {
			continue
		}
		want := a.QuantityMicro * hi.Sub(lo).Milliseconds()
		have, seen := sums[h.UnixMilli()]
		if want <= have.QuantityMicroMs {
			// Nothing new; less than written (a backdated close) cannot be
			// taken back from billing and is left as it was.
			continue
		}
		adj := int32(0)
		if seen {
			adj = have.LastAdjustment + 1
		}
		if err := q.InsertWindow(ctx, db.InsertWindowParams{
			Key: Key(a.AllocationID, h, adj), AllocationID: pgtype.Text{String: a.AllocationID, Valid: true}, TenantID: a.TenantID, ProjectID: a.ProjectID,
			Meter: a.Meter, WindowStart: h, WindowEnd: h.Add(time.Hour), QuantityMicroMs: want - have.QuantityMicroMs,
			Tags: a.Tags, Adjustment: adj,
		}); err != nil {
			return written, err
		}
		written++
	}
	// An allocation closed within the open hour is seen again once that
	// hour closes.
	if err := q.MarkRolled(ctx, db.MarkRolledParams{AllocationID: a.AllocationID, RolledUntil: horizon}); err != nil {
		return written, err
	}
	if a.EndedAt != nil && a.EndedAt.After(horizon) {
		return written, q.MarkDirty(ctx, a.AllocationID)
	}
	return written, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Outcomes counts the outcomes of one hand-over.
type Outcomes map[string]int

// Handover gives billing the closed windows not handed over yet, at most
// limit of them, oldest first, in tx, and records each outcome with its
// time. A window billing could not take now (the bridge is unavailable)
// stays pending for the next hand-over; Record is idempotent by key, so a
// window handed over twice (a hand-over killed after billing answered) is
// a duplicate, never a second charge.
func Handover(ctx context.Context, tx pgx.Tx, billing iam.Billing, now time.Time, limit int) (Outcomes, error) {
	q := db.New(tx)
	rows, err := q.PendingWindows(ctx, db.PendingWindowsParams{Now: now, Lim: int32(limit)})
	if err != nil {
		return nil, err
	}
	out := Outcomes{}
	for _, w := range rows {
		tags := map[string]string{}
		_ = jsonUnmarshal(w.Tags, &tags)
		outcome, err := billing.Record(ctx, iam.UsageWindow{
			Key: w.Key, TenantID: w.TenantID, Meter: w.Meter, Quantity: windowQuantity(w),
			Start: w.WindowStart, End: w.WindowEnd, Tags: tags,
		})
		if err != nil {
			out["pending"]++
			continue // unavailable: the next hand-over tries again
		}
		if err := q.RecordOutcome(ctx, db.RecordOutcomeParams{Key: w.Key, Outcome: textOf(outcome), RecordedAt: &now}); err != nil {
			return out, err
		}
		out[outcome]++
	}
	return out, nil
}
