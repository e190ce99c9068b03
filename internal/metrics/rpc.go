package metrics

import (
	"net/http"
	"sync"
	"sync/atomic"
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

	// series holds each method's children of a successful call, resolved
	// once: the hot path reads a copy-on-write map (no lock, no
	// allocation) instead of building a label key per call.
	series   atomic.Pointer[map[string]*methodSeries]
	seriesMu sync.Mutex
}

// methodSeries are the children one successful call of a method touches,
// each resolved on its first use (a series appears when first recorded,
// as with WithLabelValues).
type methodSeries struct {
	ok       lazy[prometheus.Counter]
	duration lazy[prometheus.Observer]
	trips    lazy[prometheus.Observer]
	// The RATE_LIMITED children: under overload most calls are refusals,
	// and WithLabelValues costs allocations per call.
	limited       lazy[prometheus.Counter]
	limitedDenied lazy[prometheus.Counter]
}

// codeRateLimited is api.CodeRateLimited (not imported here).
const codeRateLimited = "RATE_LIMITED"

// lazy is a child resolved once.
type lazy[T any] struct{ p atomic.Pointer[T] }

func (l *lazy[T]) get(resolve func() T) T {
	if p := l.p.Load(); p != nil {
		return *p
	}
	v := resolve()
	l.p.Store(&v)
	return v
}

// of returns method's resolved children, resolving them on first use.
func (r *RPC) of(method string) *methodSeries {
	if m := r.series.Load(); m != nil {
		if s, ok := (*m)[method]; ok {
			return s
		}
	}
	r.seriesMu.Lock()
	defer r.seriesMu.Unlock()
	old := r.series.Load()
	if old != nil {
		if s, ok := (*old)[method]; ok {
			return s
		}
	}
	s := &methodSeries{}
	next := make(map[string]*methodSeries, 1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	// The capped vectors fold methods beyond their cap into (other): the
	// map holds at most the catalog's methods plus the names that fold.
	if len(next) < maxResolvedMethods {
		next[method] = s
		r.series.Store(&next)
	}
	return s
}

// maxResolvedMethods bounds the resolved map against arbitrary method
// names (the envelope passes only the registry's names and "(unknown)").
const maxResolvedMethods = 4096

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
	s := r.of(method)
	limited := code == codeRateLimited && status == http.StatusTooManyRequests
	switch {
	case code == CodeOK:
		s.ok.get(func() prometheus.Counter { return r.requests.WithLabelValues(method, CodeOK) }).Inc()
	case limited:
		s.limited.get(func() prometheus.Counter { return r.requests.WithLabelValues(method, code) }).Inc()
	default:
		r.requests.WithLabelValues(method, code).Inc()
	}
	if d < 0 {
		d = 0
	}
	s.duration.get(func() prometheus.Observer { return r.duration.WithLabelValues(method) }).Observe(d.Seconds())
	switch {
	case limited:
		s.limitedDenied.get(func() prometheus.Counter { return r.denied.WithLabelValues(method, code) }).Inc()
	case Denied(status):
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
	r.of(method).trips.get(func() prometheus.Observer { return r.trips.WithLabelValues(method) }).Observe(float64(n))
}
