package cluster

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of csiactor_cluster_lease_renewals_total {result}.
const (
	renewOK      = "ok"
	renewError   = "error"
	renewExpired = "expired"
)

type metrics struct {
	hosts    *prometheus.GaugeVec
	requests *prometheus.HistogramVec
	renewals *prometheus.CounterVec
	leader   *prometheus.GaugeVec
	served   *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		hosts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "csiactor_cluster_hosts",
			Help: "Hosts of the cluster by status (up: its lease is alive; down: it expired), as this agent last saw them.",
		}, []string{"status"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "csiactor_cluster_etcd_request_seconds",
			Help:    "Duration of the agent's etcd requests by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms … 16 s
		}, []string{"op"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csiactor_cluster_lease_renewals_total",
			Help: "Renewals of this host's etcd lease by result (ok, error, expired: a new lease was granted).",
		}, []string{"result"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "csiactor_cluster_controller_leader",
			Help: "1 while this host leads the controller of the plugin in the cluster (runs the controller steps of hosts without one), else 0.",
		}, []string{"plugin"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csiactor_cluster_controller_requests_total",
			Help: "Controller requests of other hosts this host ran as its plugin's controller leader, by op (publish, unpublish) and result (ok, error: the plugin's answer was an error).",
		}, []string{"op", "result"}),
	}
	for _, s := range []string{"up", "down"} {
		m.hosts.WithLabelValues(s)
	}
	for _, r := range []string{renewOK, renewError, renewExpired} {
		m.renewals.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.hosts, m.requests, m.renewals, m.leader, m.served}
}

// observe records an etcd request of op that started at start.
func (m *metrics) observe(op string, start time.Time) {
	m.requests.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
