package metrics

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// series gathers reg and returns, for the family name, a map from a
// "k=v,k=v" rendering of each series' labels to its counter or gauge value,
// or its histogram sample count.
func series(t *testing.T, reg *Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Prometheus().Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var parts []string
			for _, lp := range m.GetLabel() {
				parts = append(parts, lp.GetName()+"="+lp.GetValue())
			}
			sort.Strings(parts)
			out[strings.Join(parts, ",")] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func TestRefusedLabels(t *testing.T) {
	refused := []string{
		"tenant", "tenantId", "tenant_id", "TENANT", "TenantID",
		"identity", "identityId", "identity_id",
		"user", "userId", "user_id", "User", "end_user", "username",
	}
	for _, l := range refused {
		t.Run(l, func(t *testing.T) {
			reg := NewRegistry()
			assert.True(t, RefusedLabel(l))

			_, err := reg.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"method", l})
			require.ErrorIs(t, err, ErrRefusedLabel)
			assert.Contains(t, err.Error(), l)

			_, err = reg.NewHistogramVec(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"}, []string{l})
			require.ErrorIs(t, err, ErrRefusedLabel)

			_, err = reg.NewGaugeVec(prometheus.GaugeOpts{Name: "g", Help: "h"}, []string{l})
			require.ErrorIs(t, err, ErrRefusedLabel)

			_, err = reg.NewCounterVec(prometheus.CounterOpts{
				Name: "cc_total", Help: "h", ConstLabels: prometheus.Labels{l: "x"},
			}, []string{"method"})
			require.ErrorIs(t, err, ErrRefusedLabel)

			assert.Panics(t, func() {
				reg.MustNewCounterVec(prometheus.CounterOpts{Name: "m_total", Help: "h"}, []string{l})
			})
			assert.Panics(t, func() {
				reg.MustNewHistogramVec(prometheus.HistogramOpts{Name: "mh_seconds", Help: "h"}, []string{l})
			})
			assert.Panics(t, func() {
				reg.MustNewGaugeVec(prometheus.GaugeOpts{Name: "mg", Help: "h"}, []string{l})
			})

			// Nothing was registered by the refused constructors.
			for _, n := range []string{"c_total", "h_seconds", "g", "cc_total", "m_total", "mh_seconds", "mg"} {
				assert.Empty(t, series(t, reg, n), n)
			}
		})
	}

	for _, l := range []string{"method", "code", "region", "kind", "status"} {
		assert.False(t, RefusedLabel(l), l)
	}
	reg := NewRegistry()
	v, err := reg.NewCounterVec(prometheus.CounterOpts{Name: "ok_total", Help: "h"}, []string{"method", "code"})
	require.NoError(t, err)
	require.NotNil(t, v)
}

func TestRegistrationErrors(t *testing.T) {
	reg := NewRegistry()
	_, err := reg.NewCounterVec(prometheus.CounterOpts{Name: "dup_total", Help: "h"}, []string{"method"})
	require.NoError(t, err)
	_, err = reg.NewCounterVec(prometheus.CounterOpts{Name: "dup_total", Help: "h"}, []string{"method"})
	require.Error(t, err)
	var are prometheus.AlreadyRegisteredError
	assert.True(t, errors.As(err, &are))

	// Same name, different labels.
	_, err = reg.NewCounterVec(prometheus.CounterOpts{Name: "dup_total", Help: "h"}, []string{"code"})
	require.Error(t, err)
}

func TestRegistryCollectors(t *testing.T) {
	reg := NewRegistry()
	fams, err := reg.Prometheus().Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	assert.True(t, names["go_goroutines"], "Go collector registered")
	assert.True(t, names["process_start_time_seconds"] || names["process_cpu_seconds_total"], "process collector registered")
	assert.Equal(t, DefaultMaxSeries, reg.MaxSeries())
	assert.NotSame(t, prometheus.DefaultRegisterer, reg.Prometheus())
	assert.Equal(t, 1, NewRegistry(WithMaxSeries(0)).MaxSeries())
}

func TestSanitizeLabelValue(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want string
	}{
		{"plain", "sites.create", "sites.create"},
		{"empty", "", ValueUnknown},
		{"256 ascii", strings.Repeat("a", 256), strings.Repeat("a", 256)},
		{"257 ascii", strings.Repeat("a", 257), ValueInvalid},
		{"256 two-byte chars", strings.Repeat("é", 256), strings.Repeat("é", 256)},
		{"257 two-byte chars", strings.Repeat("é", 257), ValueInvalid},
		{"256 four-byte chars", strings.Repeat("😀", 256), strings.Repeat("😀", 256)},
		{"huge", strings.Repeat("a", 1<<20), ValueInvalid},
		{"invalid utf8", "a\xffb", ValueInvalid},
		{"truncated utf8", "\xc3", ValueInvalid},
		{"short invalid utf8 padded", strings.Repeat("a", 10) + "\xed\xa0\x80", ValueInvalid},
		{"space", " ", " "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, SanitizeLabelValue(tc.in))
		})
	}
}

func TestLabelValuesRecorded(t *testing.T) {
	reg := NewRegistry()
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "lv_total", Help: "h"}, []string{"method", "code"})
	c.WithLabelValues("", "OK").Inc()
	c.WithLabelValues(strings.Repeat("x", 300), "").Inc()
	c.WithLabelValues("a\xff", "OK").Inc()
	c.WithLabelValues("a\xfe", "OK").Inc()

	got := series(t, reg, "lv_total")
	assert.Equal(t, map[string]float64{
		"code=OK,method=(unknown)":        1,
		"code=(unknown),method=(invalid)": 1,
		"code=OK,method=(invalid)":        2,
	}, got)
	assert.Equal(t, 3, c.Series())
}

func TestWrongLabelCountPanics(t *testing.T) {
	reg := NewRegistry()
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "n_total", Help: "h"}, []string{"method", "code"})
	assert.Panics(t, func() { c.WithLabelValues("only-one") })
	assert.Panics(t, func() { c.WithLabelValues("a", "b", "c") })
}

func TestCapFolding(t *testing.T) {
	reg := NewRegistry(WithMaxSeries(3))
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "cap_total", Help: "h"}, []string{"method", "code"})
	h := reg.MustNewHistogramVec(prometheus.HistogramOpts{Name: "cap_seconds", Help: "h"}, []string{"method"})
	g := reg.MustNewGaugeVec(prometheus.GaugeOpts{Name: "cap_gauge", Help: "h"}, []string{"method"})

	for _, m := range []string{"a", "b", "c"} {
		c.WithLabelValues(m, "OK").Inc()
		h.WithLabelValues(m).Observe(0.1)
		g.WithLabelValues(m).Set(1)
	}
	// No (other) series before the cap is reached.
	assert.NotContains(t, series(t, reg, "cap_total"), "code=(other),method=(other)")

	for _, m := range []string{"d", "e", "d"} {
		c.WithLabelValues(m, "OK").Inc()
		h.WithLabelValues(m).Observe(0.1)
		g.WithLabelValues(m).Add(1)
	}
	// Known sets keep recording into their own series after the cap.
	c.WithLabelValues("a", "OK").Inc()
	h.WithLabelValues("a").Observe(0.2)
	g.WithLabelValues("a").Add(1)
	// Explicit (other) values go to the fold series and take no slot.
	c.WithLabelValues(ValueOther, ValueOther).Inc()

	assert.Equal(t, map[string]float64{
		"code=OK,method=a":            2,
		"code=OK,method=b":            1,
		"code=OK,method=c":            1,
		"code=(other),method=(other)": 4,
	}, series(t, reg, "cap_total"))
	assert.Equal(t, map[string]float64{
		"method=a":       2,
		"method=b":       1,
		"method=c":       1,
		"method=(other)": 3,
	}, series(t, reg, "cap_seconds"))
	assert.Equal(t, map[string]float64{
		"method=a":       2,
		"method=b":       1,
		"method=c":       1,
		"method=(other)": 3,
	}, series(t, reg, "cap_gauge"))

	assert.Equal(t, 3, c.Series())
	assert.Equal(t, 3, h.Series())
	assert.Equal(t, 3, g.Series())
}

func TestCapSanitizedValuesShareSlot(t *testing.T) {
	reg := NewRegistry(WithMaxSeries(2))
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "s_total", Help: "h"}, []string{"method"})
	// Many distinct invalid values collapse into one (invalid) series and
	// use one slot only.
	for i := range 50 {
		c.WithLabelValues(fmt.Sprintf("%s%d", strings.Repeat("x", 300), i)).Inc()
		c.WithLabelValues(fmt.Sprintf("bad\xff%d", i)).Inc()
	}
	c.WithLabelValues("ok").Inc()
	c.WithLabelValues("late").Inc()
	assert.Equal(t, map[string]float64{
		"method=(invalid)": 100,
		"method=ok":        1,
		"method=(other)":   1,
	}, series(t, reg, "s_total"))
}

func TestDefaultCap(t *testing.T) {
	reg := NewRegistry()
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "d_total", Help: "h"}, []string{"method"})
	for i := range DefaultMaxSeries + 100 {
		c.WithLabelValues(fmt.Sprintf("m%d", i)).Inc()
	}
	got := series(t, reg, "d_total")
	assert.Len(t, got, DefaultMaxSeries+1)
	assert.Equal(t, float64(100), got["method=(other)"])
	assert.Equal(t, float64(1), got["method=m0"])
	assert.Equal(t, float64(1), got[fmt.Sprintf("method=m%d", DefaultMaxSeries-1)])
	assert.NotContains(t, got, fmt.Sprintf("method=m%d", DefaultMaxSeries))
	assert.Equal(t, DefaultMaxSeries, c.Series())
}

func TestConcurrent(t *testing.T) {
	const (
		workers = 64
		iters   = 1000
		limit   = 20
		labels  = 50
	)
	reg := NewRegistry(WithMaxSeries(limit))
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "cc_total", Help: "h"}, []string{"method", "code"})
	h := reg.MustNewHistogramVec(prometheus.HistogramOpts{Name: "cc_seconds", Help: "h"}, []string{"method"})
	rpc, err := NewRPC(reg)
	require.NoError(t, err)

	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range iters {
				m := fmt.Sprintf("m%d", (w*7+i)%labels)
				c.WithLabelValues(m, "OK").Inc()
				h.WithLabelValues(m).Observe(0.01)
				rpc.Observe(m, "ACCESS_DENIED", 403, 0)
			}
		}()
	}
	// Gather concurrently with writers.
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		for range 20 {
			_, _ = reg.Prometheus().Gather()
		}
	}()
	close(start)
	wg.Wait()

	total := 0.0
	got := series(t, reg, "cc_total")
	for _, v := range got {
		total += v
	}
	assert.Equal(t, float64(workers*iters), total)
	assert.Len(t, got, limit+1)
	assert.Equal(t, limit, c.Series())
	assert.Equal(t, limit, h.Series())

	totalH := 0.0
	for _, v := range series(t, reg, "cc_seconds") {
		totalH += v
	}
	assert.Equal(t, float64(workers*iters), totalH)

	denied := 0.0
	for _, v := range series(t, reg, RPCDeniedTotal) {
		denied += v
	}
	assert.Equal(t, float64(workers*iters), denied)
}

func BenchmarkWithLabelValuesKnown(b *testing.B) {
	reg := NewRegistry()
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "b_total", Help: "h"}, []string{"method", "code"})
	c.WithLabelValues("sites.create", "OK").Inc()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.WithLabelValues("sites.create", "OK").Inc()
		}
	})
}

func BenchmarkWithLabelValuesFolded(b *testing.B) {
	reg := NewRegistry(WithMaxSeries(1))
	c := reg.MustNewCounterVec(prometheus.CounterOpts{Name: "b_total", Help: "h"}, []string{"method"})
	c.WithLabelValues("first").Inc()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.WithLabelValues("new").Inc()
		}
	})
}
