package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/metrictest"
	"github.com/csiactor/csiactor/runtime"
)

// metricValue returns the value of the gauge name for volume in reg, and
// whether there is such a series.
func metricValue(t *testing.T, reg *prometheus.Registry, name, volume string) (float64, bool) {
	t.Helper()
	return metrictest.Value(t, reg, name, map[string]string{"volume": volume})
}

// TestRuntime_VolumeStats_ExamplePlugin: the usage and condition of a
// claimed volume of the example plugin, polled every stats interval,
// through the HTTP API, the metrics and the events: a file written into
// the volume shows in its used bytes, a condition flipped in the plugin
// shows as abnormal and back, and everything goes with the claim.
func TestRuntime_VolumeStats_ExamplePlugin(t *testing.T) {
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Volumes.StatsInterval = 20 * time.Millisecond
	e.start()
	pdir := shortDir(t, "csiactor-ex-")
	sock, stop := servePlugin(pdir)
	t.Cleanup(stop)
	ctx := context.Background()
	if _, err := e.rt.RegisterAllocation(ctx, "ex", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	c := serveAPI(t, e.rt)

	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "example", ""
	spec.Secrets = map[string]string{"password": "s3cr3t-stats"}
	const capacity = 64 << 20
	vol, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "data1", VolumeSpec: spec, CapacityBytes: capacity})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, "data1", claimReq("web", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	var before runtime.VolumeUsage
	eventually(t, "a first usage", func() (bool, error) {
		v, err := c.Volume(ctx, "data1")
		if v.Usage != nil {
			before = *v.Usage
		}
		return v.Usage != nil, err
	})
	if before.CapacityBytes != capacity || before.Inodes <= 0 || before.InodesUsed < 1 {
		t.Errorf("first usage = %+v, want the %d-byte capacity and inodes", before, capacity)
	}

	const size = 1 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i) | 1
	}
	if err := os.WriteFile(filepath.Join(cl.TargetPath, "blob"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	var after runtime.VolumeUsage
	eventually(t, "the used bytes to grow by the file", func() (bool, error) {
		v, err := c.Volume(ctx, "data1")
		if v.Usage != nil {
			after = *v.Usage
		}
		return err == nil && after.UsedBytes >= before.UsedBytes+size, err
	})
	if after.UsedBytes > before.UsedBytes+size+64<<10 || after.InodesUsed != before.InodesUsed+1 ||
		after.AvailableBytes != capacity-after.UsedBytes {
		t.Errorf("usage after a %d-byte file = %+v (before %+v)", size, after, before)
	}
	eventually(t, "the used bytes metric", func() (bool, error) {
		v, ok := metricValue(t, e.reg, "csiactor_volume_stats_used_bytes", "data1")
		return ok && v >= float64(before.UsedBytes+size), nil
	})
	// The condition comes from other calls of the same poll (the
	// controller's): a poll whose condition call failed under load
	// records usage without it, so it is waited for on its own.
	eventually(t, "csiactor_volume_condition_abnormal 0", func() (bool, error) {
		v, ok := metricValue(t, e.reg, "csiactor_volume_condition_abnormal", "data1")
		if ok && v != 0 {
			return false, fmt.Errorf("csiactor_volume_condition_abnormal = %g before the flip, want 0", v)
		}
		return ok, nil
	})

	// Flip the condition in the plugin.
	flag := filepath.Join(pdir, "plugin-state", csiplugin.ConditionsDir, vol.ExternalID)
	if fi, err := os.Stat(filepath.Dir(flag)); err != nil || !fi.IsDir() {
		t.Fatalf("the plugin did not create its conditions directory: %v", err)
	}
	// Written whole (a rename): a poll between the creation of the file
	// and its write would see the volume abnormal without a message
	// first, and then with one, two events.
	if err := os.WriteFile(flag+".tmp", []byte("bad sectors\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(flag+".tmp", flag); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the volume abnormal", func() (bool, error) {
		v, err := c.Volume(ctx, "data1")
		return err == nil && v.Condition != nil && v.Condition.Abnormal, err
	})
	v, _ := c.Volume(ctx, "data1")
	if want := "DEGRADED OperatorFlagged: bad sectors"; v.Condition.Message != want || v.Condition.CheckedAt.IsZero() {
		t.Errorf("condition = %+v, want %q", v.Condition, want)
	}
	eventually(t, "the abnormal metric", func() (bool, error) {
		v, ok := metricValue(t, e.reg, "csiactor_volume_condition_abnormal", "data1")
		return ok && v == 1, nil
	})
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the volume normal again", func() (bool, error) {
		v, err := c.Volume(ctx, "data1")
		return err == nil && v.Condition != nil && !v.Condition.Abnormal, err
	})
	evs, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var abnormal, normal int
	for _, ev := range evs {
		switch {
		case ev.Type == runtime.EventVolumeConditionAbnormal && ev.Volume == "data1" && ev.Plugin == "example":
			abnormal++
			if ev.Message != "abnormal: DEGRADED OperatorFlagged: bad sectors" {
				t.Errorf("abnormal event message %q", ev.Message)
			}
		case ev.Type == runtime.EventVolumeConditionNormal && ev.Volume == "data1":
			normal++
		}
	}
	if abnormal != 1 || normal != 1 {
		t.Errorf("%d abnormal and %d normal events, want 1 and 1: %+v", abnormal, normal, evs)
	}

	// The status as JSON has the usage and the condition, and no secret.
	raw, _ := json.Marshal(v)
	for _, want := range []string{`"usage":{"capacity_bytes":67108864`, `"condition":{"abnormal":true`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("volume JSON lacks %s: %s", want, raw)
		}
	}
	if strings.Contains(string(raw), "s3cr3t") || strings.Contains(toJSON(t, evs), "s3cr3t") {
		t.Error("a secret reached the status or the events")
	}

	// Released: no usage, no series.
	if _, err := c.Release(ctx, "data1", "web"); err != nil {
		t.Fatal(err)
	}
	v = e.waitFreed("data1", "web")
	if v.Usage != nil || v.Condition != nil {
		t.Errorf("released volume shows usage %+v, condition %+v", v.Usage, v.Condition)
	}
	for _, name := range []string{"csiactor_volume_stats_used_bytes", "csiactor_volume_stats_capacity_bytes", "csiactor_volume_stats_inodes", "csiactor_volume_condition_abnormal"} {
		if _, ok := metricValue(t, e.reg, name, "data1"); ok {
			t.Errorf("%s{volume=data1} still exported after release", name)
		}
	}
	if err := e.rt.PollVolumeStats(ctx); err != nil {
		t.Errorf("PollVolumeStats = %v", err)
	}
}

// TestRuntime_VolumeStatsStatus_Hostpath: with the hostpath driver
// (GET_VOLUME_STATS, VOLUME_CONDITION), a freshly published volume's
// usage and condition are pending through the HTTP API until a poll
// records them, then reported; released, the volume says nothing of them.
func TestRuntime_VolumeStatsStatus_Hostpath(t *testing.T) {
	e, _ := hostpathEnv(t, "csiactor-ssh-", func(_ string, c *runtime.Config) {
		// Far away: the first round (at a random point of the first
		// interval) does not come during the test; the test polls.
		c.Volumes.StatsInterval = 10000 * time.Hour
	})
	ctx := context.Background()
	c := serveAPI(t, e.rt)
	spec := runtime.VolumeSpec{Plugin: hostpath.PluginName,
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol1", CapacityBytes: 1 << 20, VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	check := func(when, want string, values bool) {
		t.Helper()
		v, err := c.Volume(ctx, "vol1")
		if err != nil {
			t.Fatal(err)
		}
		if v.UsageStatus != want || v.ConditionStatus != want || (v.Usage != nil) != values || (v.Condition != nil) != values {
			t.Errorf("%s: usage %+v (%q), condition %+v (%q); want status %q, values %t",
				when, v.Usage, v.UsageStatus, v.Condition, v.ConditionStatus, want, values)
		}
	}
	check("unclaimed", "", false)
	if _, err := c.Claim(ctx, "vol1", claimReq("a1", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	check("published", runtime.StatsPending, false)
	if err := e.rt.PollVolumeStats(ctx); err != nil {
		t.Fatal(err)
	}
	check("polled", runtime.StatsReported, true)
	if _, err := c.Release(ctx, "vol1", "a1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1", "a1")
	check("released", "", false)
}
