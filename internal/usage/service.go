package usage

import (
	"context"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/cursor"
	"computeplane/internal/iam"
	"computeplane/internal/system"
	"computeplane/internal/wire"
)

// Limits of the usage methods (the specification's Limits).
const (
	MaxExportWindows = 50_000
	MaxExportRange   = 93 * 24 * time.Hour
)

// Service implements api.UsageService.
type Service struct{ Cursors *cursor.Sealer }

var _ api.UsageService = Service{}

func jsonUnmarshal(raw []byte, v any) error { return json.Unmarshal(raw, v) }

func textOf(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func output(w db.UsageWindow) api.UsageWindow {
	tags := map[string]string{}
	_ = json.Unmarshal(w.Tags, &tags)
	out := api.UsageWindow{
		IdempotencyKey: w.Key, Meter: w.Meter, Quantity: windowQuantity(w),
		WindowStart: wire.Time(w.WindowStart), WindowEnd: wire.Time(w.WindowEnd), Tags: tags,
	}
	if w.RecordedAt != nil {
		s := wire.Time(*w.RecordedAt)
		out.RecordedAt = &s
	}
	if w.Outcome.Valid {
		out.Outcome = &w.Outcome.String
	}
	return out
}

// windowQuantity is a window's quantity in its meter's unit: counted
// (bytes) or micro-unit-milliseconds of an allocation.
func windowQuantity(w db.UsageWindow) float64 {
	if w.QuantityUnits.Valid {
		return float64(w.QuantityUnits.Int64)
	}
	return Quantity(w.QuantityMicroMs)
}

// span checks a range: to after from (else INVALID_INPUT) and, for an
// export, at most 93 days.
func span(from, to int64, maxRange time.Duration) (time.Time, time.Time, error) {
	f, t := time.UnixMilli(from).UTC(), time.UnixMilli(to).UTC()
	if !t.After(f) {
		return f, t, api.Errorf(api.CodeInvalidInput, "to: must be after from")
	}
	if maxRange > 0 && t.Sub(f) > maxRange {
		return f, t, api.Errorf(api.CodeInvalidInput, "to: a range is at most %d days", int(maxRange.Hours()/24))
	}
	return f, t, nil
}

// endOfTime is the to of a list that names none.
var endOfTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// encodePos is a list position: the last window's start and key.
func encodePos(start time.Time, key string) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(start.UnixMicro()))
	return append(b, key...)
}

func decodePos(b []byte) (time.Time, string, bool) {
	if len(b) < 8 {
		return time.Time{}, "", false
	}
	return time.UnixMicro(int64(binary.BigEndian.Uint64(b[:8]))).UTC(), string(b[8:]), true
}

// List answers usage.list: windows by start (and key) that end after from
// and start before to, pages of limit with a cursor.
func (s Service) List(ctx context.Context, in *api.UsageListInput) (*api.UsageWindowList, error) {
	from, to := int64(0), endOfTime.UnixMilli()
	if in.From != nil {
		from = *in.From
	}
	if in.To != nil {
		to = *in.To
	}
	f, t, err := span(from, to, 0)
	if err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p := db.ListWindowsParams{TenantID: in.TenantID, RangeFrom: f, RangeTo: t, AfterStart: time.Unix(0, 0).UTC(), Lim: int32(in.Limit) + 1}
	if in.ProjectID != nil {
		p.ProjectID = textOf(*in.ProjectID)
	}
	if in.Meter != nil {
		p.Meter = textOf(*in.Meter)
	}
	if in.Cursor != nil {
		raw, err := s.Cursors.Open(api.MethodUsageList, in.TenantID, *in.Cursor)
		start, key, ok := decodePos(raw)
		if err != nil || !ok {
			return nil, api.Errorf(api.CodeInvalidInput, "cursor: not a cursor usage.list returned")
		}
		p.AfterStart, p.AfterKey = start, key
	}
	rows, err := q.ListWindows(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &api.UsageWindowList{Items: make([]api.UsageWindow, 0, len(rows))}
	more := len(rows) > int(in.Limit)
	if more {
		rows = rows[:in.Limit]
	}
	for _, r := range rows {
		out.Items = append(out.Items, output(r))
	}
	if more {
		last := rows[len(rows)-1]
		c := s.Cursors.Seal(api.MethodUsageList, in.TenantID, encodePos(last.WindowStart, last.Key))
		out.Cursor = &c
	}
	return out, nil
}

// exportPage is how many windows one read of an export takes: the export
// walks the range in pages so only one page of rows is held at a time.
const exportPage = 1000

// Export answers usage.export: every window of the range (at most
// MaxExportWindows, then truncated) as CSV or JSON Lines, with per-meter
// totals.
func (s Service) Export(ctx context.Context, in *api.UsageExportInput) (*api.UsageExport, error) {
	f, t, err := span(in.From, in.To, MaxExportRange)
	if err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	p := db.ListWindowsParams{TenantID: in.TenantID, RangeFrom: f, RangeTo: t, AfterStart: time.Unix(0, 0).UTC(), Lim: exportPage}
	if in.ProjectID != nil {
		p.ProjectID = textOf(*in.ProjectID)
	}
	if in.Meter != nil {
		p.Meter = textOf(*in.Meter)
	}
	var b strings.Builder
	enc := newEncoder(&b, in.Format)
	totals := map[string]int64{} // micro-unit-milliseconds
	units := map[string]int64{}  // counted meters' units
	counts := map[string]int64{}
	n, truncated := 0, false
	for {
		rows, err := q.ListWindows(ctx, p)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			if n == MaxExportWindows {
				truncated = true
				break
			}
			if err := enc.write(output(r)); err != nil {
				return nil, err
			}
			totals[r.Meter] += r.QuantityMicroMs
			units[r.Meter] += r.QuantityUnits.Int64
			counts[r.Meter]++
			n++
		}
		if truncated || len(rows) < exportPage {
			break
		}
		last := rows[len(rows)-1]
		p.AfterStart, p.AfterKey = last.WindowStart, last.Key
	}
	if err := enc.flush(); err != nil {
		return nil, err
	}
	meters := map[string]api.MeterTotal{}
	for m, c := range counts {
		meters[m] = api.MeterTotal{Windows: c, Quantity: Quantity(totals[m]) + float64(units[m])}
	}
	return &api.UsageExport{Format: in.Format, Content: b.String(), Windows: int64(n), Meters: meters, Truncated: truncated}, nil
}

// CSVHeader is the header row of a CSV export.
var CSVHeader = []string{"idempotencyKey", "meter", "quantity", "windowStart", "windowEnd", "project", "tags", "recordedAt", "outcome"}

type encoder struct {
	format string
	csv    *csv.Writer
	b      *strings.Builder
}

func newEncoder(b *strings.Builder, format string) *encoder {
	e := &encoder{format: format, b: b}
	if format != "jsonl" {
		e.csv = csv.NewWriter(b)
		_ = e.csv.Write(CSVHeader)
	}
	return e
}

func (e *encoder) write(w api.UsageWindow) error {
	if e.csv == nil {
		line, err := json.Marshal(w)
		if err != nil {
			return err
		}
		e.b.Write(line)
		e.b.WriteByte('\n')
		return nil
	}
	tags, err := json.Marshal(w.Tags)
	if err != nil {
		return err
	}
	recorded, outcome := "", ""
	if w.RecordedAt != nil {
		recorded = *w.RecordedAt
	}
	if w.Outcome != nil {
		outcome = *w.Outcome
	}
	return e.csv.Write([]string{
		w.IdempotencyKey, w.Meter, strconv.FormatFloat(w.Quantity, 'f', -1, 64), w.WindowStart, w.WindowEnd,
		w.Tags[TagProject], string(tags), recorded, outcome,
	})
}

func (e *encoder) flush() error {
	if e.csv == nil {
		return nil
	}
	e.csv.Flush()
	return e.csv.Error()
}

// Check is usage's part of system.selfCheck: windows billing
// dead-lettered, and closed windows not handed over after two hand-over
// periods (a backlog).
func Check(usageEvery time.Duration, now func() time.Time) system.Check {
	return system.Check{Name: "usage", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		c, err := db.New(tx).UsageCensus(ctx, now().Add(-2*usageEvery))
		if err != nil {
			return nil, err
		}
		out := []api.Finding{{Check: "usage", Severity: system.SeverityInfo, Message: "usage handed to billing on time"}}
		if c.DeadLettered > 0 {
			out = append(out, api.Finding{Check: "usage", Severity: system.SeverityWarning,
				Message: fmt.Sprintf("%d usage windows are dead-lettered by billing", c.DeadLettered)})
		}
		if c.Backlog > 0 {
			out = append(out, api.Finding{Check: "usage", Severity: system.SeverityWarning,
				Message: fmt.Sprintf("%d closed usage windows not handed to billing after two hand-over periods", c.Backlog)})
		}
		return out, nil
	}}
}
