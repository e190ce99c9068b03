package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto"
	"computeplane/internal/configerr"
)

// startReceiver runs the OpenTelemetry Collector's OTLP receiver
// (OTLP/HTTP on a loopback port) into a sink and returns its URL.
func startReceiver(t *testing.T) (string, *consumertest.MetricsSink) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	f := otlpreceiver.NewFactory()
	cfg := f.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
	cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = addr
	sink := new(consumertest.MetricsSink)
	rcv, err := f.CreateMetrics(t.Context(), receivertest.NewNopSettings(f.Type()), cfg, sink)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(t.Context(), componenttest.NewNopHost()))
	t.Cleanup(func() { assert.NoError(t, rcv.Shutdown(context.Background())) })
	return "http://" + addr, sink
}

// series finds the data points of a metric in one export, by their
// attributes.
func points(md pmetric.Metrics, name string) []pmetric.NumberDataPoint {
	var out []pmetric.NumberDataPoint
	rms := md.ResourceMetrics()
	for i := range rms.Len() {
		sms := rms.At(i).ScopeMetrics()
		for j := range sms.Len() {
			ms := sms.At(j).Metrics()
			for k := range ms.Len() {
				m := ms.At(k)
				if m.Name() != name {
					continue
				}
				var dps pmetric.NumberDataPointSlice
				switch m.Type() {
				case pmetric.MetricTypeSum:
					dps = m.Sum().DataPoints()
				case pmetric.MetricTypeGauge:
					dps = m.Gauge().DataPoints()
				}
				for p := range dps.Len() {
					out = append(out, dps.At(p))
				}
			}
		}
	}
	return out
}

func attr(p pmetric.NumberDataPoint, k string) string {
	v, ok := p.Attributes().Get(k)
	if !ok {
		return ""
	}
	return v.AsString()
}

func value(p pmetric.NumberDataPoint) float64 {
	if p.ValueType() == pmetric.NumberDataPointValueTypeDouble {
		return p.DoubleValue()
	}
	return float64(p.IntValue())
}

// Host and per-VM metrics reach a real OTLP receiver at the configured
// interval, with the node and the operator's attributes on the resource.
// The VM is the recording runtime's (its usage played by usage.json).
func TestMetricsArriveAtTheCollectorAtTheInterval(t *testing.T) {
	endpoint, sink := startReceiver(t)
	rec := &vmruntime.Recording{Dir: t.TempDir()}
	_, err := rec.Apply(t.Context(), 1, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "inst_a", State: "running"}, {ID: "inst_b", State: "stopped"}}})
	require.NoError(t, err)
	usage, _ := json.Marshal(map[string]vmruntime.Usage{"inst_a": {CPUSeconds: 1.5, MemoryBytes: 64 << 20, DiskReadBytes: 4096, DiskWriteBytes: 8192, NetRxBytes: 100, NetTxBytes: 200}})
	require.NoError(t, os.WriteFile(filepath.Join(rec.Dir, vmruntime.RecordingUsage), usage, 0o600))

	cfg, err := Config{Endpoint: endpoint, Interval: 5 * time.Second, Attributes: []string{"site=lab-1", "deployment.environment=test"}}.Check()
	require.NoError(t, err)
	assert.Equal(t, endpoint+"/v1/metrics", cfg.Endpoint)
	exp, err := Start(t.Context(), cfg, "node_1", "pool_1", "v1.2.3", rec, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer func() { _ = exp.Shutdown(context.Background()) }()

	// Three exports: 10 s apart from the first to the third.
	require.Eventually(t, func() bool { return sink.DataPointCount() > 0 && len(sink.AllMetrics()) >= 3 }, 40*time.Second, 100*time.Millisecond)
	all := sink.AllMetrics()
	var stamps []time.Time
	for _, md := range all[:3] {
		ps := points(md, MetricVMCPU)
		require.Len(t, ps, 1, "one VM series: the stopped instance has none")
		stamps = append(stamps, ps[0].Timestamp().AsTime())
	}
	for i := 1; i < len(stamps); i++ {
		gap := stamps[i].Sub(stamps[i-1])
		assert.InDelta(t, 5.0, gap.Seconds(), 1.5, "export %d came %s after the one before", i, gap)
	}

	md := all[len(all)-1]
	res := md.ResourceMetrics().At(0).Resource().Attributes()
	for k, want := range map[string]string{"service.name": "compute-agent", "service.version": "v1.2.3", AttrNode: "node_1", AttrPool: "pool_1", "site": "lab-1", "deployment.environment": "test"} {
		v, ok := res.Get(k)
		if assert.True(t, ok, k) {
			assert.Equal(t, want, v.AsString(), k)
		}
	}
	vm := func(name, direction string) float64 {
		for _, p := range points(md, name) {
			if attr(p, AttrInstance) == "inst_a" && attr(p, "direction") == direction {
				return value(p)
			}
		}
		t.Errorf("no %s series for inst_a (direction %q)", name, direction)
		return -1
	}
	assert.Equal(t, 1.5, vm(MetricVMCPU, ""))
	assert.Equal(t, float64(64<<20), vm(MetricVMMemory, ""))
	assert.Equal(t, 4096.0, vm(MetricVMDisk, "read"))
	assert.Equal(t, 8192.0, vm(MetricVMDisk, "write"))
	assert.Equal(t, 100.0, vm(MetricVMNetwork, "receive"))
	assert.Equal(t, 200.0, vm(MetricVMNetwork, "transmit"))

	// The host's own: CPU by state, memory used, a disk and an interface
	// at least where the machine has them.
	var states []string
	for _, p := range points(md, MetricHostCPU) {
		states = append(states, attr(p, "state"))
	}
	assert.Contains(t, states, "idle")
	assert.Contains(t, states, "user")
	var used float64
	for _, p := range points(md, MetricHostMemory) {
		if attr(p, "state") == "used" {
			used = value(p)
		}
	}
	assert.Positive(t, used)
	assert.NotEmpty(t, points(md, MetricHostDisk), "block devices of this host")
	for _, p := range points(md, MetricHostCPU) {
		assert.GreaterOrEqual(t, value(p), 0.0)
	}
}

// Every bound of the specification refuses the settings, naming the flag.
func TestEveryBadSettingIsRefused(t *testing.T) {
	long := strings.Repeat("v", 257)
	many := make([]string, 33)
	for i := range many {
		many[i] = "k" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "=v"
	}
	for _, c := range []struct {
		name string
		cfg  Config
		flag string
		msg  string
	}{
		{"plain http to a remote host", Config{Endpoint: "http://collector.example.com:4318"}, FlagEndpoint, "http only to localhost"},
		{"credentials", Config{Endpoint: "https://user:pw@collector.example.com"}, FlagEndpoint, "credentials"},
		{"a query", Config{Endpoint: "https://collector.example.com/v1/metrics?token=x"}, FlagEndpoint, "query"},
		{"another scheme", Config{Endpoint: "grpc://127.0.0.1:4317"}, FlagEndpoint, "must be https"},
		{"not a URL", Config{Endpoint: "collector:4318"}, FlagEndpoint, "absolute URL"},
		{"interval too short", Config{Endpoint: "https://c.example", Interval: 4 * time.Second}, FlagInterval, "outside 5s to 3600s"},
		{"interval too long", Config{Endpoint: "https://c.example", Interval: 3601 * time.Second}, FlagInterval, "outside 5s to 3600s"},
		{"interval in fractions", Config{Endpoint: "https://c.example", Interval: 5500 * time.Millisecond}, FlagInterval, "whole number"},
		{"33 attributes", Config{Endpoint: "https://c.example", Attributes: many}, FlagAttribute, "at most 32"},
		{"a value of 257 chars", Config{Endpoint: "https://c.example", Attributes: []string{"k=" + long}}, FlagAttribute, "at most 256"},
		{"a value on two lines", Config{Endpoint: "https://c.example", Attributes: []string{"k=a\nb"}}, FlagAttribute, "single line"},
		{"no key=value", Config{Endpoint: "https://c.example", Attributes: []string{"novalue"}}, FlagAttribute, "not key=value"},
		{"a key twice", Config{Endpoint: "https://c.example", Attributes: []string{"k=1", "k=2"}}, FlagAttribute, "twice"},
		{"an empty key", Config{Endpoint: "https://c.example", Attributes: []string{"=v"}}, FlagAttribute, "key"},
		{"attributes without an endpoint", Config{Attributes: []string{"k=v"}}, FlagAttribute, "need --telemetry-endpoint"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.cfg.Check()
			var ce *configerr.Error
			require.True(t, errors.As(err, &ce), "refused: %v", err)
			assert.Equal(t, c.flag, ce.Option)
			assert.Contains(t, err.Error(), "INVALID_CONFIG")
			assert.Contains(t, err.Error(), c.msg)
		})
	}

	// The bounds themselves pass.
	ok32 := many[:32]
	for _, cfg := range []Config{
		{},
		{Endpoint: "https://collector.example.com:4318", Interval: 5 * time.Second},
		{Endpoint: "http://localhost:4318/v1/metrics", Interval: 3600 * time.Second},
		{Endpoint: "http://127.0.0.1:4318", Attributes: ok32},
		{Endpoint: "http://[::1]:4318", Attributes: []string{"k=" + long[:256]}},
	} {
		got, err := cfg.Check()
		require.NoError(t, err, "%+v", cfg)
		if cfg.Interval == 0 {
			assert.Equal(t, DefaultInterval, got.Interval)
		}
	}
}
