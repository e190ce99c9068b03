package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"computeplane/gen/db"
	"computeplane/internal/iam"
)

// billing is the bridge usage windows cross to billing: iam.usage_records
// by idempotency key, and iam.usage_dead_letters for what billing refuses.
type billing struct{ s *Service }

// Record hands a window over by its key:
//   - a new key is recorded;
//   - the same key with the same content and tenant is a duplicate;
//   - the same key with the same content and another tenant is
//     reattributed to that tenant;
//   - the same key with other content, a window the table refuses
//     (constraint, bad value) or any other error the database reports is
//     dead-lettered with the error kept, and the outcome is returned
//     without an error.
//
// A failure to reach the database (nothing was written, the window can be
// handed over again) is returned as an error wrapping iam.ErrUnavailable.
func (b billing) Record(ctx context.Context, w iam.UsageWindow) (string, error) {
	s := b.s
	if reason := checkWindow(w); reason != "" {
		return s.deadLetter(ctx, w, reason)
	}
	tags, err := marshalTags(w.Tags)
	if err != nil {
		return s.deadLetter(ctx, w, err.Error())
	}
	start, end := dbTime(w.Start), dbTime(w.End)
	var outcome, reason string
	err = s.st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		now := s.now()
		_, err := q.IAMInsertUsage(ctx, db.IAMInsertUsageParams{
			Key: w.Key, TenantID: w.TenantID, Meter: w.Meter, Quantity: w.Quantity,
			WindowStart: start, WindowEnd: end, Tags: tags, RecordedAt: now,
		})
		if err == nil {
			outcome = iam.OutcomeRecorded
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		cur, err := q.IAMGetUsageForUpdate(ctx, w.Key)
		if err != nil {
			return err
		}
		if diff := contentDiff(cur, w, start, end); diff != "" {
			outcome = iam.OutcomeDeadLettered
			reason = fmt.Sprintf("key %s was recorded with another %s", w.Key, diff)
			return nil
		}
		if cur.TenantID == w.TenantID {
			outcome = iam.OutcomeDuplicate
			return nil
		}
		outcome = iam.OutcomeReattributed
		return q.IAMReattributeUsage(ctx, db.IAMReattributeUsageParams{Key: w.Key, TenantID: w.TenantID, RecordedAt: now})
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return s.deadLetter(ctx, w, err.Error())
		}
		return "", unavailable(err)
	}
	if outcome == iam.OutcomeDeadLettered {
		return s.deadLetter(ctx, w, reason)
	}
	return outcome, nil
}

// deadLetter keeps a refused window with the reason.
// What was refused may be what PostgreSQL cannot store (a NUL byte,
// invalid UTF-8), so the strings are made storable first.
func (s *Service) deadLetter(ctx context.Context, w iam.UsageWindow, reason string) (string, error) {
	tags := map[string]string{}
	for k, v := range w.Tags {
		tags[storable(k)] = storable(v)
	}
	tagsJSON, err := json.Marshal(tags)
	if err != nil {
		tagsJSON = []byte("{}")
	}
	if err := s.st.Queries().IAMInsertDeadLetter(ctx, db.IAMInsertDeadLetterParams{
		Key: storable(w.Key), TenantID: storable(w.TenantID), Meter: storable(w.Meter), Quantity: w.Quantity,
		WindowStart: w.Start, WindowEnd: w.End, Tags: tagsJSON, Error: storable(reason), At: s.now(),
	}); err != nil {
		return "", unavailable(fmt.Errorf("dead-letter usage window %s (%s): %w", w.Key, reason, err))
	}
	return iam.OutcomeDeadLettered, nil
}

// storable replaces what a PostgreSQL text (or jsonb string) cannot hold.
func storable(v string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(v, "\uFFFD"), "\x00", "\uFFFD")
}

// checkWindow refuses, before the database does, what billing can never
// take; the table's constraints say the same.
func checkWindow(w iam.UsageWindow) string {
	switch {
	case w.Key == "" || len(w.Key) > 256:
		return "the key must be 1 to 256 characters"
	case w.TenantID == "":
		return "the window names no tenant"
	case w.Meter == "":
		return "the window names no meter"
	case math.IsNaN(w.Quantity) || math.IsInf(w.Quantity, 0) || w.Quantity < 0:
		return fmt.Sprintf("quantity %v is not a finite non-negative number", w.Quantity)
	case !w.End.After(w.Start):
		return "the window ends before it starts"
	}
	return ""
}

func marshalTags(tags map[string]string) ([]byte, error) {
	if tags == nil {
		tags = map[string]string{}
	}
	b, err := json.Marshal(tags)
	if err != nil {
		return nil, fmt.Errorf("tags: %w", err)
	}
	return b, nil
}

// dbTime is t as PostgreSQL keeps it (microseconds), for comparing a
// window with the one recorded.
func dbTime(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

// contentDiff names what differs between the recorded window and w, the
// tenant aside; empty when nothing does.
func contentDiff(cur db.IamUsageRecord, w iam.UsageWindow, start, end time.Time) string {
	switch {
	case cur.Meter != w.Meter:
		return "meter"
	case cur.Quantity != w.Quantity:
		return "quantity"
	case !cur.WindowStart.Equal(start) || !cur.WindowEnd.Equal(end):
		return "window"
	}
	var tags map[string]string
	if err := json.Unmarshal(cur.Tags, &tags); err != nil || !maps.Equal(tags, w.Tags) {
		return "tags"
	}
	return ""
}
