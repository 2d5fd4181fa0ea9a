package registry

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

func TestCollector_Exposition(t *testing.T) {
	defer leakcheck.Check(t)()
	fm, fn := startFake(t, fakeplugin.Config{Controller: true}), startFake(t, fakeplugin.Config{NotReady: true})
	defer fm.Stop()
	defer fn.Stop()
	e := newEnv(t, nil)
	defer e.close()
	e.register(attachedSpec("m1", "p", plugin.Monolith, fm))
	e.register(attachedSpec("n1", "p", plugin.Node, fn))
	e.waitHealthy("m1")
	e.waitUntil("n1 not ready", func(m map[string]AllocationInfo) bool {
		return strings.Contains(m["n1"].HealthDescription, "not ready")
	})

	want := `
# HELP csiactor_plugin_allocations Registered allocations of the plugin in this role (type); a monolith counts in both.
# TYPE csiactor_plugin_allocations gauge
csiactor_plugin_allocations{plugin="p",type="controller"} 1
csiactor_plugin_allocations{plugin="p",type="node"} 2
# HELP csiactor_plugin_health_transitions_total Times an allocation of the plugin in this role (type) went from healthy to unhealthy or back.
# TYPE csiactor_plugin_health_transitions_total counter
csiactor_plugin_health_transitions_total{plugin="p",type="controller"} 1
csiactor_plugin_health_transitions_total{plugin="p",type="node"} 1
# HELP csiactor_plugin_healthy 1 when the plugin allocation is healthy in this role (type), else 0.
# TYPE csiactor_plugin_healthy gauge
csiactor_plugin_healthy{alloc="m1",plugin="p",type="controller"} 1
csiactor_plugin_healthy{alloc="m1",plugin="p",type="node"} 1
csiactor_plugin_healthy{alloc="n1",plugin="p",type="node"} 0
# HELP csiactor_plugin_singleton 1 when the allocation is the newest (the singleton) of its plugin in this role (type), else 0.
# TYPE csiactor_plugin_singleton gauge
csiactor_plugin_singleton{alloc="m1",plugin="p",type="controller"} 1
csiactor_plugin_singleton{alloc="m1",plugin="p",type="node"} 0
csiactor_plugin_singleton{alloc="n1",plugin="p",type="node"} 1
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want),
		"csiactor_plugin_allocations", "csiactor_plugin_health_transitions_total",
		"csiactor_plugin_healthy", "csiactor_plugin_singleton"); err != nil {
		t.Error(err)
	}
}
