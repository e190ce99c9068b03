package admission

import "github.com/prometheus/client_golang/prometheus"

// Register exposes the controller's state as gauges read at each scrape
// (nothing is done per call): the calls in flight, the in-flight limit
// and the share of late calls the wait check refuses. Sampled over an
// overload they show how the control law moves (docs/benchmarks-notes.md).
func (c *Controller) Register(reg prometheus.Registerer) error {
	if c == nil {
		return nil
	}
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "compute_admission_in_flight", Help: "Calls holding an in-flight slot of the admission controller.",
		}, func() float64 { return float64(c.InFlight()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "compute_admission_in_flight_limit", Help: "The admission controller's in-flight limit now (0: none).",
		}, func() float64 { return float64(c.Limit()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "compute_admission_wait_refused_share", Help: "Share of the calls that waited past admission.queueTargetMs refused now.",
		}, c.WaitShare),
	}
	for _, g := range gauges {
		if err := reg.Register(g); err != nil {
			return err
		}
	}
	return nil
}
