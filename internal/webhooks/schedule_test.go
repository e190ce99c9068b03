package webhooks

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
)

func TestBackoffScheduleWithJitter(t *testing.T) {
	t.Parallel()
	want := []time.Duration{
		5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour,
		10 * time.Hour, 14 * time.Hour, 20 * time.Hour, 24 * time.Hour,
	}
	require.Equal(t, want, Backoff)
	require.Equal(t, 10, MaxAttempts)
	var total time.Duration
	for i, d := range want {
		assert.Equal(t, time.Duration(float64(d)*0.9), backoff(i+1, 0), "lowest jitter")
		assert.Equal(t, d, backoff(i+1, 0.5), "middle")
		assert.InDelta(t, float64(d)*1.1, float64(backoff(i+1, 0.9999999)), float64(d)*0.0001, "highest jitter")
		total += d
	}
	assert.InDelta(t, 3*24*time.Hour, total, float64(6*time.Hour), "about three days")
}

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	tests := []struct {
		name    string
		res     result
		attempt int
		want    decision
	}{
		{"200", result{status: 200}, 1, decision{outcome: OutcomeDelivered, state: StateDelivered}},
		{"204 on the last attempt", result{status: 204}, 10, decision{outcome: OutcomeDelivered, state: StateDelivered}},
		{"299", result{status: 299}, 3, decision{outcome: OutcomeDelivered, state: StateDelivered}},
		{"410 pauses", result{status: 410}, 1, decision{outcome: OutcomeGone, state: StateCancelled}},
		{"410 on the last attempt", result{status: 410}, 10, decision{outcome: OutcomeGone, state: StateCancelled}},
		{"301 is a failure", result{status: 301}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(5 * time.Second)}},
		{"304 is a failure", result{status: 304}, 2, decision{outcome: OutcomeRetry, state: StatePending, next: at(5 * time.Minute)}},
		{"500", result{status: 500}, 3, decision{outcome: OutcomeRetry, state: StatePending, next: at(30 * time.Minute)}},
		{"400", result{status: 400}, 9, decision{outcome: OutcomeRetry, state: StatePending, next: at(24 * time.Hour)}},
		{"error", result{err: errors.New("connection refused")}, 4, decision{outcome: OutcomeRetry, state: StatePending, next: at(2 * time.Hour)}},
		{"the tenth failure is dead", result{status: 500}, 10, decision{outcome: OutcomeDead, state: StateDead}},
		{"an error the tenth time is dead", result{err: errors.New("x")}, 10, decision{outcome: OutcomeDead, state: StateDead}},
		{"429 Retry-After seconds", result{status: 429, retryAfter: "120"}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(2 * time.Minute)}},
		{"503 Retry-After seconds", result{status: 503, retryAfter: " 7 "}, 5, decision{outcome: OutcomeRetry, state: StatePending, next: at(7 * time.Second)}},
		{"503 Retry-After date", result{status: 503, retryAfter: now.Add(time.Hour).Format(http.TimeFormat)}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(time.Hour)}},
		{"429 Retry-After 0 waits a second", result{status: 429, retryAfter: "0"}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(time.Second)}},
		{"429 Retry-After capped", result{status: 429, retryAfter: "9999999"}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(24 * time.Hour)}},
		{"429 without Retry-After", result{status: 429}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(5 * time.Second)}},
		{"429 unreadable Retry-After", result{status: 429, retryAfter: "soon"}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(5 * time.Second)}},
		{"Retry-After of a 500 is not honoured", result{status: 500, retryAfter: "120"}, 1, decision{outcome: OutcomeRetry, state: StatePending, next: at(5 * time.Second)}},
		{"429 on the last attempt is dead", result{status: 429, retryAfter: "1"}, 10, decision{outcome: OutcomeDead, state: StateDead}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, decide(tc.res, tc.attempt, now, 0.5))
		})
	}
}

// The snapshot arithmetic agrees with PostgreSQL's pg_visible_in_snapshot.
func TestSnapshotVisibilityAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	snaps := []string{"100:100:", "100:110:", "100:110:100,103,109", "5:9:5,6", "18446744073709551000:18446744073709551010:18446744073709551001"}
	for _, s := range snaps {
		sn, err := parseSnapshot(s)
		require.NoError(t, err, s)
		for _, x := range []uint64{1, 4, 5, 6, 7, 8, 9, 10, 99, 100, 101, 103, 104, 109, 110, 111, 18446744073709551000, 18446744073709551001, 18446744073709551002, 18446744073709551010} {
			var want bool
			require.NoError(t, st.Pool().QueryRow(ctx, "SELECT pg_visible_in_snapshot($1::text::xid8, $2::pg_snapshot)", strconv.FormatUint(x, 10), s).Scan(&want))
			assert.Equal(t, want, sn.visible(x), "%d in %s", x, s)
		}
	}
	// The text form PostgreSQL writes parses.
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		var s string
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&s))
		_, err := parseSnapshot(s)
		return err
	}))
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x", "1:2:3,", "-1:2:"} {
		_, err := parseSnapshot(bad)
		assert.Error(t, err, bad)
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, typ string
		want         bool
	}{
		{"*", "site.created", true},
		{"site.created", "site.created", true},
		{"site.created", "site.updated", false},
		{"site.*", "site.created", true},
		{"site.*", "site", false},
		{"site.*", "sites.created", false},
		{"sandbox.*", "sandbox.volume.created", true},
		{"sandbox.volume.*", "sandbox.volume.deleted", true},
		{"sandbox.volume.*", "sandbox.template.x", false},
		{"node.*", "node.cordoned", true},
		{"reservation.*", "node.cordoned", false},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, Match(tc.pattern, tc.typ), "%s %s", tc.pattern, tc.typ)
	}
	assert.True(t, MatchAny([]string{"node.*", "site.deleted"}, "site.deleted"))
	assert.False(t, MatchAny([]string{"node.*", "site.deleted"}, "site.created"))
}
