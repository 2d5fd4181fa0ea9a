package actorkit

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// RestartCounter counts actor restarts by kind, as
// csiactor_actor_restarts_total {kind}. It is a [prometheus.Collector]:
// register it once on the agent's registry and share it between every
// [Supervisor]. A nil *RestartCounter counts nothing.
type RestartCounter struct {
	vec *prometheus.CounterVec
}

var _ prometheus.Collector = (*RestartCounter)(nil)

// NewRestartCounter returns a counter that is not registered anywhere yet.
func NewRestartCounter() *RestartCounter {
	return &RestartCounter{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "csiactor_actor_restarts_total",
		Help: "Restarts of failed actors by their supervisor, by kind of actor.",
	}, []string{"kind"})}
}

// Inc adds one restart of kind.
func (c *RestartCounter) Inc(kind string) {
	if c == nil {
		return
	}
	c.vec.WithLabelValues(kind).Inc()
}

// Init makes each kind show at 0 before its first restart, so that a
// Prometheus user sees the series (and rate() works) from the start.
func (c *RestartCounter) Init(kinds ...string) {
	if c == nil {
		return
	}
	for _, k := range kinds {
		c.vec.WithLabelValues(k)
	}
}

// Value returns the count for kind (for tests and status output).
func (c *RestartCounter) Value(kind string) float64 {
	if c == nil {
		return 0
	}
	var m dto.Metric
	if err := c.vec.WithLabelValues(kind).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// Describe implements prometheus.Collector.
func (c *RestartCounter) Describe(ch chan<- *prometheus.Desc) { c.vec.Describe(ch) }

// Collect implements prometheus.Collector.
func (c *RestartCounter) Collect(ch chan<- prometheus.Metric) { c.vec.Collect(ch) }
