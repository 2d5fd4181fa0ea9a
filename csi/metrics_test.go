package csi

import (
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

func TestMetrics_OperationsHistogram(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	p, c := startPlugin(t, fakeplugin.Config{}, WithMetrics(m), WithPluginName("fake.csi"))
	ctx := testCtx(t)
	for range 2 {
		if _, err := c.Probe(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.NotFound})
	_ = c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", VolumeCapability: mountCap()})

	if n := testutil.CollectAndCount(m.operations); n != 2 {
		t.Fatalf("%d series, want 2", n)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range families {
		if mf.GetName() != "csiactor_csi_operations_seconds" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			got[labelString(metric)] = metric.GetHistogram().GetSampleCount()
			buckets := metric.GetHistogram().GetBucket()
			if len(buckets) != len(OperationBuckets) || buckets[0].GetUpperBound() != 0.001 || buckets[len(buckets)-1].GetUpperBound() != 600 {
				t.Errorf("buckets from %g to %g (%d), want 0.001 to 600", buckets[0].GetUpperBound(), buckets[len(buckets)-1].GetUpperBound(), len(buckets))
			}
		}
	}
	want := map[string]uint64{
		"grpc_status_code=OK,method=Probe,plugin=fake.csi":                   2,
		"grpc_status_code=NotFound,method=NodePublishVolume,plugin=fake.csi": 1,
	}
	if len(got) != len(want) {
		t.Fatalf("series = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d samples, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

func TestNewMetrics_SameRegistryTwice_Shares(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("second NewMetrics: %s", err)
	}
	a.retries.WithLabelValues("p", "m").Inc()
	b.retries.WithLabelValues("p", "m").Inc()
	if got := testutil.ToFloat64(a.retries.WithLabelValues("p", "m")); got != 2 {
		t.Fatalf("shared counter = %g, want 2", got)
	}
}

func TestNewMetrics_Conflict(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "csiactor_csi_retries_total", Help: "other"}))
	if _, err := NewMetrics(reg); err == nil || !strings.Contains(err.Error(), "register csi metrics") {
		t.Fatalf("NewMetrics = %v, want a registration error", err)
	}
}

func TestNewMetrics_NilRegistry(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil || m == nil {
		t.Fatalf("NewMetrics(nil) = %v, %v", m, err)
	}
	m.operations.WithLabelValues("p", "m", "OK").Observe(1) // usable, just not exported
}
