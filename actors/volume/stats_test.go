package volume

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/metrictest"
)

// statsPlugin stages, reports usage and the legacy node condition.
var statsPlugin = fakeplugin.Config{StageUnstage: true, VolumeStats: true, NodeCondition: true}

// statsMetrics are the names the stats collector exports.
var statsMetrics = []string{
	"csiactor_volume_stats_capacity_bytes", "csiactor_volume_stats_available_bytes", "csiactor_volume_stats_used_bytes",
	"csiactor_volume_stats_inodes", "csiactor_volume_stats_inodes_free", "csiactor_volume_stats_inodes_used",
	"csiactor_volume_condition_abnormal",
}

// ofType returns the events of type typ, in order.
func (l *eventLog) ofType(typ string) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, ev := range l.evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

func TestManager_PollStats_UsageConditionAndRelease(t *testing.T) {
	var evs eventLog
	e := newEnv(t, statsPlugin, withConfig(func(c *Config) { c.OnEvent = evs.add }))
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetUsage("ext-vol1", fakeplugin.Usage{TotalBytes: 1000, AvailableBytes: 900, UsedBytes: 100, Inodes: 50, InodesFree: 45, InodesUsed: 5})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := e.m.Get(ctx, "vol1")
	if err != nil {
		t.Fatal(err)
	}
	if u := v.Usage; u == nil || u.CapacityBytes != 1000 || u.AvailableBytes != 900 || u.UsedBytes != 100 ||
		u.Inodes != 50 || u.InodesFree != 45 || u.InodesUsed != 5 || u.CheckedAt.IsZero() {
		t.Errorf("usage = %+v", v.Usage)
	}
	if c := v.Condition; c == nil || c.Abnormal || c.CheckedAt.IsZero() {
		t.Errorf("condition = %+v, want normal", v.Condition)
	}
	req, _ := e.plugin.LastRequest("NodeGetVolumeStats").(*csipb.NodeGetVolumeStatsRequest)
	if c := v.Claims[0]; req.GetVolumePath() != c.TargetPath || req.GetStagingTargetPath() != c.StagingPath || req.GetVolumeId() != "ext-vol1" {
		t.Errorf("NodeGetVolumeStats request = %v, want the claim's paths", req)
	}
	want := `
# HELP csiactor_volume_condition_abnormal 1 when the volume's plugin reports its condition as abnormal, 0 when normal.
# TYPE csiactor_volume_condition_abnormal gauge
csiactor_volume_condition_abnormal{plugin="fake",volume="vol1"} 0
# HELP csiactor_volume_stats_available_bytes Number of available bytes in the volume.
# TYPE csiactor_volume_stats_available_bytes gauge
csiactor_volume_stats_available_bytes{plugin="fake",volume="vol1"} 900
# HELP csiactor_volume_stats_capacity_bytes Capacity in bytes of the volume, as its node plugin reports it (NodeGetVolumeStats).
# TYPE csiactor_volume_stats_capacity_bytes gauge
csiactor_volume_stats_capacity_bytes{plugin="fake",volume="vol1"} 1000
# HELP csiactor_volume_stats_inodes Maximum number of inodes in the volume.
# TYPE csiactor_volume_stats_inodes gauge
csiactor_volume_stats_inodes{plugin="fake",volume="vol1"} 50
# HELP csiactor_volume_stats_inodes_free Number of free inodes in the volume.
# TYPE csiactor_volume_stats_inodes_free gauge
csiactor_volume_stats_inodes_free{plugin="fake",volume="vol1"} 45
# HELP csiactor_volume_stats_inodes_used Number of used inodes in the volume.
# TYPE csiactor_volume_stats_inodes_used gauge
csiactor_volume_stats_inodes_used{plugin="fake",volume="vol1"} 5
# HELP csiactor_volume_stats_used_bytes Number of used bytes in the volume.
# TYPE csiactor_volume_stats_used_bytes gauge
csiactor_volume_stats_used_bytes{plugin="fake",volume="vol1"} 100
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), statsMetrics...); err != nil {
		t.Error(err)
	}
	if n := len(evs.ofType(EventVolumeAbnormal)) + len(evs.ofType(EventVolumeNormal)); n != 0 {
		t.Errorf("%d condition events for a volume that was always normal", n)
	}

	// The plugin says it is abnormal: the status, the metric and one event.
	e.plugin.SetCondition("ext-vol1", fakeplugin.Condition{Abnormal: true, Message: "bad sectors"})
	for range 2 { // twice: the second poll changes nothing, so no second event
		if err := e.m.PollStats(ctx); err != nil {
			t.Fatal(err)
		}
	}
	v, _ = e.m.Get(ctx, "vol1")
	if c := v.Condition; c == nil || !c.Abnormal || c.Message != "bad sectors" {
		t.Errorf("condition = %+v, want abnormal: bad sectors", v.Condition)
	}
	if got := gauge(t, e.reg, "csiactor_volume_condition_abnormal", "vol1"); got != 1 {
		t.Errorf("csiactor_volume_condition_abnormal = %g, want 1", got)
	}
	if ab := evs.ofType(EventVolumeAbnormal); len(ab) != 1 || ab[0].Volume != "vol1" || ab[0].Plugin != testPlugin || ab[0].Message != "abnormal: bad sectors" {
		t.Errorf("abnormal events = %+v", ab)
	}
	e.plugin.SetCondition("ext-vol1", fakeplugin.Condition{})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	if n := evs.ofType(EventVolumeNormal); len(n) != 1 || n[0].Message != "normal again" {
		t.Errorf("normal events = %+v", n)
	}

	// Released: the series disappear, the status has no usage, and the
	// next poll calls nothing.
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	v = e.waitFreed("vol1")
	if v.Usage != nil || v.Condition != nil {
		t.Errorf("released volume shows usage %+v, condition %+v", v.Usage, v.Condition)
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(""), statsMetrics...); err != nil {
		t.Errorf("series after release: %s", err)
	}
	calls := e.plugin.Calls("NodeGetVolumeStats")
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.plugin.Calls("NodeGetVolumeStats"); got != calls {
		t.Errorf("a volume without claims was polled (%d calls)", got-calls)
	}
}

// gauge returns the value of metric name for volume in reg, or -1 when
// there is no such series.
func gauge(t *testing.T, reg *prometheus.Registry, name, volume string) float64 {
	t.Helper()
	if v, ok := metrictest.Value(t, reg, name, map[string]string{"volume": volume}); ok {
		return v
	}
	return -1
}

// TestManager_PollStats_NoStatsCapability: a plugin that reports neither
// usage nor conditions is never asked, and its idle volumes are not woken.
func TestManager_PollStats_NoStatsCapability(t *testing.T) {
	e := newEnv(t, fakeplugin.Config{StageUnstage: true}, withConfig(func(c *Config) { c.IdleTimeout = 10 * time.Millisecond }))
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the volume actor to passivate", func() bool { return e.m.Live() == 0 })
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.m.Live(); n != 0 {
		t.Errorf("%d volume actors woken by a poll of a plugin without stats", n)
	}
	if n := e.plugin.Calls("NodeGetVolumeStats"); n != 0 {
		t.Errorf("NodeGetVolumeStats called %d times without GET_VOLUME_STATS", n)
	}
	if v, _ := e.m.Get(ctx, "vol1"); v.Usage != nil || v.Condition != nil {
		t.Errorf("usage %+v, condition %+v", v.Usage, v.Condition)
	}
}

// TestManager_PollStats_ControllerAndHealth: conditions from the node
// (GET_VOLUME_HEALTH) and the controller (GET_VOLUME_HEALTH), combined.
func TestManager_PollStats_ControllerAndHealth(t *testing.T) {
	e := newEnv(t, fakeplugin.Config{CreateDelete: true, StageUnstage: true, VolumeStats: true, VolumeHealth: true, GetVolume: true})
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)},
		Secrets: map[string]string{"token": "s3cr3t"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	ext := "vol-vol1"
	e.plugin.SetCondition(ext, fakeplugin.Condition{Abnormal: true, Message: "slow"})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	v, _ := e.m.Get(ctx, "vol1")
	want := "node: DEGRADED FakeCondition: slow; controller: DEGRADED FakeCondition: slow"
	if c := v.Condition; c == nil || !c.Abnormal || c.Message != want {
		t.Errorf("condition = %+v, want abnormal %q", v.Condition, want)
	}
	if n, c := e.plugin.Calls("NodeGetVolumeHealth"), e.plugin.Calls("ControllerGetVolumeHealth"); n != 1 || c != 1 {
		t.Errorf("health calls: node %d, controller %d; want 1 and 1", n, c)
	}
	if r, _ := e.plugin.LastRequest("ControllerGetVolumeHealth").(*csipb.ControllerGetVolumeHealthRequest); r.GetSecrets()["token"] != "s3cr3t" {
		t.Errorf("ControllerGetVolumeHealth without the volume's secrets")
	}
	if e.plugin.Calls("ControllerGetVolume") != 0 {
		t.Error("ControllerGetVolume called although GET_VOLUME_HEALTH answers")
	}
}

// TestManager_PollStats_LegacyControllerCondition: GET_VOLUME with the
// legacy VOLUME_CONDITION.
func TestManager_PollStats_LegacyControllerCondition(t *testing.T) {
	e := newEnv(t, fakeplugin.Config{CreateDelete: true, StageUnstage: true, GetVolume: true, ControllerCondition: true})
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetCondition("vol-vol1", fakeplugin.Condition{Abnormal: true, Message: "replica lost"})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	v, _ := e.m.Get(ctx, "vol1")
	if c := v.Condition; c == nil || !c.Abnormal || c.Message != "replica lost" || v.Usage != nil {
		t.Errorf("condition = %+v, usage %+v; want abnormal: replica lost, no usage", v.Condition, v.Usage)
	}
}

// TestManager_PollStats_FailureKeepsValues: a failed poll keeps the last
// values, logs a warning without secrets or mount flags, and the next
// successful poll updates them.
func TestManager_PollStats_FailureKeepsValues(t *testing.T) {
	var logs bytes.Buffer
	l := logrus.New()
	l.Out = &syncWriter{w: &logs}
	l.Level = logrus.DebugLevel
	var evs eventLog
	e := newEnv(t, statsPlugin, withConfig(func(c *Config) { c.Logger = logrus.NewEntry(l); c.OnEvent = evs.add }))
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetUsage("ext-vol1", fakeplugin.Usage{TotalBytes: 10, AvailableBytes: 7, UsedBytes: 3})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetUsage("ext-vol1", fakeplugin.Usage{TotalBytes: 10, AvailableBytes: 1, UsedBytes: 9})
	e.plugin.SetFault("NodeGetVolumeStats", fakeplugin.Fault{Code: codes.Internal, Message: "stats broke", Times: 1})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.m.Get(ctx, "vol1"); v.Usage == nil || v.Usage.UsedBytes != 3 {
		t.Errorf("after a failed poll usage = %+v, want the last values (3 used)", v.Usage)
	}
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.m.Get(ctx, "vol1"); v.Usage == nil || v.Usage.UsedBytes != 9 {
		t.Errorf("after a good poll usage = %+v, want 9 used", v.Usage)
	}
	out := logs.String()
	if !strings.Contains(out, "stats broke") {
		t.Errorf("the failed poll is not logged:\n%s", out)
	}
	for _, secret := range []string{"s3cr3t", "hunter2"} {
		if strings.Contains(out, secret) {
			t.Errorf("log holds %q:\n%s", secret, out)
		}
		for _, ev := range evs.ofType(EventVolumeAbnormal) {
			if strings.Contains(ev.Message, secret) {
				t.Errorf("event holds %q: %+v", secret, ev)
			}
		}
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// stepWatch wraps the plugin's client and fails when NodeGetVolumeStats of
// a volume is sent while a step RPC of the same volume is in flight.
type stepWatch struct {
	csi.Client
	t *testing.T

	mu       sync.Mutex
	inflight map[string]int // guarded by mu; step RPCs by volume ID
	stats    map[string]int // guarded by mu; NodeGetVolumeStats in flight by volume ID
	overlaps atomic.Int64
	cur, max atomic.Int64 // NodeGetVolumeStats in flight, all volumes
}

func newStepWatch(t *testing.T, c csi.Client) *stepWatch {
	return &stepWatch{Client: c, t: t, inflight: map[string]int{}, stats: map[string]int{}}
}

func (w *stepWatch) step(id string) func() {
	w.mu.Lock()
	w.inflight[id]++
	if w.stats[id] > 0 {
		w.overlaps.Add(1)
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.inflight[id]--
		w.mu.Unlock()
	}
}

func (w *stepWatch) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error {
	defer w.step(req.GetVolumeId())()
	return w.Client.NodeStageVolume(ctx, req)
}

func (w *stepWatch) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) error {
	defer w.step(req.GetVolumeId())()
	return w.Client.NodePublishVolume(ctx, req)
}

func (w *stepWatch) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) error {
	defer w.step(req.GetVolumeId())()
	return w.Client.NodeUnpublishVolume(ctx, req)
}

func (w *stepWatch) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) error {
	defer w.step(req.GetVolumeId())()
	return w.Client.NodeUnstageVolume(ctx, req)
}

func (w *stepWatch) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (csi.VolumeStats, error) {
	id := req.GetVolumeId()
	w.mu.Lock()
	if w.inflight[id] > 0 {
		w.overlaps.Add(1)
	}
	w.stats[id]++
	w.mu.Unlock()
	n := w.cur.Add(1)
	for {
		m := w.max.Load()
		if n <= m || w.max.CompareAndSwap(m, n) {
			break
		}
	}
	defer func() {
		w.cur.Add(-1)
		w.mu.Lock()
		w.stats[id]--
		w.mu.Unlock()
	}()
	return w.Client.NodeGetVolumeStats(ctx, req)
}

// TestManager_PollStats_NeverDuringStep: with the poller running every
// millisecond, claims and releases of a multi-writer volume (each
// NodePublishVolume slowed down) never overlap a stats call of the same
// volume, and a poll waits for a step in flight.
func TestManager_PollStats_NeverDuringStep(t *testing.T) {
	e := newEnv(t, statsPlugin, withConfig(func(c *Config) { c.StatsInterval = time.Millisecond }))
	w := newStepWatch(t, e.plugins.client.Client)
	e.plugins.client.Client = w // before the first claim: nothing uses it yet
	ctx := ctxT(t)
	e.register("vol1", fsCap(csi.AccessModeSingleNodeMultiWriter))
	if _, err := e.m.Claim(ctx, claimReq("vol1", "first", claim.ModeWrite, csi.AccessModeSingleNodeMultiWriter)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a first poll", func() bool { return e.plugin.Calls("NodeGetVolumeStats") > 0 })

	// A step blocked in the plugin: no poll of the volume starts meanwhile.
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Delay: 300 * time.Millisecond, Times: 1})
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(ctx, claimReq("vol1", "slow", claim.ModeWrite, csi.AccessModeSingleNodeMultiWriter))
		done <- err
	}()
	waitFor(t, "the slow NodePublishVolume to start", func() bool { return e.plugin.Calls("NodePublishVolume") == 2 })
	before := e.plugin.Calls("NodeGetVolumeStats")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.overlaps.Load() != 0 {
		t.Fatalf("%d stats calls overlapped a step of the same volume", w.overlaps.Load())
	}
	waitFor(t, "polls after the step", func() bool { return e.plugin.Calls("NodeGetVolumeStats") > before })

	// Churn: claims and releases while the poller runs.
	for i := range 10 {
		alloc := fmt.Sprintf("c%d", i)
		if _, err := e.m.Claim(ctx, claimReq("vol1", alloc, claim.ModeWrite, csi.AccessModeSingleNodeMultiWriter)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.Release(ctx, "vol1", alloc); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFreed("vol1")
	if w.overlaps.Load() != 0 {
		t.Errorf("%d stats calls overlapped a step of the same volume", w.overlaps.Load())
	}
}

// TestManager_PollStats_BoundedConcurrency: many volumes, slow stats: at
// most StatsConcurrency polls at once, and every volume is polled.
func TestManager_PollStats_BoundedConcurrency(t *testing.T) {
	e := newEnv(t, statsPlugin, withConfig(func(c *Config) { c.StatsConcurrency = 3 }))
	w := newStepWatch(t, e.plugins.client.Client)
	e.plugins.client.Client = w
	ctx := ctxT(t)
	const n = 12
	for i := range n {
		id := fmt.Sprintf("vol%d", i)
		e.register(id)
		if _, err := e.m.Claim(ctx, claimReq(id, "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
			t.Fatal(err)
		}
	}
	e.plugin.SetFault("NodeGetVolumeStats", fakeplugin.Fault{Delay: 20 * time.Millisecond})
	if err := e.m.PollStats(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.plugin.Calls("NodeGetVolumeStats"); got != n {
		t.Errorf("NodeGetVolumeStats calls = %d, want %d", got, n)
	}
	if m := w.max.Load(); m > 3 {
		t.Errorf("%d polls in flight at once, want at most 3", m)
	}
	for i := range n {
		if v, _ := e.m.Get(ctx, fmt.Sprintf("vol%d", i)); v.Usage == nil {
			t.Errorf("vol%d has no usage", i)
		}
	}
}

func TestConfig_Validate_Stats(t *testing.T) {
	for _, c := range []struct {
		f    func(*Config)
		want string
	}{
		{func(c *Config) { c.StatsInterval = -time.Second }, "stats_interval -1s is negative"},
		{func(c *Config) { c.StatsConcurrency = -1 }, "stats_concurrency -1 is negative"},
		{func(c *Config) { c.StatsTimeout = -time.Second }, "stats_timeout -1s is negative"},
	} {
		cfg := testConfig("/tmp/x")
		c.f(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want %q", err, c.want)
		}
	}
}

// TestManager_Get_StatsStatus: while a volume has a published claim, Get
// and List say whether its usage and condition are reported, pending (the
// plugin reports them, no poll yet) or unsupported, by what the plugin
// advertises; without a published claim they say nothing.
func TestManager_Get_StatsStatus(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		plugin                 fakeplugin.Config
		usage, cond            string // after the poll
		pendingUsage, pendCond string // before it
	}{
		{"stats and condition", statsPlugin, StatsReported, StatsReported, StatsPending, StatsPending},
		{"stats only", fakeplugin.Config{StageUnstage: true, VolumeStats: true}, StatsReported, StatsUnsupported, StatsPending, StatsUnsupported},
		{"node health only", fakeplugin.Config{StageUnstage: true, VolumeHealth: true}, StatsUnsupported, StatsReported, StatsUnsupported, StatsPending},
		{"neither", fakeplugin.Config{StageUnstage: true}, StatsUnsupported, StatsUnsupported, StatsUnsupported, StatsUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.plugin)
			ctx := ctxT(t)
			e.register("vol1")
			check := func(when, usage, cond string) {
				t.Helper()
				v, err := e.m.Get(ctx, "vol1")
				if err != nil {
					t.Fatal(err)
				}
				vs, err := e.m.List(ctx, Filter{})
				if err != nil || len(vs) != 1 {
					t.Fatalf("list: %v, %v", vs, err)
				}
				for _, v := range []Volume{v, vs[0]} {
					if v.UsageStatus != usage || v.ConditionStatus != cond {
						t.Errorf("%s: usage_status %q, condition_status %q; want %q, %q", when, v.UsageStatus, v.ConditionStatus, usage, cond)
					}
					if (v.Usage != nil) != (usage == StatsReported) || (v.Condition != nil) != (cond == StatsReported) {
						t.Errorf("%s: usage %+v, condition %+v with statuses %q, %q", when, v.Usage, v.Condition, usage, cond)
					}
				}
			}
			check("unclaimed", "", "")
			if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
				t.Fatal(err)
			}
			check("published, not polled", tc.pendingUsage, tc.pendCond)
			e.plugin.SetUsage("ext-vol1", fakeplugin.Usage{TotalBytes: 1000, AvailableBytes: 900, UsedBytes: 100})
			if err := e.m.PollStats(ctx); err != nil {
				t.Fatal(err)
			}
			check("polled", tc.usage, tc.cond)
			if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the claim freed", func() bool {
				v, err := e.m.Get(ctx, "vol1")
				return err == nil && len(v.Claims) == 0 && len(v.PastClaims) == 0
			})
			check("released", "", "")
		})
	}
}
