package runtime_test

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_Metrics_Contract gathers the runtime's registry after a claim
// and release, with one failed NodeStageVolume and one failed
// NodeUnstageVolume on the way, and checks every metric README lists: its
// type, its labels and, where the value is certain, the exact exposition.
func TestRuntime_Metrics_Contract(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	p.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	p.SetFault("NodeUnstageVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Release(ctx, "vol-1", "alloc-1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol-1", "alloc-1")

	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	families := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		families[mf.GetName()] = mf
	}
	for _, want := range []struct {
		name   string
		typ    dto.MetricType
		labels []string
	}{
		{"csiactor_plugin_healthy", dto.MetricType_GAUGE, []string{"alloc", "plugin", "type"}},
		{"csiactor_plugin_singleton", dto.MetricType_GAUGE, []string{"alloc", "plugin", "type"}},
		{"csiactor_plugin_allocations", dto.MetricType_GAUGE, []string{"plugin", "type"}},
		{"csiactor_plugin_health_transitions_total", dto.MetricType_COUNTER, []string{"plugin", "type"}},
		{"csiactor_csi_operations_seconds", dto.MetricType_HISTOGRAM, []string{"grpc_status_code", "method", "plugin"}},
		{"csiactor_csi_retries_total", dto.MetricType_COUNTER, []string{"method", "plugin"}},
		{"csiactor_volume_claims", dto.MetricType_GAUGE, []string{"mode", "state"}},
		{"csiactor_volume_operations_in_flight", dto.MetricType_GAUGE, nil},
		{"csiactor_actor_restarts_total", dto.MetricType_COUNTER, []string{"kind"}},
		{"csiactor_store_commit_seconds", dto.MetricType_HISTOGRAM, nil},
	} {
		mf := families[want.name]
		if mf == nil {
			t.Errorf("%s: missing", want.name)
			continue
		}
		if mf.GetType() != want.typ {
			t.Errorf("%s: type %s, want %s", want.name, mf.GetType(), want.typ)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help text", want.name)
		}
		for _, m := range mf.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			sort.Strings(names)
			if !slices.Equal(names, want.labels) {
				t.Errorf("%s: labels %v, want %v", want.name, names, want.labels)
				break
			}
		}
	}

	// Exact values where they are certain after this run.
	const exposition = `
# HELP csiactor_actor_restarts_total Restarts of failed actors by their supervisor, by kind of actor.
# TYPE csiactor_actor_restarts_total counter
csiactor_actor_restarts_total{kind="claim"} 0
csiactor_actor_restarts_total{kind="plugin"} 0
csiactor_actor_restarts_total{kind="registry"} 0
csiactor_actor_restarts_total{kind="snapshot"} 0
csiactor_actor_restarts_total{kind="volume"} 0
# HELP csiactor_csi_retries_total Retries of CSI RPCs after a transient or uncertain failure, by plugin and method.
# TYPE csiactor_csi_retries_total counter
csiactor_csi_retries_total{method="ControllerPublishVolume",plugin="fake"} 0
csiactor_csi_retries_total{method="ControllerUnpublishVolume",plugin="fake"} 0
csiactor_csi_retries_total{method="CreateSnapshot",plugin="fake"} 0
csiactor_csi_retries_total{method="CreateVolume",plugin="fake"} 0
csiactor_csi_retries_total{method="DeleteSnapshot",plugin="fake"} 0
csiactor_csi_retries_total{method="DeleteVolume",plugin="fake"} 0
csiactor_csi_retries_total{method="NodePublishVolume",plugin="fake"} 0
csiactor_csi_retries_total{method="NodeStageVolume",plugin="fake"} 1
csiactor_csi_retries_total{method="NodeUnpublishVolume",plugin="fake"} 0
csiactor_csi_retries_total{method="NodeUnstageVolume",plugin="fake"} 1
# HELP csiactor_plugin_allocations Registered allocations of the plugin in this role (type); a monolith counts in both.
# TYPE csiactor_plugin_allocations gauge
csiactor_plugin_allocations{plugin="fake",type="controller"} 1
csiactor_plugin_allocations{plugin="fake",type="node"} 1
# HELP csiactor_plugin_healthy 1 when the plugin allocation is healthy in this role (type), else 0.
# TYPE csiactor_plugin_healthy gauge
csiactor_plugin_healthy{alloc="mono-1",plugin="fake",type="controller"} 1
csiactor_plugin_healthy{alloc="mono-1",plugin="fake",type="node"} 1
# HELP csiactor_plugin_singleton 1 when the allocation is the newest (the singleton) of its plugin in this role (type), else 0.
# TYPE csiactor_plugin_singleton gauge
csiactor_plugin_singleton{alloc="mono-1",plugin="fake",type="controller"} 1
csiactor_plugin_singleton{alloc="mono-1",plugin="fake",type="node"} 1
# HELP csiactor_volume_operations_in_flight Volume RPCs (publish, stage, unpublish, create, ...) in flight to plugins.
# TYPE csiactor_volume_operations_in_flight gauge
csiactor_volume_operations_in_flight 0
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(exposition),
		"csiactor_actor_restarts_total", "csiactor_csi_retries_total", "csiactor_plugin_allocations",
		"csiactor_plugin_healthy", "csiactor_plugin_singleton", "csiactor_volume_operations_in_flight"); err != nil {
		t.Error(err)
	}
	// Every claim is freed: every state counts 0, for both modes.
	for _, m := range families["csiactor_volume_claims"].GetMetric() {
		if m.GetGauge().GetValue() != 0 {
			t.Errorf("csiactor_volume_claims%v = %g after the release, want 0", m.GetLabel(), m.GetGauge().GetValue())
		}
	}
	if n := len(families["csiactor_volume_claims"].GetMetric()); n != 18 {
		t.Errorf("csiactor_volume_claims has %d series, want 9 states × 2 modes", n)
	}

	// The operations histogram: buckets from 1 ms to 600 s, the failed
	// and the successful stage each counted under its own code.
	counts := map[string]uint64{}
	for _, m := range families["csiactor_csi_operations_seconds"].GetMetric() {
		h := m.GetHistogram()
		var bounds []float64
		for _, b := range h.GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if !slices.Equal(bounds, csi.OperationBuckets) || bounds[0] != 0.001 || bounds[len(bounds)-1] != 600 {
			t.Fatalf("csiactor_csi_operations_seconds buckets = %v, want 1 ms … 600 s", bounds)
		}
		lv := map[string]string{}
		for _, l := range m.GetLabel() {
			lv[l.GetName()] = l.GetValue()
		}
		if lv["plugin"] != testPlugin {
			t.Errorf("csiactor_csi_operations_seconds plugin label %q, want %q", lv["plugin"], testPlugin)
		}
		counts[lv["method"]+"/"+lv["grpc_status_code"]] = h.GetSampleCount()
	}
	for key, want := range map[string]uint64{
		"NodeStageVolume/Unavailable": 1, "NodeStageVolume/OK": 1,
		"NodeUnstageVolume/Unavailable": 1, "NodeUnstageVolume/OK": 1,
		"ControllerPublishVolume/OK": 1, "NodePublishVolume/OK": 1,
		"NodeUnpublishVolume/OK": 1, "ControllerUnpublishVolume/OK": 1,
	} {
		if counts[key] != want {
			t.Errorf("csiactor_csi_operations_seconds_count{%s} = %d, want %d", key, counts[key], want)
		}
	}
	if counts["Probe/OK"] == 0 {
		t.Errorf("no Probe counted in csiactor_csi_operations_seconds")
	}
	if c := families["csiactor_store_commit_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); c == 0 {
		t.Errorf("csiactor_store_commit_seconds counted no commit")
	}
}

// TestRuntime_Metrics_Unregistered checks that Shutdown takes the
// runtime's collectors off the registry, so a new runtime can register on
// the same one.
func TestRuntime_Metrics_Unregistered(t *testing.T) {
	e := newEnv(t)
	e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	e.stop()
	rt, err := runtime.New(e.cfg, runtime.Options{Registerer: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatalf("second runtime on the same registry: %v", err)
	}
	if err := rt.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
