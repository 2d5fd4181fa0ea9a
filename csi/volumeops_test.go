package csi

import (
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// TestClient_VolumeOps_Classified sends the expansion, capacity and list
// RPCs to a real plugin server and checks that each answers, and that the
// errors they return carry the plugin's code for Classify.
func TestClient_VolumeOps_Classified(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{
		CreateDelete: true, ControllerExpand: true, NodeExpand: true, NodeExpansionRequired: true,
		GetCapacity: true, Capacity: 1 << 30, ListVolumes: true,
	})
	ctx := testCtx(t)
	p.AddVolume(fakeplugin.Volume{ID: "v1", CapacityBytes: 1 << 20})
	resp, err := c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: "v1", CapacityRange: &csipb.CapacityRange{RequiredBytes: 2 << 20}})
	if err != nil || resp.GetCapacityBytes() != 2<<20 || !resp.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume = %v, %v", resp, err)
	}
	capy, err := c.GetCapacity(ctx, &csipb.GetCapacityRequest{})
	if err != nil || capy.GetAvailableCapacity() != 1<<30-2<<20 {
		t.Fatalf("GetCapacity = %v, %v", capy, err)
	}
	list, err := c.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != "v1" {
		t.Fatalf("ListVolumes = %v, %v", list, err)
	}
	// NodeExpandVolume of a path where the volume is not published.
	_, err = c.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v1", VolumePath: "/nowhere"})
	if Code(err) != codes.NotFound || Classify(PublishKind, err) != Final {
		t.Errorf("NodeExpandVolume off its path = %v (%s)", err, Classify(PublishKind, err))
	}
	for _, tt := range []struct {
		method string
		code   codes.Code
		want   Outcome
	}{
		{"ControllerExpandVolume", codes.Unavailable, Uncertain},
		{"ControllerExpandVolume", codes.ResourceExhausted, Retry},
		{"ControllerExpandVolume", codes.OutOfRange, Final},
		{"GetCapacity", codes.Aborted, Retry},
		{"ListVolumes", codes.InvalidArgument, Final},
	} {
		p.SetFault(tt.method, fakeplugin.Fault{Code: tt.code, Times: 1})
		var err error
		switch tt.method {
		case "ControllerExpandVolume":
			_, err = c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: "v1", CapacityRange: &csipb.CapacityRange{RequiredBytes: 3 << 20}})
		case "GetCapacity":
			_, err = c.GetCapacity(ctx, &csipb.GetCapacityRequest{})
		case "ListVolumes":
			_, err = c.ListVolumes(ctx, &csipb.ListVolumesRequest{})
		}
		if Code(err) != tt.code || Classify(PublishKind, err) != tt.want {
			t.Errorf("%s with %s = %v (%s), want %s", tt.method, tt.code, err, Classify(PublishKind, err), tt.want)
		}
	}
}

// TestClient_VolumeOps_Timeout: the expansion RPCs end at the client's
// RPC timeout when the plugin hangs.
func TestClient_VolumeOps_Timeout(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{ControllerExpand: true, NodeExpand: true}, WithRPCTimeout(50*time.Millisecond))
	p.SetFault("ControllerExpandVolume", fakeplugin.Fault{Hang: true})
	_, err := c.ControllerExpandVolume(testCtx(t), &csipb.ControllerExpandVolumeRequest{VolumeId: "v1", CapacityRange: &csipb.CapacityRange{RequiredBytes: 1}})
	if Code(err) != codes.DeadlineExceeded || Classify(PublishKind, err) != Uncertain {
		t.Errorf("hung ControllerExpandVolume = %v", err)
	}
}
