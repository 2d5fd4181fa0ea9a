package csi

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// OperationBuckets are the buckets of csiactor_csi_operations_seconds, from
// 1 ms (a Probe on a local socket) to 600 s (a slow attach on real storage).
var OperationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600,
}

// Metrics holds the collectors of the csi package. One Metrics is shared by
// every Client of a process (pass it with WithMetrics and
// WithRetryMetrics); it is safe for concurrent use.
type Metrics struct {
	operations *prometheus.HistogramVec
	retries    *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg:
//
//   - csiactor_csi_operations_seconds{plugin, method, grpc_status_code}: a
//     histogram of every RPC's duration, by its result code ("OK",
//     "DeadlineExceeded", ...);
//   - csiactor_csi_retries_total{plugin, method}: retries made by RetryCall.
//
// When reg already holds identical collectors (a second NewMetrics on the
// same registry), those are reused. A nil reg registers nothing.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	ops := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "csiactor_csi_operations_seconds",
		Help:    "Duration of CSI RPCs sent to plugins, by plugin, method and gRPC status code.",
		Buckets: OperationBuckets,
	}, []string{"plugin", "method", "grpc_status_code"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "csiactor_csi_retries_total",
		Help: "Retries of CSI RPCs after a transient or uncertain failure, by plugin and method.",
	}, []string{"plugin", "method"})
	if reg != nil {
		var err error
		if ops, err = register(reg, ops); err != nil {
			return nil, err
		}
		if retries, err = register(reg, retries); err != nil {
			return nil, err
		}
	}
	return &Metrics{operations: ops, retries: retries}, nil
}

// register registers c, or returns the identical collector already there.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register csi metrics: %w", err)
}

// Retried counts one retry of method on plugin in
// csiactor_csi_retries_total, for callers that retry with their own loop
// rather than RetryCall (the volume and claim actors). A nil Metrics counts
// nothing.
func (m *Metrics) Retried(plugin, method string) {
	if m == nil {
		return
	}
	m.retries.WithLabelValues(plugin, method).Inc()
}

// InitRetries makes csiactor_csi_retries_total show plugin's methods at 0
// before their first retry, so that the series exist (and rate() works)
// from the start. A nil Metrics does nothing.
func (m *Metrics) InitRetries(plugin string, methods ...string) {
	if m == nil {
		return
	}
	for _, method := range methods {
		m.retries.WithLabelValues(plugin, method)
	}
}
