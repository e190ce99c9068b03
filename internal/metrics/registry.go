package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// DefaultMaxSeries is the default number of distinct label sets a metric
// keeps before further new label sets fold into the (other) series.
const DefaultMaxSeries = 2000

// Registry is a Prometheus registry of this process's metrics. It is not the
// global prometheus.DefaultRegisterer. A new Registry already holds the Go
// runtime and process collectors.
//
// A Registry is safe for concurrent use.
type Registry struct {
	reg       *prometheus.Registry
	maxSeries int
}

// Option configures a [Registry].
type Option func(*Registry)

// WithMaxSeries sets the number of distinct label sets each capped vector
// built from the registry keeps (default [DefaultMaxSeries]). Values below 1
// are treated as 1. Meant mainly for tests.
func WithMaxSeries(n int) Option {
	return func(r *Registry) {
		if n < 1 {
			n = 1
		}
		r.maxSeries = n
	}
}

// NewRegistry returns a registry holding the Go runtime and process
// collectors.
func NewRegistry(opts ...Option) *Registry {
	r := &Registry{reg: prometheus.NewRegistry(), maxSeries: DefaultMaxSeries}
	for _, o := range opts {
		o(r)
	}
	r.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}

// Prometheus returns the underlying registry, for gathering and for
// registering collectors that carry no caller-chosen labels. Collectors
// registered directly bypass the label caps of this package.
func (r *Registry) Prometheus() *prometheus.Registry { return r.reg }

// MaxSeries returns the per-metric label-set cap of vectors built from r.
func (r *Registry) MaxSeries() int { return r.maxSeries }
