package embedded

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/iam"
)

func TestBillingOutcomes(t *testing.T) {
	s, st, _ := newTestService(t)
	ctx := context.Background()
	b := s.Billing()
	start := time.Date(2031, 3, 4, 5, 0, 0, 0, time.UTC)
	w := iam.UsageWindow{
		Key: "cmp:alloc-1:1930453200000", TenantID: "acme", Meter: "vcpu-hours", Quantity: 1.5,
		Start: start, End: start.Add(time.Hour), Tags: map[string]string{"project": "prj-1"},
	}
	deadLetters := func(key string) []string {
		t.Helper()
		rows, err := st.Queries().IAMListDeadLetters(ctx, key)
		require.NoError(t, err)
		var out []string
		for _, r := range rows {
			out = append(out, r.Error)
		}
		return out
	}

	out, err := b.Record(ctx, w)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeRecorded, out)

	// Same key, same content: a duplicate; the window in another zone is
	// the same window.
	same := w
	same.Start, same.End = w.Start.In(time.FixedZone("x", 3600)), w.End.In(time.FixedZone("x", 3600))
	out, err = b.Record(ctx, same)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeDuplicate, out)

	// Same key, another tenant: reattributed.
	moved := w
	moved.TenantID = "globex"
	out, err = b.Record(ctx, moved)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeReattributed, out)
	row, err := st.Queries().IAMGetUsage(ctx, w.Key)
	require.NoError(t, err)
	assert.Equal(t, "globex", row.TenantID)
	assert.Equal(t, iam.OutcomeReattributed, row.Outcome)
	out, err = b.Record(ctx, moved)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeDuplicate, out)

	// Same key, other content: dead-lettered with the reason; the record
	// is unchanged.
	changed := moved
	changed.Quantity = 2
	out, err = b.Record(ctx, changed)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeDeadLettered, out)
	assert.Equal(t, []string{"key cmp:alloc-1:1930453200000 was recorded with another quantity"}, deadLetters(w.Key))
	row, err = st.Queries().IAMGetUsage(ctx, w.Key)
	require.NoError(t, err)
	assert.Equal(t, 1.5, row.Quantity)
	retagged := moved
	retagged.Tags = map[string]string{"project": "prj-2"}
	out, err = b.Record(ctx, retagged)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeDeadLettered, out)

	// Windows billing cannot take.
	for name, bad := range map[string]func(*iam.UsageWindow){
		"negative":     func(w *iam.UsageWindow) { w.Quantity = -1 },
		"NaN":          func(w *iam.UsageWindow) { w.Quantity = math.NaN() },
		"inverted":     func(w *iam.UsageWindow) { w.End = w.Start },
		"no tenant":    func(w *iam.UsageWindow) { w.TenantID = "" },
		"no meter":     func(w *iam.UsageWindow) { w.Meter = "" },
		"database NUL": func(w *iam.UsageWindow) { w.Meter = "vcpu\x00hours" }, // refused by PostgreSQL
		"database tag": func(w *iam.UsageWindow) { w.Tags = map[string]string{"p": "a\x00b"} },
	} {
		t.Run(name, func(t *testing.T) {
			x := w
			x.Key = "cmp:bad-" + name + ":0"
			bad(&x)
			out, err := b.Record(ctx, x)
			require.NoError(t, err)
			assert.Equal(t, iam.OutcomeDeadLettered, out)
			errs := deadLetters(x.Key)
			require.Len(t, errs, 1)
			assert.NotEmpty(t, errs[0])
			_, err = st.Queries().IAMGetUsage(ctx, x.Key)
			assert.Error(t, err, "nothing recorded")
		})
	}

	// The database out of reach: an error, nothing dead-lettered, the
	// window can be handed over again.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	fresh := w
	fresh.Key = "cmp:alloc-2:0"
	_, err = b.Record(cctx, fresh)
	assert.ErrorIs(t, err, iam.ErrUnavailable)
	assert.Empty(t, deadLetters(fresh.Key))
	out, err = b.Record(ctx, fresh)
	require.NoError(t, err)
	assert.Equal(t, iam.OutcomeRecorded, out)
}
