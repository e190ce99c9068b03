// Package metrics provides Prometheus metrics with the specification's label
// caps (interface specification, Limits: "Metric series" and "Metric label
// values"; Authentication rule 12 for GET /metrics).
//
// Every metric is registered in the package's own [Registry] (never the
// global Prometheus registry) through capped vectors ([CounterVec],
// [HistogramVec], [GaugeVec]) that enforce:
//
//   - Refused labels: a label whose name contains tenant, identity or user
//     (case-insensitive, for example tenantId, tenant_id, identityId, userId)
//     is refused when the vector is built, so per-tenant or per-caller series
//     cannot be created.
//   - Label values: a value longer than 256 chars or not valid UTF-8 reads
//     (invalid); an empty value reads (unknown).
//   - Series cap: at most 2000 distinct label sets per metric by default
//     ([WithMaxSeries] changes it); label sets first seen after the cap is
//     reached fold into one series whose every label reads (other).
//
// [RPC] records the per-method RPC metrics, and [Handler] serves GET /metrics
// behind a bearer token compared in constant time.
package metrics
