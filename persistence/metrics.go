package persistence

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's collectors. They are always recorded; Open
// registers them only when Config.Registerer is set, and Close unregisters
// them so that a store can be reopened on the same registry.
type metrics struct {
	commitSeconds prometheus.Histogram
	batchSize     prometheus.Histogram
	writes        *prometheus.CounterVec
	queued        prometheus.GaugeFunc

	writesOK, writesError, writesCanceled, writesDeferred prometheus.Counter

	checkpointSeconds               prometheus.Histogram
	checkpoints                     *prometheus.CounterVec
	checkpointsOK, checkpointsError prometheus.Counter

	registered []prometheus.Collector
	reg        prometheus.Registerer
}

func newMetrics(queueLen func() float64) *metrics {
	m := &metrics{
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "csiactor_store_commit_seconds",
			Help: "Time to durably commit one batch of store writes: one journal append (one write, one fdatasync) for volume writes, one bbolt transaction (one fsync) for others.",
			// 50 µs to ~26 s.
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 20),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "csiactor_store_commit_batch_size",
			Help:    "Writes committed together in one store transaction or journal append.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12), // 1 … 2048
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csiactor_store_writes_total",
			Help: "Store writes by result: ok (durable when it returned), deferred (a volume claim step kept in memory and made durable by the next checkpoint, see PutVolumeDeferred), error (rejected by the store or the disk) or canceled (the caller's context ended before the write was applied).",
		}, []string{"result"}),
		queued: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "csiactor_store_queued_writes",
			Help: "Writes queued behind a running commit or journal append.",
		}, queueLen),
		checkpointSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "csiactor_store_checkpoint_seconds",
			Help: "Time to move one journal generation's volume writes into the store file (one bbolt transaction, one fsync).",
			// 100 µs to ~52 s.
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20),
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csiactor_store_checkpoints_total",
			Help: "Checkpoints of the store journal into the store file by result: ok, or error (the writes stay in the journal and the checkpoint is retried).",
		}, []string{"result"}),
	}
	m.checkpointsOK = m.checkpoints.WithLabelValues("ok")
	m.checkpointsError = m.checkpoints.WithLabelValues("error")
	m.writesOK = m.writes.WithLabelValues("ok")
	m.writesError = m.writes.WithLabelValues("error")
	m.writesCanceled = m.writes.WithLabelValues("canceled")
	m.writesDeferred = m.writes.WithLabelValues("deferred")
	return m
}

// register registers every collector on reg, undoing on failure.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	m.reg = reg
	for _, c := range []prometheus.Collector{m.commitSeconds, m.batchSize, m.writes, m.queued, m.checkpointSeconds, m.checkpoints} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				return fmt.Errorf("register store metrics: another store is registered on the same registry: %w", err)
			}
			return fmt.Errorf("register store metrics: %w", err)
		}
		m.registered = append(m.registered, c)
	}
	return nil
}

func (m *metrics) unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}
