package metrics

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values substituted by the capped vectors.
const (
	// ValueInvalid replaces a label value longer than MaxLabelValueLen chars
	// or not valid UTF-8.
	ValueInvalid = "(invalid)"
	// ValueUnknown replaces an empty label value.
	ValueUnknown = "(unknown)"
	// ValueOther is every label value of the series that new label sets
	// fold into once a metric holds its maximum number of label sets.
	ValueOther = "(other)"
)

// MaxLabelValueLen is the longest label value (in chars) kept as is.
const MaxLabelValueLen = 256

// refusedLabelWords are the words a label name may not contain (matched
// case-insensitively): per-tenant, per-identity and per-user labels are
// refused by the specification.
var refusedLabelWords = []string{"tenant", "identity", "user"}

// ErrRefusedLabel is wrapped by the error returned when a vector is built
// with a refused label name.
var ErrRefusedLabel = errors.New("metrics: refused label")

// RefusedLabel reports whether a label named name is refused: its name
// contains tenant, identity or user, ignoring case (tenant, tenantId,
// tenant_id, identity, identityId, user, userId, ...).
func RefusedLabel(name string) bool {
	lower := strings.ToLower(name)
	for _, w := range refusedLabelWords {
		if strings.Contains(lower, w) {
			return true
		}
	}
	return false
}

func checkLabels(metric string, labels []string, constLabels prometheus.Labels) error {
	for _, l := range labels {
		if RefusedLabel(l) {
			return fmt.Errorf("%w %q on metric %q: tenant, identity and user labels are not allowed", ErrRefusedLabel, l, metric)
		}
	}
	for l := range constLabels {
		if RefusedLabel(l) {
			return fmt.Errorf("%w %q (const label) on metric %q: tenant, identity and user labels are not allowed", ErrRefusedLabel, l, metric)
		}
	}
	return nil
}

// SanitizeLabelValue returns the value a capped vector records for v:
// ValueUnknown for "", ValueInvalid for a value that is not valid UTF-8 or
// longer than MaxLabelValueLen chars, otherwise v.
func SanitizeLabelValue(v string) string {
	switch {
	case v == "":
		return ValueUnknown
	case len(v) > 4*MaxLabelValueLen:
		// More than 256 chars whatever the encoding (at most 4 bytes a
		// char); checked first so an oversized value costs no scan.
		return ValueInvalid
	case !utf8.ValidString(v):
		return ValueInvalid
	case len(v) > MaxLabelValueLen && utf8.RuneCountInString(v) > MaxLabelValueLen:
		return ValueInvalid
	}
	return v
}

// keySep separates label values in a series key. 0xff never occurs in valid
// UTF-8, and sanitized values are valid UTF-8, so keys are unambiguous.
const keySep = "\xff"

// capped maps label values to children of a Prometheus vector, admitting at
// most limit distinct label sets and folding the rest into the (other)
// series.
//
// The hot path (a label set seen before) is one sync.Map load. Admitting a
// new label set takes a mutex. Once the cap is reached, unknown label sets go
// straight to the (other) child without locking.
type capped[T any] struct {
	name   string
	labels []string
	limit  int
	child  func(values ...string) T
	// collector is the registered Prometheus vector.
	collector prometheus.Collector

	known sync.Map // key string -> T

	mu       sync.Mutex
	n        int               // admitted label sets; guarded by mu
	full     atomic.Bool       // n >= limit
	other    atomic.Pointer[T] // the (other) child, created on first fold
	otherKey string
}

func newCapped[T any](name string, labels []string, limit int, collector prometheus.Collector, child func(...string) T) *capped[T] {
	ls := append([]string(nil), labels...)
	others := make([]string, len(ls))
	for i := range others {
		others[i] = ValueOther
	}
	return &capped[T]{
		name:      name,
		labels:    ls,
		limit:     limit,
		child:     child,
		collector: collector,
		otherKey:  strings.Join(others, keySep),
	}
}

// key sanitizes values and returns the series key and the sanitized values.
// The values slice is copied only when a value changes.
func (c *capped[T]) key(values []string) (string, []string) {
	if len(values) != len(c.labels) {
		panic(fmt.Sprintf("metrics: %s: got %d label values for %d labels %v", c.name, len(values), len(c.labels), c.labels))
	}
	clean := values
	copied := false
	for i, v := range values {
		if s := SanitizeLabelValue(v); s != v {
			if !copied {
				clean = append([]string(nil), values...)
				copied = true
			}
			clean[i] = s
		}
	}
	switch len(clean) {
	case 0:
		return "", clean
	case 1:
		return clean[0], clean
	}
	return strings.Join(clean, keySep), clean
}

func (c *capped[T]) with(values []string) T {
	key, clean := c.key(values)
	if m, ok := c.known.Load(key); ok {
		return m.(T)
	}
	if key == c.otherKey || c.full.Load() {
		return c.fold()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.known.Load(key); ok {
		return m.(T)
	}
	if c.n >= c.limit {
		c.full.Store(true)
		return c.foldLocked()
	}
	m := c.child(clean...)
	c.known.Store(key, m)
	c.n++
	if c.n >= c.limit {
		c.full.Store(true)
	}
	return m
}

func (c *capped[T]) fold() T {
	if p := c.other.Load(); p != nil {
		return *p
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.foldLocked()
}

func (c *capped[T]) foldLocked() T {
	if p := c.other.Load(); p != nil {
		return *p
	}
	values := make([]string, len(c.labels))
	for i := range values {
		values[i] = ValueOther
	}
	m := c.child(values...)
	c.other.Store(&m)
	return m
}

// series returns the number of admitted label sets, not counting (other).
func (c *capped[T]) series() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// CounterVec is a counter vector with the package's label caps. It is safe
// for concurrent use.
type CounterVec struct {
	c *capped[prometheus.Counter]
}

// WithLabelValues returns the counter for the given label values, in label
// order, after sanitizing them and applying the series cap. It panics when
// the number of values differs from the number of labels (a programming
// error, as with client_golang).
func (v *CounterVec) WithLabelValues(values ...string) prometheus.Counter {
	return v.c.with(values)
}

// Series returns the number of distinct label sets admitted so far, not
// counting the (other) series.
func (v *CounterVec) Series() int { return v.c.series() }

// HistogramVec is a histogram vector with the package's label caps. It is
// safe for concurrent use.
type HistogramVec struct {
	c *capped[prometheus.Observer]
}

// WithLabelValues returns the observer for the given label values; see
// [CounterVec.WithLabelValues].
func (v *HistogramVec) WithLabelValues(values ...string) prometheus.Observer {
	return v.c.with(values)
}

// Series returns the number of distinct label sets admitted so far, not
// counting the (other) series.
func (v *HistogramVec) Series() int { return v.c.series() }

// GaugeVec is a gauge vector with the package's label caps. It is safe for
// concurrent use.
type GaugeVec struct {
	c *capped[prometheus.Gauge]
}

// WithLabelValues returns the gauge for the given label values; see
// [CounterVec.WithLabelValues].
func (v *GaugeVec) WithLabelValues(values ...string) prometheus.Gauge {
	return v.c.with(values)
}

// Series returns the number of distinct label sets admitted so far, not
// counting the (other) series.
func (v *GaugeVec) Series() int { return v.c.series() }

// NewCounterVec builds a capped counter vector and registers it in r. It
// returns an error wrapping [ErrRefusedLabel] when a label name (or const
// label name) is refused, and the registry's error when registration fails
// (for example a duplicate metric or an invalid label name).
func (r *Registry) NewCounterVec(opts prometheus.CounterOpts, labels []string) (*CounterVec, error) {
	name := prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name)
	if err := checkLabels(name, labels, opts.ConstLabels); err != nil {
		return nil, err
	}
	vec := prometheus.NewCounterVec(opts, labels)
	if err := r.reg.Register(vec); err != nil {
		return nil, fmt.Errorf("metrics: register %q: %w", name, err)
	}
	return &CounterVec{c: newCapped(name, labels, r.maxSeries, vec, vec.WithLabelValues)}, nil
}

// NewHistogramVec builds a capped histogram vector and registers it in r;
// errors as for [Registry.NewCounterVec].
func (r *Registry) NewHistogramVec(opts prometheus.HistogramOpts, labels []string) (*HistogramVec, error) {
	name := prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name)
	if err := checkLabels(name, labels, opts.ConstLabels); err != nil {
		return nil, err
	}
	vec := prometheus.NewHistogramVec(opts, labels)
	if err := r.reg.Register(vec); err != nil {
		return nil, fmt.Errorf("metrics: register %q: %w", name, err)
	}
	return &HistogramVec{c: newCapped(name, labels, r.maxSeries, vec, vec.WithLabelValues)}, nil
}

// NewGaugeVec builds a capped gauge vector and registers it in r; errors as
// for [Registry.NewCounterVec].
func (r *Registry) NewGaugeVec(opts prometheus.GaugeOpts, labels []string) (*GaugeVec, error) {
	name := prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name)
	if err := checkLabels(name, labels, opts.ConstLabels); err != nil {
		return nil, err
	}
	vec := prometheus.NewGaugeVec(opts, labels)
	if err := r.reg.Register(vec); err != nil {
		return nil, fmt.Errorf("metrics: register %q: %w", name, err)
	}
	return &GaugeVec{c: newCapped(name, labels, r.maxSeries, vec, vec.WithLabelValues)}, nil
}

// MustNewCounterVec is [Registry.NewCounterVec] that panics on error. A
// refused label or a duplicate metric is a programming error found at
// construction, so panicking at start-up is acceptable.
func (r *Registry) MustNewCounterVec(opts prometheus.CounterOpts, labels []string) *CounterVec {
	v, err := r.NewCounterVec(opts, labels)
	if err != nil {
		panic(err)
	}
	return v
}

// MustNewHistogramVec is [Registry.NewHistogramVec] that panics on error.
func (r *Registry) MustNewHistogramVec(opts prometheus.HistogramOpts, labels []string) *HistogramVec {
	v, err := r.NewHistogramVec(opts, labels)
	if err != nil {
		panic(err)
	}
	return v
}

// MustNewGaugeVec is [Registry.NewGaugeVec] that panics on error.
func (r *Registry) MustNewGaugeVec(opts prometheus.GaugeOpts, labels []string) *GaugeVec {
	v, err := r.NewGaugeVec(opts, labels)
	if err != nil {
		panic(err)
	}
	return v
}
