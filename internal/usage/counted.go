package usage

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/ids"
)

// Counted meters are quantities a node counts (a VM's egress bytes)
// rather than rates over time: each status adds what a counter grew by
// to a row per tenant, project, instance, meter and hour (counted_usage),
// and the rollup windows a closed hour's row as it does an allocation's
// hour, key cmp:<countedId>:<windowStartMs>. A window's quantity is then
// in the meter's unit (quantity_units), not in micro-unit-milliseconds.

// TagInstance is the window tag of a counted row's instance.
const TagInstance = "instance"

// EgressCount is what a daemon reported of one VM's egress counters:
// cumulative since the VM's network was added on that node, from zero
// again when the daemon's manager restarts or the VM's tap is re-created.
type EgressCount struct {
	InstanceID string
	Tx, Rx     uint64
}

// MeterEgress records the counters a node's status reports, in the
// status's transaction, at (the hour the growth is counted in): per
// instance of the node, the growth since the counters last seen goes to
// the hour's vps.egress.bytes row of the instance's tenant. A counter
// lower than last seen (or first seen, or seen on another node) is a new
// count: all of it is growth. A warm instance (no tenant's work yet) has
// its counters kept and nothing metered, so a claim bills only what comes
// after it. Instances not on the node are left alone; the counters of
// the node's deleted instances are dropped. A status that counts nothing
// (a node without networks, the common case) costs no query: it sits on
// every status write.
func MeterEgress(ctx context.Context, tx pgx.Tx, node string, reported []EgressCount, at time.Time) error {
	if !slices.ContainsFunc(reported, func(r EgressCount) bool { return r.Tx != 0 || r.Rx != 0 }) {
		return nil
	}
	q := db.New(tx)
	byID := make(map[string]EgressCount, len(reported))
	idsOf := make([]string, 0, len(reported))
	for _, r := range reported {
		byID[r.InstanceID] = r
		idsOf = append(idsOf, r.InstanceID)
	}
	rows, err := q.EgressCountersOf(ctx, db.EgressCountersOfParams{InstanceIds: idsOf, NodeID: pgtype.Text{String: node, Valid: true}})
	if err != nil {
		return err
	}
	var put db.PutEgressCountersParams
	var add db.AddCountedParams
	for _, r := range rows {
		now := byID[r.InstanceID]
		sent, got := clampInt64(now.Tx), clampInt64(now.Rx)
		known := r.CountedOn.Valid && r.CountedOn.String == node
		if known && r.TxBytes.Int64 == sent && r.RxBytes.Int64 == got {
			continue
		}
		if !known && sent == 0 && got == 0 {
			continue // nothing counted yet: no row to keep
		}
		put.InstanceIds, put.Tx, put.Rx = append(put.InstanceIds, r.InstanceID), append(put.Tx, sent), append(put.Rx, got)
		grown := growth(known, r.TxBytes.Int64, sent) + growth(known, r.RxBytes.Int64, got)
		if grown <= 0 || r.Kind == "warm" {
			continue
		}
		add.CountedIds, add.TenantIds = append(add.CountedIds, ids.New("cnt")), append(add.TenantIds, r.TenantID)
		add.InstanceIds, add.Quantities = append(add.InstanceIds, r.InstanceID), append(add.Quantities, grown)
	}
	if len(put.InstanceIds) > 0 {
		put.NodeID, put.At = node, at
		if err := q.PutEgressCounters(ctx, put); err != nil {
			return err
		}
	}
	if len(add.InstanceIds) > 0 {
		add.Meter, add.HourStart = api.MeterVpsEgressBytes, at.UTC().Truncate(time.Hour)
		if err := q.AddCounted(ctx, add); err != nil {
			return err
		}
	}
	return q.ForgetEgressCounters(ctx, node)
}

// growth is what a cumulative counter grew by since last (a new count
// when it went down or was not known).
func growth(known bool, last, now int64) int64 {
	if !known || now < last {
		return now
	}
	return now - last
}

func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// rollCounted writes a window for each of tenant's counted rows of hours
// closed by horizon with quantity not windowed yet: the first window of a
// row holds what it counted, and growth added after it (a status of the
// hour committed after the rollup) an adjustment window of its own.
func rollCounted(ctx context.Context, q *db.Queries, tenant string, horizon time.Time) (int, error) {
	rows, err := q.CountedToRoll(ctx, db.CountedToRollParams{TenantID: tenant, Horizon: horizon})
	if err != nil {
		return 0, err
	}
	written := 0
	for _, c := range rows {
		tags := map[string]string{TagInstance: c.InstanceID}
		if c.ProjectID.Valid {
			tags[TagProject] = c.ProjectID.String
		}
		raw, err := json.Marshal(tags)
		if err != nil {
			return written, err
		}
		start := c.HourStart.UTC()
		if err := q.InsertCountedWindow(ctx, db.InsertCountedWindowParams{
			Key: Key(c.CountedID, start, c.Windows), CountedID: pgtype.Text{String: c.CountedID, Valid: true},
			TenantID: c.TenantID, ProjectID: c.ProjectID, Meter: c.Meter, WindowStart: start, WindowEnd: start.Add(time.Hour),
			QuantityUnits: pgtype.Int8{Int64: c.Quantity - c.Windowed, Valid: true}, Tags: raw, Adjustment: c.Windows,
		}); err != nil {
			return written, err
		}
		if err := q.MarkCountedWindowed(ctx, db.MarkCountedWindowedParams{CountedID: c.CountedID, Windowed: c.Quantity}); err != nil {
			return written, err
		}
		written++
	}
	return written, nil
}
