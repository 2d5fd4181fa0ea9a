package registry

import (
	"fmt"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/csi"
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

// TestCollector_HungRestarts: csiactor_plugin_hung_restarts_total has a
// zero series for a registered plugin (so that increase() sees the first
// finding) and counts the allocation found answering its fingerprint while
// its node RPCs time out in a row, with the event plugin_hung.
func TestCollector_HungRestarts(t *testing.T) {
	defer leakcheck.Check(t)()
	fn := startFake(t, fakeplugin.Config{})
	defer fn.Stop()
	fn.SetFault("NodePublishVolume", fakeplugin.Fault{Hang: true})
	e := newEnv(t, func(c *Config) {
		c.Plugin.RPCTimeout = 100 * time.Millisecond
		c.Plugin.HungRPCRestart = 3
	})
	defer e.close()
	e.register(attachedSpec("n1", "p", plugin.Node, fn))
	e.waitHealthy("n1")
	expo := func(n int) string {
		return fmt.Sprintf(`
# HELP csiactor_plugin_hung_restarts_total Times an allocation of the plugin answered its fingerprint while its node RPCs kept timing out (plugins.hung_rpc_restart in a row): an exec-managed one was restarted, an attached one reported unhealthy.
# TYPE csiactor_plugin_hung_restarts_total counter
csiactor_plugin_hung_restarts_total{plugin="p"} %d
`, n)
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(expo(0)), "csiactor_plugin_hung_restarts_total"); err != nil {
		t.Error(err)
	}

	sub, err := e.h.Subscribe(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel()
	tg, err := e.h.Client(ctx(t), "p", plugin.Node)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		err := tg.Client.NodePublishVolume(ctx(t), &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/unused/v"})
		if csi.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("hung NodePublishVolume = %v, want DeadlineExceeded", err)
		}
	}
	guard := time.NewTimer(60 * time.Second)
	defer guard.Stop()
	for found := false; !found; {
		select {
		case ev := <-sub.C:
			if ev.Type != EventPluginHung {
				continue
			}
			found = true
			if ev.Plugin != "p" || ev.Alloc != "n1" || ev.Healthy ||
				ev.Message != "node RPCs hang: 3 in a row ended in DeadlineExceeded while the plugin answers Probe" {
				t.Errorf("event %+v", ev)
			}
		case <-guard.C:
			t.Fatal("no plugin_hung event")
		}
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(expo(1)), "csiactor_plugin_hung_restarts_total"); err != nil {
		t.Error(err)
	}
}
