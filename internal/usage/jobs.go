package usage

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"computeplane/internal/iam"
	"computeplane/internal/metrics"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

// Names the usage work is registered under.
const (
	RollupReconciler = "usage-rollup"
	HandoverJob      = "usage-handover"
)

// MetricHandedOver counts windows handed to billing, by outcome.
const MetricHandedOver = "compute_usage_windows_handed_over_total"

// Rollups is the rollup's reconciler: its keys are the tenants with
// allocations to window, sharded by tenant; each Sync rolls one tenant up
// in one transaction fenced by the shard's lease.
type Rollups struct {
	Store *store.Store
	Now   func() time.Time
}

var _ workers.Reconciler = (*Rollups)(nil)

// Keys lists the tenants of shard with work for the rollup.
func (r *Rollups) Keys(ctx context.Context, shard int) ([]string, error) {
	tenants, err := r.Store.Queries().TenantsToRoll(ctx, r.Now().UTC().Truncate(time.Hour))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range tenants {
		if workers.ShardOf(t) == shard {
			out = append(out, t)
		}
	}
	return out, nil
}

// Sync rolls one tenant up.
func (r *Rollups) Sync(ctx context.Context, l workers.Lease, tenant string) (workers.Result, error) {
	return workers.Done, workers.Tx(ctx, r.Store, nil, l.Fence, func(ctx context.Context, tx pgx.Tx) error {
		_, err := Rollup(ctx, tx, tenant, r.Now())
		return err
	})
}

// Handovers hands closed windows to billing every Every, in batches, each
// batch in a transaction fenced by the job's lease.
type Handovers struct {
	Store   *store.Store
	Billing iam.Billing
	Every   time.Duration
	Batch   int
	Now     func() time.Time
	counted *metrics.CounterVec
}

// NewHandovers returns the hand-over job, counting outcomes in reg.
func NewHandovers(st *store.Store, billing iam.Billing, every time.Duration, reg *metrics.Registry) (*Handovers, error) {
	c, err := reg.NewCounterVec(prometheus.CounterOpts{Name: MetricHandedOver, Help: "Usage windows handed to billing, by outcome."}, []string{"outcome"})
	if err != nil {
		return nil, err
	}
	return &Handovers{Store: st, Billing: billing, Every: every, Batch: 500, Now: time.Now, counted: c}, nil
}

// Periodic is the job: a hand-over now and every Every; a failed one is
// backed off by the runner.
func (h *Handovers) Periodic() *workers.Periodic {
	return &workers.Periodic{Name: HandoverJob, Interval: h.Every, Backoff: true, Pass: h.Once}
}

// Once hands over every closed window pending now, batch by batch.
func (h *Handovers) Once(ctx context.Context, fence workers.Fence) error {
	for {
		var out Outcomes
		err := workers.Tx(ctx, h.Store, nil, fence, func(ctx context.Context, tx pgx.Tx) (err error) {
			out, err = Handover(ctx, tx, h.Billing, h.Now(), h.Batch)
			return err
		})
		if err != nil {
			return err
		}
		decided := 0
		for outcome, n := range out {
			if outcome != "pending" {
				decided += n
				if h.counted != nil {
					h.counted.WithLabelValues(outcome).Add(float64(n))
				}
			}
		}
		if decided < h.Batch {
			return nil
		}
	}
}
