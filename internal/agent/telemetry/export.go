package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"computeplane/internal/agent/vmruntime"
)

// ExportTimeout bounds one export to the collector.
const ExportTimeout = 10 * time.Second

// Metric names: the host's follow OpenTelemetry's system semantic
// conventions; the per-VM ones carry compute.instance.id.
const (
	MetricHostCPU      = "system.cpu.time"
	MetricHostMemory   = "system.memory.usage"
	MetricHostDisk     = "system.disk.io"
	MetricHostNetwork  = "system.network.io"
	MetricVMCPU        = "compute.vm.cpu.time"
	MetricVMMemory     = "compute.vm.memory.usage"
	MetricVMDisk       = "compute.vm.disk.io"
	MetricVMNetwork    = "compute.vm.network.io"
	AttrInstance       = "compute.instance.id"
	AttrNode           = "compute.node.id"
	AttrPool           = "compute.pool.id"
	attrDirection      = "direction"
	attrDevice         = "device"
	attrState          = "state"
	instrumentationLib = "computeplane/compute-agent"
)

// Exporter sends the metrics every Interval until Shutdown.
type Exporter struct {
	provider *sdkmetric.MeterProvider
}

// Start begins exporting. cfg must have passed Check. node and pool name
// the node in the resource (besides service.name compute-agent and the
// configured attributes); vms reports the VMs (nil: host metrics only).
func Start(ctx context.Context, cfg Config, node, pool, version string, vms vmruntime.UsageReporter, log *slog.Logger) (*Exporter, error) {
	if !cfg.Enabled() {
		return nil, errors.New("telemetry: no endpoint")
	}
	exp, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(cfg.Endpoint), otlpmetrichttp.WithTimeout(ExportTimeout),
		// A collector that is down is retried at the next interval, not
		// by a backlog of retries.
		otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{Enabled: false}))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", "compute-agent")}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	if node != "" {
		attrs = append(attrs, attribute.String(AttrNode, node), attribute.String("host.id", node))
	}
	if pool != "" {
		attrs = append(attrs, attribute.String(AttrPool, pool))
	}
	// The operator's attributes come last: they may override the
	// defaults (service.name of a fleet, say).
	for k, v := range cfg.Resource {
		attrs = append(attrs, attribute.String(k, v))
	}
	res := resource.NewWithAttributes("", attrs...)
	reader := sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(cfg.Interval), sdkmetric.WithTimeout(ExportTimeout))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader))
	if err := register(mp.Meter(instrumentationLib), vms); err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, err
	}
	log.Info("node telemetry", "endpoint", cfg.Endpoint, "interval", cfg.Interval.String(), "attributes", len(cfg.Resource))
	return &Exporter{provider: mp}, nil
}

// Shutdown sends what is left and stops, within ctx.
func (e *Exporter) Shutdown(ctx context.Context) error { return e.provider.Shutdown(ctx) }

func register(m metric.Meter, vms vmruntime.UsageReporter) error {
	hostCPUTime, err1 := m.Float64ObservableCounter(MetricHostCPU, metric.WithUnit("s"), metric.WithDescription("CPU time of the host, all CPUs, by state"))
	hostMem, err2 := m.Int64ObservableUpDownCounter(MetricHostMemory, metric.WithUnit("By"), metric.WithDescription("Host memory by state (used, available)"))
	hostDisk, err3 := m.Int64ObservableCounter(MetricHostDisk, metric.WithUnit("By"), metric.WithDescription("Bytes read and written per block device"))
	hostNet, err4 := m.Int64ObservableCounter(MetricHostNetwork, metric.WithUnit("By"), metric.WithDescription("Bytes received and transmitted per interface"))
	vmCPU, err5 := m.Float64ObservableCounter(MetricVMCPU, metric.WithUnit("s"), metric.WithDescription("CPU time of a VM's process"))
	vmMem, err6 := m.Int64ObservableUpDownCounter(MetricVMMemory, metric.WithUnit("By"), metric.WithDescription("Resident memory of a VM's process"))
	vmDisk, err7 := m.Int64ObservableCounter(MetricVMDisk, metric.WithUnit("By"), metric.WithDescription("Bytes a VM read and wrote to storage"))
	vmNet, err8 := m.Int64ObservableCounter(MetricVMNetwork, metric.WithUnit("By"), metric.WithDescription("Bytes a VM received and transmitted"))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8); err != nil {
		return err
	}
	dir := func(d string) attribute.KeyValue { return attribute.String(attrDirection, d) }
	_, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for state, s := range hostCPU() {
			o.ObserveFloat64(hostCPUTime, s, metric.WithAttributes(attribute.String(attrState, state)))
		}
		if used, avail, ok := hostMemory(); ok {
			o.ObserveInt64(hostMem, used, metric.WithAttributes(attribute.String(attrState, "used")))
			o.ObserveInt64(hostMem, avail, metric.WithAttributes(attribute.String(attrState, "available")))
		}
		for _, d := range hostDisks() {
			dev := attribute.String(attrDevice, d.device)
			o.ObserveInt64(hostDisk, d.read, metric.WithAttributes(dev, dir("read")))
			o.ObserveInt64(hostDisk, d.wrt, metric.WithAttributes(dev, dir("write")))
		}
		for _, n := range hostInterfaces() {
			dev := attribute.String(attrDevice, n.device)
			o.ObserveInt64(hostNet, n.read, metric.WithAttributes(dev, dir("receive")))
			o.ObserveInt64(hostNet, n.wrt, metric.WithAttributes(dev, dir("transmit")))
		}
		if vms == nil {
			return nil
		}
		for _, u := range vms.Usage(ctx) {
			id := attribute.String(AttrInstance, u.ID)
			o.ObserveFloat64(vmCPU, u.CPUSeconds, metric.WithAttributes(id))
			o.ObserveInt64(vmMem, u.MemoryBytes, metric.WithAttributes(id))
			o.ObserveInt64(vmDisk, u.DiskReadBytes, metric.WithAttributes(id, dir("read")))
			o.ObserveInt64(vmDisk, u.DiskWriteBytes, metric.WithAttributes(id, dir("write")))
			o.ObserveInt64(vmNet, u.NetRxBytes, metric.WithAttributes(id, dir("receive")))
			o.ObserveInt64(vmNet, u.NetTxBytes, metric.WithAttributes(id, dir("transmit")))
		}
		return nil
	}, hostCPUTime, hostMem, hostDisk, hostNet, vmCPU, vmMem, vmDisk, vmNet)
	return err
}
