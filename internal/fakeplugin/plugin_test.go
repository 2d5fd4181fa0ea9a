package fakeplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

type clients struct {
	id   csipb.IdentityClient
	ctrl csipb.ControllerClient
	node csipb.NodeClient
}

// dial connects a bare gRPC client, independent of package csi.
func dial(t *testing.T, endpoint string) clients {
	t.Helper()
	cc, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %s", err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return clients{csipb.NewIdentityClient(cc), csipb.NewControllerClient(cc), csipb.NewNodeClient(cc)}
}

func mountCap() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
	}
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code %s, want %s (err: %v)", what, got, want, err)
	}
}

func TestPlugin_Lifecycle_FullClaim(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, CreateDelete: true})
	c := dial(t, ep)
	ctx := context.Background()
	dir := t.TempDir()
	staging := filepath.Join(dir, "staging")
	target := filepath.Join(dir, "alloc", "target")

	cv, err := c.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "v1", VolumeCapabilities: []*csipb.VolumeCapability{mountCap()}})
	wantCode(t, "CreateVolume", err, codes.OK)
	id := cv.GetVolume().GetVolumeId()
	if id == "" || cv.GetVolume().GetCapacityBytes() != fakeplugin.DefaultCapacity {
		t.Fatalf("CreateVolume = %v", cv)
	}
	again, err := c.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "v1", VolumeCapabilities: []*csipb.VolumeCapability{mountCap()}})
	wantCode(t, "CreateVolume again", err, codes.OK)
	if again.GetVolume().GetVolumeId() != id {
		t.Fatalf("CreateVolume is not idempotent: %q then %q", id, again.GetVolume().GetVolumeId())
	}

	// Node RPCs need the publish context first.
	_, err = c.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap()})
	wantCode(t, "NodeStageVolume before ControllerPublishVolume", err, codes.FailedPrecondition)

	pub, err := c.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: fakeplugin.DefaultNodeID, VolumeCapability: mountCap()})
	wantCode(t, "ControllerPublishVolume", err, codes.OK)
	_, err = c.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "other-node", VolumeCapability: mountCap()})
	wantCode(t, "ControllerPublishVolume to another node", err, codes.FailedPrecondition)

	stageReq := &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap(), PublishContext: pub.GetPublishContext()}
	for range 2 { // idempotent
		_, err = c.node.NodeStageVolume(ctx, stageReq)
		wantCode(t, "NodeStageVolume", err, codes.OK)
	}
	pubReq := &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(), PublishContext: pub.GetPublishContext()}
	for range 2 { // idempotent
		_, err = c.node.NodePublishVolume(ctx, pubReq)
		wantCode(t, "NodePublishVolume", err, codes.OK)
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() {
		t.Fatalf("target path not created as a directory: %v", err)
	}
	ro := &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(), PublishContext: pub.GetPublishContext(), Readonly: true}
	_, err = c.node.NodePublishVolume(ctx, ro)
	wantCode(t, "NodePublishVolume with another readonly flag", err, codes.AlreadyExists)

	if got := p.ControllerPublished(); got[id] != fakeplugin.DefaultNodeID || len(got) != 1 {
		t.Fatalf("ControllerPublished = %v", got)
	}
	if got := p.Staged(); got[id] != staging || len(got) != 1 {
		t.Fatalf("Staged = %v", got)
	}
	if got := p.Published(); !slices.Equal(got[id], []string{target}) || len(got) != 1 {
		t.Fatalf("Published = %v", got)
	}

	// Teardown out of order is refused, in order it works, twice is fine.
	_, err = c.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, "NodeUnstageVolume while published", err, codes.FailedPrecondition)
	_, err = c.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: fakeplugin.DefaultNodeID})
	wantCode(t, "ControllerUnpublishVolume while published", err, codes.FailedPrecondition)
	_, err = c.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "DeleteVolume while controller-published", err, codes.FailedPrecondition)
	for range 2 {
		_, err = c.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		wantCode(t, "NodeUnpublishVolume", err, codes.OK)
		_, err = c.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		wantCode(t, "NodeUnstageVolume", err, codes.OK)
		_, err = c.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: fakeplugin.DefaultNodeID})
		wantCode(t, "ControllerUnpublishVolume", err, codes.OK)
		_, err = c.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
		wantCode(t, "DeleteVolume", err, codes.OK)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("target path still there after NodeUnpublishVolume: %v", err)
	}
	if len(p.Staged())+len(p.Published())+len(p.ControllerPublished())+len(p.Volumes()) != 0 {
		t.Fatalf("state left: staged %v published %v controller %v volumes %v", p.Staged(), p.Published(), p.ControllerPublished(), p.Volumes())
	}
	if got := p.Calls("NodeStageVolume"); got != 3 {
		t.Fatalf("Calls(NodeStageVolume) = %d, want 3", got)
	}
	h := p.History()
	if i, j := slices.Index(h, "ControllerPublishVolume"), slices.Index(h, "NodePublishVolume"); i < 0 || j < i {
		t.Fatalf("History = %v", h)
	}
}

func TestPlugin_Capabilities_FromConfig(t *testing.T) {
	tests := []struct {
		name                   string
		cfg                    fakeplugin.Config
		wantCtrlSvc, wantStage bool
		wantCtrlCaps           int
	}{
		{"node only", fakeplugin.Config{}, false, false, -1},
		{"node with stage", fakeplugin.Config{StageUnstage: true}, false, true, -1},
		{"controller without caps", fakeplugin.Config{Controller: true}, true, false, 0},
		{"publish implies controller", fakeplugin.Config{ControllerPublish: true}, true, false, 1},
		{"everything", fakeplugin.Config{ControllerPublish: true, CreateDelete: true, StageUnstage: true}, true, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ep := fakeplugin.Start(t, tt.cfg)
			c := dial(t, ep)
			ctx := context.Background()
			pc, err := c.id.GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
			wantCode(t, "GetPluginCapabilities", err, codes.OK)
			if got := len(pc.GetCapabilities()) == 1; got != tt.wantCtrlSvc {
				t.Errorf("CONTROLLER_SERVICE = %v, want %v", got, tt.wantCtrlSvc)
			}
			nc, err := c.node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
			wantCode(t, "NodeGetCapabilities", err, codes.OK)
			if got := len(nc.GetCapabilities()) == 1; got != tt.wantStage {
				t.Errorf("STAGE_UNSTAGE = %v, want %v", got, tt.wantStage)
			}
			cc, err := c.ctrl.ControllerGetCapabilities(ctx, &csipb.ControllerGetCapabilitiesRequest{})
			if tt.wantCtrlCaps < 0 {
				wantCode(t, "ControllerGetCapabilities without controller", err, codes.Unimplemented)
				return
			}
			wantCode(t, "ControllerGetCapabilities", err, codes.OK)
			if got := len(cc.GetCapabilities()); got != tt.wantCtrlCaps {
				t.Errorf("controller capabilities = %d, want %d", got, tt.wantCtrlCaps)
			}
		})
	}
}

func TestPlugin_SetFault_Times(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	p.SetFault("NodeGetInfo", fakeplugin.Fault{Code: codes.Unavailable, Message: "busy", Times: 2})
	for i, want := range []codes.Code{codes.Unavailable, codes.Unavailable, codes.OK, codes.OK} {
		_, err := c.node.NodeGetInfo(context.Background(), &csipb.NodeGetInfoRequest{})
		if got := status.Code(err); got != want {
			t.Fatalf("call %d: code %s, want %s", i, got, want)
		}
	}
	if got := p.Calls("NodeGetInfo"); got != 4 {
		t.Fatalf("Calls = %d, want 4", got)
	}
}

func TestPlugin_SetFault_AfterApply(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	target := filepath.Join(t.TempDir(), "t")
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.DeadlineExceeded, AfterApply: true, Times: 1})
	_, err := c.node.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target, VolumeCapability: mountCap()})
	wantCode(t, "NodePublishVolume", err, codes.DeadlineExceeded)
	if got := p.Published()["v"]; !slices.Equal(got, []string{target}) {
		t.Fatalf("Published[v] = %v, want the target despite the error", got)
	}
}

func TestPlugin_SetFault_Garbage(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	p.SetFault("GetPluginInfo", fakeplugin.Fault{Garbage: true})
	info, err := c.id.GetPluginInfo(context.Background(), &csipb.GetPluginInfoRequest{})
	wantCode(t, "GetPluginInfo", err, codes.OK)
	if info.GetName() != "" || info.GetVendorVersion() != fakeplugin.DefaultVendorVersion {
		t.Fatalf("GetPluginInfo = %v, want an empty name only", info)
	}
	p.ClearFaults()
	info, err = c.id.GetPluginInfo(context.Background(), &csipb.GetPluginInfoRequest{})
	wantCode(t, "GetPluginInfo", err, codes.OK)
	if info.GetName() != fakeplugin.DefaultName {
		t.Fatalf("after ClearFaults: name %q", info.GetName())
	}
}

// TestPlugin_SetHangs_OneVolume: "Method@volume" hangs that method's
// calls on that volume only, until the caller gives up; the same method
// on another volume answers, and a bare "Method" hangs every call.
func TestPlugin_SetHangs_OneVolume(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	p.SetHangs("NodePublishVolume@slow NodeGetVolumeStats")
	publish := func(vol string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
			VolumeId: vol, TargetPath: filepath.Join(t.TempDir(), vol), VolumeCapability: mountCap()})
		return err
	}
	wantCode(t, "NodePublishVolume on the slow volume", publish("slow"), codes.DeadlineExceeded)
	wantCode(t, "NodePublishVolume on another volume", publish("fast"), codes.OK)
	if got := p.Published(); len(got["slow"]) != 0 || len(got["fast"]) != 1 {
		t.Fatalf("Published = %v, want fast only", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "fast", VolumePath: "/unused"})
	wantCode(t, "NodeGetVolumeStats (every call hangs)", err, codes.DeadlineExceeded)
}

func TestPlugin_SetFault_UnknownMethodPanics(t *testing.T) {
	p := fakeplugin.New(fakeplugin.Config{})
	defer func() {
		if recover() == nil {
			t.Fatal("SetFault with a typo did not panic")
		}
	}()
	p.SetFault("NodePublish", fakeplugin.Fault{Code: codes.Internal})
}

func TestPlugin_Stop_ReleasesHang(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	p.SetFault("Probe", fakeplugin.Fault{Hang: true})
	errc := make(chan error, 1)
	go func() {
		_, err := c.id.Probe(context.Background(), &csipb.ProbeRequest{})
		errc <- err
	}()
	waitCalls(t, p, "Probe", 1)
	p.Stop()
	wantCode(t, "hanging Probe after Stop", <-errc, codes.Unavailable)
	if _, err := os.Stat(p.SocketPath()); !os.IsNotExist(err) {
		t.Fatalf("socket file after Stop: %v", err)
	}
	p.Stop() // idempotent
}

func TestPlugin_Kill_RestartKeepsState(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	target := filepath.Join(t.TempDir(), "t")
	_, err := c.node.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target, VolumeCapability: mountCap()})
	wantCode(t, "NodePublishVolume", err, codes.OK)

	p.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Hang: true, Times: 1})
	errc := make(chan error, 1)
	go func() {
		_, err := c.node.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
		errc <- err
	}()
	waitCalls(t, p, "NodeUnpublishVolume", 1)
	p.Kill()
	wantCode(t, "call in flight during Kill", <-errc, codes.Unavailable)
	if fi, err := os.Stat(p.SocketPath()); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("Kill should leave the socket file behind: %v", err)
	}
	p.Kill() // idempotent

	if err := p.Serve(p.SocketPath()); err != nil {
		t.Fatalf("Serve after Kill: %s", err)
	}
	if err := p.Serve(p.SocketPath()); err == nil {
		t.Fatal("second Serve while serving succeeded")
	}
	if got := p.Published()["v"]; !slices.Equal(got, []string{target}) {
		t.Fatalf("state lost over restart: %v", got)
	}
	_, err = c.node.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
	wantCode(t, "NodeUnpublishVolume after restart", err, codes.OK)
}

func TestPlugin_StrictVolumes_NotFound(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{StrictVolumes: true})
	c := dial(t, ep)
	ctx := context.Background()
	target := filepath.Join(t.TempDir(), "t")
	_, err := c.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target, VolumeCapability: mountCap()})
	wantCode(t, "NodePublishVolume unknown volume", err, codes.NotFound)
	_, err = c.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
	wantCode(t, "NodeUnpublishVolume unknown volume", err, codes.NotFound)
	p.AddVolume(fakeplugin.Volume{ID: "v"})
	_, err = c.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target, VolumeCapability: mountCap()})
	wantCode(t, "NodePublishVolume added volume", err, codes.OK)
}

func TestPlugin_NodePublishVolume_InvalidArgument(t *testing.T) {
	_, ep := fakeplugin.Start(t, fakeplugin.Config{})
	c := dial(t, ep)
	target := filepath.Join(t.TempDir(), "t")
	tests := []struct {
		name string
		req  *csipb.NodePublishVolumeRequest
	}{
		{"no volume id", &csipb.NodePublishVolumeRequest{TargetPath: target, VolumeCapability: mountCap()}},
		{"no target", &csipb.NodePublishVolumeRequest{VolumeId: "v", VolumeCapability: mountCap()}},
		{"no capability", &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target}},
		{"no access type", &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target, VolumeCapability: &csipb.VolumeCapability{
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.node.NodePublishVolume(context.Background(), tt.req)
			wantCode(t, "NodePublishVolume", err, codes.InvalidArgument)
		})
	}
}

func TestPlugin_Probe_Readiness(t *testing.T) {
	tests := []struct {
		name string
		cfg  fakeplugin.Config
		want string
	}{
		{"ready", fakeplugin.Config{}, "true"},
		{"not ready", fakeplugin.Config{NotReady: true}, "false"},
		{"unset", fakeplugin.Config{OmitReady: true}, "unset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ep := fakeplugin.Start(t, tt.cfg)
			c := dial(t, ep)
			resp, err := c.id.Probe(context.Background(), &csipb.ProbeRequest{})
			wantCode(t, "Probe", err, codes.OK)
			got := "unset"
			if r := resp.GetReady(); r != nil {
				got = map[bool]string{true: "true", false: "false"}[r.GetValue()]
			}
			if got != tt.want {
				t.Fatalf("ready = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestPlugin_Concurrent_RaceClean(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{StageUnstage: true})
	c := dial(t, ep)
	dir := t.TempDir()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := "v" + string(rune('a'+i))
			staging := filepath.Join(dir, id+"-staging")
			for range 20 {
				_, _ = c.node.NodeStageVolume(context.Background(), &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap()})
				_ = p.Staged()
				_, _ = c.node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			}
		})
	}
	wg.Wait()
	if got := p.Calls("NodeStageVolume"); got != 160 {
		t.Fatalf("Calls(NodeStageVolume) = %d, want 160", got)
	}
	if len(p.Staged()) != 0 {
		t.Fatalf("Staged = %v", p.Staged())
	}
}

// waitCalls waits until the plugin has received n calls of method; it is a
// synchronisation point, not a timing assertion.
func waitCalls(t *testing.T, p *fakeplugin.Plugin, method string, n int) {
	t.Helper()
	for p.Calls(method) < n {
		time.Sleep(time.Millisecond)
	}
}

func TestPlugin_Capabilities_LackingIsUnimplemented(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{Controller: true})
	c := dial(t, ep)
	ctx := context.Background()
	tests := []struct {
		method, capability string
		call               func() error
	}{
		{"CreateVolume", "CREATE_DELETE_VOLUME", func() error {
			_, err := c.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csipb.VolumeCapability{mountCap()}})
			return err
		}},
		{"DeleteVolume", "CREATE_DELETE_VOLUME", func() error {
			_, err := c.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: "v"})
			return err
		}},
		{"ControllerPublishVolume", "PUBLISH_UNPUBLISH_VOLUME", func() error {
			_, err := c.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: fakeplugin.DefaultNodeID, VolumeCapability: mountCap()})
			return err
		}},
		{"ControllerUnpublishVolume", "PUBLISH_UNPUBLISH_VOLUME", func() error {
			_, err := c.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: "v"})
			return err
		}},
		{"NodeStageVolume", "STAGE_UNSTAGE_VOLUME", func() error {
			_, err := c.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: t.TempDir(), VolumeCapability: mountCap()})
			return err
		}},
		{"NodeUnstageVolume", "STAGE_UNSTAGE_VOLUME", func() error {
			_, err := c.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: t.TempDir()})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			err := tt.call()
			wantCode(t, tt.method, err, codes.Unimplemented)
			if want := tt.method + ": no " + tt.capability + " capability"; status.Convert(err).Message() != want {
				t.Errorf("message %q, want %q", status.Convert(err).Message(), want)
			}
			if got := p.Calls(tt.method); got != 1 {
				t.Errorf("Calls(%s) = %d, want 1: a refused call still counts", tt.method, got)
			}
		})
	}
	if len(p.Volumes())+len(p.ControllerPublished())+len(p.Staged()) != 0 {
		t.Errorf("refused calls changed state: volumes %v controller %v staged %v", p.Volumes(), p.ControllerPublished(), p.Staged())
	}
}
