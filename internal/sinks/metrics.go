package sinks

import (
	"github.com/prometheus/client_golang/prometheus"

	"computeplane/internal/metrics"
)

// Metric names.
const (
	MetricLag          = "compute_sink_lag_rows"
	MetricDelivered    = "compute_sink_delivered_total"
	MetricDeadLettered = "compute_sink_dead_letters_total"
)

// Metrics records, per sink (labels kind and sink):
//
//   - compute_sink_lag_rows: rows after the sink's cursor (up to LagCap),
//     measured after each dispatch;
//   - compute_sink_delivered_total: rows the sink accepted;
//   - compute_sink_dead_letters_total: rows the sink gave up on.
//
// A nil *Metrics records nothing.
type Metrics struct {
	lag       *metrics.GaugeVec
	accepted  *metrics.CounterVec
	deadLetts *metrics.CounterVec
}

// NewMetrics registers the sink metrics in reg.
func NewMetrics(reg *metrics.Registry) (*Metrics, error) {
	labels := []string{"kind", "sink"}
	lag, err := reg.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricLag, Help: "Committed rows after the sink's durable cursor (capped).",
	}, labels)
	if err != nil {
		return nil, err
	}
	accepted, err := reg.NewCounterVec(prometheus.CounterOpts{
		Name: MetricDelivered, Help: "Rows the sink accepted.",
	}, labels)
	if err != nil {
		return nil, err
	}
	dead, err := reg.NewCounterVec(prometheus.CounterOpts{
		Name: MetricDeadLettered, Help: "Rows the sink gave up on, recorded as dead letters.",
	}, labels)
	if err != nil {
		return nil, err
	}
	return &Metrics{lag: lag, accepted: accepted, deadLetts: dead}, nil
}

func (m *Metrics) delivered(s Sink, n int64) {
	if m != nil && n > 0 {
		m.accepted.WithLabelValues(s.Kind(), s.ID()).Add(float64(n))
	}
}

func (m *Metrics) deadLettered(s Sink, n int64) {
	if m != nil {
		// Touch the series even at 0 so that it exists from the first dispatch.
		m.deadLetts.WithLabelValues(s.Kind(), s.ID()).Add(float64(n))
	}
}
