package registry

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/actors/plugin"
)

// collector exposes the registry's state from its latest snapshot; it
// keeps no gauges of its own in sync.
type collector struct {
	sh          *shared
	healthy     *prometheus.Desc
	singleton   *prometheus.Desc
	allocations *prometheus.Desc
	transitions *prometheus.Desc
	hung        *prometheus.Desc
}

func newCollector(sh *shared) *collector {
	labels := []string{"plugin", "type", "alloc"}
	return &collector{
		sh: sh,
		healthy: prometheus.NewDesc("csiactor_plugin_healthy",
			"1 when the plugin allocation is healthy in this role (type), else 0.", labels, nil),
		singleton: prometheus.NewDesc("csiactor_plugin_singleton",
			"1 when the allocation is the newest (the singleton) of its plugin in this role (type), else 0.", labels, nil),
		allocations: prometheus.NewDesc("csiactor_plugin_allocations",
			"Registered allocations of the plugin in this role (type); a monolith counts in both.", []string{"plugin", "type"}, nil),
		transitions: prometheus.NewDesc("csiactor_plugin_health_transitions_total",
			"Times an allocation of the plugin in this role (type) went from healthy to unhealthy or back.", []string{"plugin", "type"}, nil),
		hung: prometheus.NewDesc("csiactor_plugin_hung_restarts_total",
			"Times an allocation of the plugin answered its fingerprint while its node RPCs kept timing out (plugins.hung_rpc_restart in a row): an exec-managed one was restarted, an attached one reported unhealthy.", []string{"plugin"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.singleton
	ch <- c.allocations
	ch <- c.transitions
	ch <- c.hung
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.sh.snap.Load()
	if s == nil {
		return
	}
	counts := map[key]int{}
	for _, a := range s.allocs {
		for _, role := range a.Type.Roles() {
			counts[key{a.Plugin, role}]++
			ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, b2f(a.Healthy), a.Plugin, string(role), a.ID)
			ch <- prometheus.MustNewConstMetric(c.singleton, prometheus.GaugeValue, b2f(hasRole(a.SingletonFor, role)), a.Plugin, string(role), a.ID)
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.allocations, prometheus.GaugeValue, float64(n), k.plugin, string(k.role))
	}
	for k, n := range s.transitions {
		ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(n), k.plugin, string(k.role))
	}
	// Every registered plugin has its series, zero until the first
	// finding, so that increase() sees the first one too.
	hung := maps.Clone(s.hung)
	if hung == nil {
		hung = map[string]uint64{}
	}
	for _, a := range s.allocs {
		hung[a.Plugin] += 0
	}
	for p, n := range hung {
		ch <- prometheus.MustNewConstMetric(c.hung, prometheus.CounterValue, float64(n), p)
	}
}

func hasRole(rs []plugin.Role, r plugin.Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
