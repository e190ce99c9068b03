package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RPC metric names.
const (
	RPCRequestsTotal   = "compute_rpc_requests_total"
	RPCDurationSeconds = "compute_rpc_duration_seconds"
	RPCDeniedTotal     = "compute_rpc_denied_total"
	RPCDBRoundTrips    = "compute_rpc_db_round_trips"
)

// RPCRoundTripBuckets are the round-trip histogram's buckets: the fleet
// paths' budget is 8.
var RPCRoundTripBuckets = []float64{0, 1, 2, 3, 4, 6, 8, 10, 15, 20, 30, 50}

// CodeOK is the code label callers pass for a successful call.
const CodeOK = "OK"

// RPCDurationBuckets are the duration histogram buckets in seconds; they
// reach past the 30 s longest wait of a mutation.
var RPCDurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// RPC records the per-method RPC metrics:
//
//   - compute_rpc_requests_total{method,code}: every call;
//   - compute_rpc_duration_seconds{method}: every call's duration;
//   - compute_rpc_denied_total{method,code}: calls answered 401, 403 or 429,
//     which observers treat as denied outcomes;
//   - compute_rpc_db_round_trips{method}: the database round trips of each
//     call (statements sent alone and pipelines), decision included.
//
// A nil *RPC records nothing, so a process without metrics can pass nil.
type RPC struct {
	requests *CounterVec
	duration *HistogramVec
	denied   *CounterVec
	trips    *HistogramVec
}

// NewRPC builds the RPC metrics and registers them in reg. It fails when
// they are already registered there.
func NewRPC(reg *Registry) (*RPC, error) {
	requests, err := reg.NewCounterVec(rpcRequestsOpts(), []string{"method", "code"})
	if err != nil {
		return nil, err
	}
	duration, err := reg.NewHistogramVec(rpcDurationOpts(), []string{"method"})
	if err != nil {
		reg.reg.Unregister(requests.c.collector)
		return nil, err
	}
	denied, err := reg.NewCounterVec(rpcDeniedOpts(), []string{"method", "code"})
	if err != nil {
		reg.reg.Unregister(requests.c.collector)
		reg.reg.Unregister(duration.c.collector)
		return nil, err
	}
	trips, err := reg.NewHistogramVec(prometheus.HistogramOpts{
		Name:    RPCDBRoundTrips,
		Help:    "Database round trips per RPC call by method.",
		Buckets: RPCRoundTripBuckets,
	}, []string{"method"})
	if err != nil {
		reg.reg.Unregister(requests.c.collector)
		reg.reg.Unregister(duration.c.collector)
		reg.reg.Unregister(denied.c.collector)
		return nil, err
	}
	return &RPC{requests: requests, duration: duration, denied: denied, trips: trips}, nil
}

func rpcRequestsOpts() prometheus.CounterOpts {
	return prometheus.CounterOpts{
		Name: RPCRequestsTotal,
		Help: "RPC calls by method and result code.",
	}
}

func rpcDurationOpts() prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name:    RPCDurationSeconds,
		Help:    "RPC call duration in seconds by method.",
		Buckets: RPCDurationBuckets,
	}
}

func rpcDeniedOpts() prometheus.CounterOpts {
	return prometheus.CounterOpts{
		Name: RPCDeniedTotal,
		Help: "RPC calls answered 401, 403 or 429 (denied outcomes) by method and code.",
	}
}

// Observe records one call of method that ended with the error code code
// ([CodeOK] on success), HTTP status status, after d. An empty method or
// code is recorded as (unknown); a negative d as 0.
func (r *RPC) Observe(method, code string, status int, d time.Duration) {
	if r == nil {
		return
	}
	r.requests.WithLabelValues(method, code).Inc()
	if d < 0 {
		d = 0
	}
	r.duration.WithLabelValues(method).Observe(d.Seconds())
	if Denied(status) {
		r.denied.WithLabelValues(method, code).Inc()
	}
}

// Denied reports whether an HTTP status is a denied outcome: 401, 403 or
// 429.
func Denied(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		return true
	}
	return false
}

// RoundTrips records the database round trips of one call of method.
func (r *RPC) RoundTrips(method string, n int64) {
	if r == nil {
		return
	}
	r.trips.WithLabelValues(method).Observe(float64(n))
}
