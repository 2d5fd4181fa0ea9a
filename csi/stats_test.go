package csi

import (
	"errors"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// TestClient_NodeGetVolumeStats_Usage: the usage and the legacy
// volume_condition of a plugin built with the spec before v1.13 come
// through, over a real socket.
func TestClient_NodeGetVolumeStats_Usage(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{StageUnstage: true, VolumeStats: true, NodeCondition: true})
	ctx := testCtx(t)
	caps, err := c.NodeCapabilities(ctx)
	if err != nil || !caps.GetVolumeStats || !caps.VolumeCondition || caps.GetVolumeHealth {
		t.Fatalf("NodeCapabilities = %+v, %v", caps, err)
	}
	vc := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	staging, target := t.TempDir(), t.TempDir()+"/t"
	if err := c.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v1", StagingTargetPath: staging, VolumeCapability: vc}); err != nil {
		t.Fatal(err)
	}
	if err := c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v1", StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc}); err != nil {
		t.Fatal(err)
	}
	p.SetUsage("v1", fakeplugin.Usage{TotalBytes: 100, AvailableBytes: 60, UsedBytes: 40, Inodes: 10, InodesFree: 7, InodesUsed: 3})
	st, err := c.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if *st.Bytes != (Usage{100, 60, 40}) || *st.Inodes != (Usage{10, 7, 3}) {
		t.Errorf("usage = %+v, %+v", *st.Bytes, *st.Inodes)
	}
	if st.Condition == nil || st.Condition.Abnormal {
		t.Errorf("condition = %+v, want normal", st.Condition)
	}
	p.SetCondition("v1", fakeplugin.Condition{Abnormal: true, Message: "disk on fire"})
	st, err = c.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: staging})
	if err != nil || st.Condition == nil || *st.Condition != (VolumeCondition{Abnormal: true, Message: "disk on fire"}) {
		t.Errorf("stats at the staging path = %+v, %v", st.Condition, err)
	}

	// A path where the volume is not: NotFound, final.
	_, err = c.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: "/nowhere"})
	if Code(err) != codes.NotFound || Classify(PublishKind, err) != Final {
		t.Errorf("stats off its path = %v", err)
	}
	// A plugin answer against the spec.
	p.SetFault("NodeGetVolumeStats", fakeplugin.Fault{Garbage: true, Times: 1})
	if _, err := c.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: target}); !errors.Is(err, ErrInvalidResponse) {
		t.Errorf("negative usage = %v, want ErrInvalidResponse", err)
	}
	p.SetFault("NodeGetVolumeStats", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	if _, err := c.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: target}); Classify(PublishKind, err) != Uncertain {
		t.Errorf("unavailable = %v", err)
	}
}

// TestClient_VolumeHealth: GET_VOLUME_HEALTH on both sides, and the
// legacy condition of ControllerGetVolume.
func TestClient_VolumeHealth(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{VolumeHealth: true, Controller: true, GetVolume: true, ControllerCondition: true})
	ctx := testCtx(t)
	cc, err := c.ControllerCapabilities(ctx)
	if err != nil || !cc.GetVolume || !cc.VolumeCondition || !cc.GetVolumeHealth {
		t.Fatalf("ControllerCapabilities = %+v, %v", cc, err)
	}
	if got := cc.Names(); got[len(got)-1] != "GET_VOLUME_HEALTH" {
		t.Errorf("names = %v", got)
	}
	p.AddVolume(fakeplugin.Volume{ID: "v1", CapacityBytes: 1 << 20})
	h, err := c.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: "v1"})
	if err != nil || h.Condition == nil || h.Condition.Abnormal {
		t.Fatalf("ControllerGetVolume = %+v, %v", h.Condition, err)
	}
	p.SetCondition("v1", fakeplugin.Condition{Abnormal: true, Message: "replica lost"})
	h, err = c.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: "v1"})
	if err != nil || *h.Condition != (VolumeCondition{Abnormal: true, Message: "replica lost"}) {
		t.Errorf("ControllerGetVolume = %+v, %v", h.Condition, err)
	}
	want := VolumeCondition{Abnormal: true, Message: "DEGRADED FakeCondition: replica lost"}
	if got, err := c.ControllerGetVolumeHealth(ctx, &csipb.ControllerGetVolumeHealthRequest{VolumeId: "v1"}); err != nil || got != want {
		t.Errorf("ControllerGetVolumeHealth = %+v, %v", got, err)
	}
	if got, err := c.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: "v1"}); err != nil || got != want {
		t.Errorf("NodeGetVolumeHealth = %+v, %v", got, err)
	}
	if _, err := c.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: "nope"}); Code(err) != codes.NotFound {
		t.Errorf("unknown volume = %v", err)
	}
}

// TestHealthCondition_UnknownTypesIgnored: a status type this build does
// not know does not make a volume abnormal.
func TestHealthCondition_UnknownTypesIgnored(t *testing.T) {
	got := healthCondition(&csipb.VolumeHealth{HealthStatuses: []*csipb.VolumeHealth_VolumeHealthEntry{
		{Status: csipb.VolumeHealthErrorType(42), Reason: "Future"},
	}})
	if got.Abnormal || got.Message != "" {
		t.Errorf("healthCondition = %+v", got)
	}
}

// TestLegacyCondition_Malformed: broken unknown bytes are an error, not a
// panic or a silent normal.
func TestLegacyCondition_Malformed(t *testing.T) {
	m := (&csipb.NodeGetVolumeStatsResponse{}).ProtoReflect()
	m.SetUnknown([]byte{0x12, 0x05, 0x08}) // field 2, 5 bytes announced, 1 there
	if _, err := legacyCondition(m); err == nil {
		t.Error("legacyCondition of truncated bytes = nil error")
	}
}

// TestClient_NodeGetVolumeStats_Timeout: a hung stats call ends at the
// RPC timeout.
func TestClient_NodeGetVolumeStats_Timeout(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{VolumeStats: true}, WithRPCTimeout(50*time.Millisecond))
	p.SetFault("NodeGetVolumeStats", fakeplugin.Fault{Hang: true})
	_, err := c.NodeGetVolumeStats(testCtx(t), &csipb.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: "/x"})
	if Code(err) != codes.DeadlineExceeded {
		t.Errorf("hung NodeGetVolumeStats = %v", err)
	}
}
