package webhooks

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"computeplane/internal/metrics"
)

// Metric names of the delivery engine.
const (
	MetricDeliveries     = "compute_webhook_deliveries_total"
	MetricAttemptSeconds = "compute_webhook_attempt_duration_seconds"
	MetricLagSeconds     = "compute_webhook_delivery_lag_seconds"
	MetricFannedOut      = "compute_webhook_fanout_deliveries_total"
	MetricInflight       = "compute_webhook_attempts_in_flight"
	MetricOldestPending  = "compute_webhook_oldest_pending_seconds"
)

// LagBuckets reach from the milliseconds of a delivery made at once to the
// days of the last retry.
var LagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 60, 300, 1800, 7200, 36000, 86400, 259200}

// engineMetrics records what the engine does; nil records nothing.
//
//   - compute_webhook_deliveries_total{outcome}: attempts by outcome
//     (delivered, retry, dead, gone, cancelled, released);
//   - compute_webhook_attempt_duration_seconds{outcome}: each attempt's
//     HTTP exchange;
//   - compute_webhook_delivery_lag_seconds: from the event (or ping) to
//     its delivery, the commit-to-delivery latency;
//   - compute_webhook_fanout_deliveries_total: deliveries queued by FanOut;
//   - compute_webhook_attempts_in_flight: attempts running in this process;
//   - compute_webhook_oldest_pending_seconds: age of the oldest pending
//     delivery's event (delivery lag, updated by Run).
type engineMetrics struct {
	outcomes  *metrics.CounterVec
	duration  *metrics.HistogramVec
	lag       *metrics.HistogramVec
	fannedOut *metrics.CounterVec
	inflight  *metrics.GaugeVec
	oldest    *metrics.GaugeVec
}

func newEngineMetrics(reg *metrics.Registry) (*engineMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &engineMetrics{}
	var err error
	if m.outcomes, err = reg.NewCounterVec(prometheus.CounterOpts{
		Name: MetricDeliveries, Help: "Webhook delivery attempts by outcome.",
	}, []string{"outcome"}); err != nil {
		return nil, err
	}
	if m.duration, err = reg.NewHistogramVec(prometheus.HistogramOpts{
		Name: MetricAttemptSeconds, Help: "Duration of webhook delivery attempts.", Buckets: metrics.RPCDurationBuckets,
	}, []string{"outcome"}); err != nil {
		return nil, err
	}
	if m.lag, err = reg.NewHistogramVec(prometheus.HistogramOpts{
		Name: MetricLagSeconds, Help: "Time from an event to its webhook delivery.", Buckets: LagBuckets,
	}, nil); err != nil {
		return nil, err
	}
	if m.fannedOut, err = reg.NewCounterVec(prometheus.CounterOpts{
		Name: MetricFannedOut, Help: "Webhook deliveries queued from the outbox.",
	}, nil); err != nil {
		return nil, err
	}
	if m.inflight, err = reg.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricInflight, Help: "Webhook delivery attempts running in this process.",
	}, nil); err != nil {
		return nil, err
	}
	if m.oldest, err = reg.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricOldestPending, Help: "Age of the event of the oldest pending webhook delivery (0 when none).",
	}, nil); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *engineMetrics) attempt(o Outcome, d time.Duration) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(string(o)).Inc()
	m.duration.WithLabelValues(string(o)).Observe(d.Seconds())
}

func (m *engineMetrics) cancelled(n int64) {
	if m == nil || n == 0 {
		return
	}
	m.outcomes.WithLabelValues(string(OutcomeCancelled)).Add(float64(n))
}

func (m *engineMetrics) delivered(lag time.Duration) {
	if m == nil {
		return
	}
	m.lag.WithLabelValues().Observe(max(lag, 0).Seconds())
}

func (m *engineMetrics) queued(n int64) {
	if m == nil || n == 0 {
		return
	}
	m.fannedOut.WithLabelValues().Add(float64(n))
}

func (m *engineMetrics) running(delta float64) {
	if m == nil {
		return
	}
	m.inflight.WithLabelValues().Add(delta)
}

func (m *engineMetrics) oldestPending(age time.Duration) {
	if m == nil {
		return
	}
	m.oldest.WithLabelValues().Set(max(age, 0).Seconds())
}
