package csiplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestController_CreateVolume_Idempotent(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	req := func(required, limit int64, params map[string]string) *csipb.CreateVolumeRequest {
		return &csipb.CreateVolumeRequest{
			Name:               "data",
			VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw)},
			CapacityRange:      &csipb.CapacityRange{RequiredBytes: required, LimitBytes: limit},
			Parameters:         params,
		}
	}
	first, err := tp.ctrl.CreateVolume(ctx, req(1<<30, 0, map[string]string{"tier": "fast"}))
	mustOK(t, "CreateVolume", err)
	id := first.GetVolume().GetVolumeId()
	if got := first.GetVolume().GetCapacityBytes(); got != 1<<30 {
		t.Errorf("capacity %d, want the required %d", got, 1<<30)
	}
	if fi, err := os.Stat(tp.volumeDir(id)); err != nil || !fi.IsDir() {
		t.Fatalf("volume directory: %v", err)
	}
	// A file in the volume must survive a repeated CreateVolume.
	marker := filepath.Join(tp.volumeDir(id), "marker")
	if err := os.WriteFile(marker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		req  *csipb.CreateVolumeRequest
		code codes.Code
	}{
		{"same request", req(1<<30, 0, map[string]string{"tier": "fast"}), codes.OK},
		{"smaller requirement fits", req(1<<20, 2<<30, map[string]string{"tier": "fast"}), codes.OK},
		{"larger requirement", req(2<<30, 0, map[string]string{"tier": "fast"}), codes.AlreadyExists},
		{"limit below capacity", req(1<<20, 1<<29, map[string]string{"tier": "fast"}), codes.AlreadyExists},
		{"other parameters", req(1<<30, 0, map[string]string{"tier": "slow"}), codes.AlreadyExists},
		{"no parameters", req(1<<30, 0, nil), codes.AlreadyExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tp.ctrl.CreateVolume(ctx, tt.req)
			wantCode(t, "CreateVolume", err, tt.code)
			if tt.code == codes.OK && resp.GetVolume().GetVolumeId() != id {
				t.Errorf("volume id %q, want %q", resp.GetVolume().GetVolumeId(), id)
			}
		})
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("data lost by a repeated CreateVolume: %v", err)
	}
}

func TestController_CreateVolume_BadInput(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	block := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: snw},
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
	}
	caps := []*csipb.VolumeCapability{mountCap(snw)}
	tests := []struct {
		name      string
		req       *csipb.CreateVolumeRequest
		code      codes.Code
		wantField string
	}{
		{"no name", &csipb.CreateVolumeRequest{VolumeCapabilities: caps}, codes.InvalidArgument, "name"},
		{"no capabilities", &csipb.CreateVolumeRequest{Name: "v"}, codes.InvalidArgument, "volume_capabilities"},
		{"no access mode", &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csipb.VolumeCapability{{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		}}}, codes.InvalidArgument, "volume_capabilities[0].access_mode"},
		{"block", &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csipb.VolumeCapability{block}}, codes.InvalidArgument, "block"},
		{"unsupported mount flag", &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw, "ro", "secret-flag")}}, codes.InvalidArgument, "mount_flags[1]"},
		{"negative capacity", &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: caps, CapacityRange: &csipb.CapacityRange{RequiredBytes: -1}}, codes.InvalidArgument, "capacity_range"},
		{"limit below required", &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: caps, CapacityRange: &csipb.CapacityRange{RequiredBytes: 10, LimitBytes: 5}}, codes.OutOfRange, "limit_bytes"},
		{"unknown content source", &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: caps, VolumeContentSource: &csipb.VolumeContentSource{
			Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: "x"}},
		}}, codes.NotFound, `volume "x" not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tp.ctrl.CreateVolume(ctx, tt.req)
			wantCode(t, "CreateVolume", err, tt.code)
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tt.wantField) {
				t.Errorf("error %q does not name %q", msg, tt.wantField)
			}
			if strings.Contains(status.Convert(err).Message(), "secret-flag") {
				t.Errorf("error %q quotes a mount flag", err)
			}
		})
	}
	// Bad input changes nothing.
	list, err := tp.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	mustOK(t, "ListVolumes", err)
	if n := len(list.GetEntries()); n != 0 {
		t.Errorf("%d volumes after only bad requests, want 0", n)
	}
	if strings.Contains(tp.logs.String(), "secret-flag") {
		t.Error("a mount flag reached the log")
	}
}

func TestController_DeleteVolume(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	v := tp.createVolume(ctx, "doomed")
	dir := tp.volumeDir(v.GetVolumeId())

	_, err := tp.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId: v.GetVolumeId(), NodeId: tp.cfg.NodeID, VolumeCapability: mountCap(snw),
	})
	mustOK(t, "ControllerPublishVolume", err)
	_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	wantCode(t, "DeleteVolume while published", err, codes.FailedPrecondition)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("refused delete removed the directory: %v", err)
	}

	_, err = tp.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: tp.cfg.NodeID})
	mustOK(t, "ControllerUnpublishVolume", err)
	_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	mustOK(t, "DeleteVolume", err)
	_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	mustOK(t, "DeleteVolume again", err)
	if _, err := os.Stat(dir); !isNotExist(err) {
		t.Errorf("volume directory still there after delete: %v", err)
	}
	// Ids the plugin never handed out, path-like ones included, are
	// simply unknown.
	for _, id := range []string{"fake-vol-id", "../../etc", "vol-" + strings.Repeat("0", 32)} {
		_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
		mustOK(t, "DeleteVolume "+id, err)
	}
	_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{})
	wantCode(t, "DeleteVolume without id", err, codes.InvalidArgument)

	// The same name gets a fresh, empty directory.
	again := tp.createVolume(ctx, "doomed")
	entries, err := os.ReadDir(tp.volumeDir(again.GetVolumeId()))
	if err != nil || len(entries) != 0 {
		t.Errorf("recreated volume: %d entries, %v; want empty", len(entries), err)
	}
}

func TestController_ControllerPublishVolume(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink, MaxVolumesPerNode: 2})
	a := tp.createVolume(ctx, "a").GetVolumeId()
	b := tp.createVolume(ctx, "b").GetVolumeId()
	c := tp.createVolume(ctx, "c").GetVolumeId()
	pub := func(id, node string, readonly bool) (*csipb.ControllerPublishVolumeResponse, error) {
		return tp.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
			VolumeId: id, NodeId: node, VolumeCapability: mountCap(snw), Readonly: readonly,
		})
	}

	first, err := pub(a, tp.cfg.NodeID, false)
	mustOK(t, "publish a", err)
	want := map[string]string{csiplugin.PublishContextNodeID: tp.cfg.NodeID, csiplugin.PublishContextReadonly: "false"}
	for k, v := range want {
		if first.GetPublishContext()[k] != v {
			t.Errorf("publish context %v, want %v", first.GetPublishContext(), want)
		}
	}

	tests := []struct {
		name     string
		id, node string
		readonly bool
		code     codes.Code
	}{
		{"repeat", a, tp.cfg.NodeID, false, codes.OK},
		{"readonly changes", a, tp.cfg.NodeID, true, codes.AlreadyExists},
		{"unknown node", b, "other-node", false, codes.NotFound},
		{"unknown volume", "vol-" + strings.Repeat("f", 32), tp.cfg.NodeID, false, codes.NotFound},
		{"second volume", b, tp.cfg.NodeID, false, codes.OK},
		{"over the node limit", c, tp.cfg.NodeID, false, codes.ResourceExhausted},
		{"no node", c, "", false, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := pub(tt.id, tt.node, tt.readonly)
			wantCode(t, "ControllerPublishVolume", err, tt.code)
			if tt.code == codes.OK && resp.GetPublishContext()[csiplugin.PublishContextNodeID] != tp.cfg.NodeID {
				t.Errorf("publish context %v", resp.GetPublishContext())
			}
		})
	}

	// Unpublish frees a slot; unknown volume and node are success.
	for _, req := range []*csipb.ControllerUnpublishVolumeRequest{
		{VolumeId: a, NodeId: tp.cfg.NodeID},
		{VolumeId: a, NodeId: tp.cfg.NodeID},
		{VolumeId: a, NodeId: "other-node"},
		{VolumeId: "fake-vol-id", NodeId: tp.cfg.NodeID},
	} {
		_, err := tp.ctrl.ControllerUnpublishVolume(ctx, req)
		mustOK(t, "ControllerUnpublishVolume", err)
	}
	_, err = pub(c, tp.cfg.NodeID, false)
	mustOK(t, "publish c after unpublishing a", err)
}

func TestController_ListVolumes_Pages(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	want := map[string]bool{}
	for _, name := range []string{"v1", "v2", "v3", "v4", "v5"} {
		want[tp.createVolume(ctx, name).GetVolumeId()] = true
	}
	got := map[string]bool{}
	token := ""
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("more pages than expected")
		}
		resp, err := tp.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		mustOK(t, "ListVolumes", err)
		if len(resp.GetEntries()) > 2 {
			t.Fatalf("page of %d entries, max 2", len(resp.GetEntries()))
		}
		for _, e := range resp.GetEntries() {
			if got[e.GetVolume().GetVolumeId()] {
				t.Errorf("volume %s listed twice", e.GetVolume().GetVolumeId())
			}
			got[e.GetVolume().GetVolumeId()] = true
		}
		token = resp.GetNextToken()
		if token == "" {
			break
		}
		// Deleting the token's volume must not break the next page.
		if pages == 0 {
			_, err := tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: token})
			mustOK(t, "DeleteVolume", err)
			delete(want, token)
		}
	}
	if len(got) != len(want) {
		t.Errorf("listed %d volumes, want %d", len(got), len(want))
	}
	for id := range want {
		if !got[id] {
			t.Errorf("volume %s not listed", id)
		}
	}
	_, err := tp.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{StartingToken: "not-a-token"})
	wantCode(t, "ListVolumes with a bad token", err, codes.Aborted)
}

func TestController_ValidateVolumeCapabilities(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	id := tp.createVolume(ctx, "v").GetVolumeId()
	block := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: snw},
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
	}
	tests := []struct {
		name      string
		caps      []*csipb.VolumeCapability
		params    map[string]string
		confirmed bool
	}{
		{"mount, every mode", []*csipb.VolumeCapability{
			mountCap(snw), mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "ro"),
		}, nil, true},
		{"block", []*csipb.VolumeCapability{block}, nil, false},
		{"unknown flag", []*csipb.VolumeCapability{mountCap(snw, "sync")}, nil, false},
		{"other parameters", []*csipb.VolumeCapability{mountCap(snw)}, map[string]string{"a": "b"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tp.ctrl.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{
				VolumeId: id, VolumeCapabilities: tt.caps, Parameters: tt.params,
			})
			mustOK(t, "ValidateVolumeCapabilities", err)
			if got := resp.GetConfirmed() != nil; got != tt.confirmed {
				t.Errorf("confirmed %v (message %q), want %v", got, resp.GetMessage(), tt.confirmed)
			}
			if !tt.confirmed && resp.GetMessage() == "" {
				t.Error("unconfirmed without a message")
			}
		})
	}
	_, err := tp.ctrl.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{
		VolumeId: "fake-vol-id", VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw)},
	})
	wantCode(t, "unknown volume", err, codes.NotFound)
}

// TestController_CreateVolume_AfterCrash covers a plugin that died after
// making a volume's directory but before recording it: the retried
// CreateVolume hands out the same id with an empty directory.
func TestController_CreateVolume_AfterCrash(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	stateDir := filepath.Join(newTestDir(t), "state")
	first := startPlugin(t, csiplugin.Config{StateDir: stateDir, MountMode: csiplugin.MountModeSymlink})
	id := first.createVolume(ctx, "half-made").GetVolumeId()
	first.stop()
	// Forget the record, keep the directory with something in it.
	if err := os.WriteFile(filepath.Join(stateDir, "state.json"), []byte(`{"version": 1, "volumes": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(first.volumeDir(id), "stale"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	second := startPlugin(t, csiplugin.Config{StateDir: stateDir, MountMode: csiplugin.MountModeSymlink})
	if got := second.createVolume(ctx, "half-made").GetVolumeId(); got != id {
		t.Errorf("retried CreateVolume gave %s, want %s", got, id)
	}
	entries, err := os.ReadDir(second.volumeDir(id))
	if err != nil || len(entries) != 0 {
		t.Errorf("retried volume has %d entries, %v; want an empty directory", len(entries), err)
	}
}
