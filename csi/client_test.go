package csi

import (
	"context"
	"errors"
	"maps"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

func mountCap(flags ...string) *csipb.VolumeCapability {
	return VolumeCapability{
		AccessMode:     AccessModeSingleNodeWriter,
		AttachmentMode: AttachmentModeFileSystem,
		MountOptions:   &MountOptions{FSType: "ext4", MountFlags: flags},
	}.ToCSI()
}

// waitCalls waits until p has received n calls of method: a
// synchronisation point, not a timing assertion.
func waitCalls(t testing.TB, p *fakeplugin.Plugin, method string, n int) {
	t.Helper()
	ctx := testCtx(t)
	for p.Calls(method) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%s never called %d times", method, n)
		case <-time.After(time.Millisecond):
		}
	}
}

func TestClient_Probe_Readiness(t *testing.T) {
	tests := []struct {
		name string
		cfg  fakeplugin.Config
		want bool
	}{
		{"ready=true", fakeplugin.Config{}, true},
		{"ready=false", fakeplugin.Config{NotReady: true}, false},
		{"ready unset counts as ready", fakeplugin.Config{OmitReady: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := startPlugin(t, tt.cfg)
			got, err := c.Probe(testCtx(t))
			if err != nil || got != tt.want {
				t.Fatalf("Probe = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestClient_Probe_BecomesReady(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{NotReady: true})
	if ready, err := c.Probe(testCtx(t)); err != nil || ready {
		t.Fatalf("Probe = %v, %v; want not ready", ready, err)
	}
	p.SetReady(true)
	if ready, err := c.Probe(testCtx(t)); err != nil || !ready {
		t.Fatalf("Probe = %v, %v; want ready", ready, err)
	}
}

func TestClient_Fingerprint(t *testing.T) {
	_, c := startPlugin(t, fakeplugin.Config{
		Name: "csi.example.com", VendorVersion: "2.1.0", NodeID: "node-7", MaxVolumesPerNode: 16,
		Topology:          map[string]string{"zone": "z1"},
		ControllerPublish: true, CreateDelete: true, StageUnstage: true,
	})
	ctx := testCtx(t)
	info, err := c.PluginInfo(ctx)
	if err != nil || info.Name != "csi.example.com" || info.VendorVersion != "2.1.0" || info.Manifest["fake"] != "true" {
		t.Fatalf("PluginInfo = %+v, %v", info, err)
	}
	pc, err := c.PluginCapabilities(ctx)
	// A topology makes the fake announce VOLUME_ACCESSIBILITY_CONSTRAINTS.
	if err != nil || pc != (PluginCapabilities{ControllerService: true, VolumeAccessibilityConstraints: true}) {
		t.Fatalf("PluginCapabilities = %+v, %v", pc, err)
	}
	cc, err := c.ControllerCapabilities(ctx)
	if err != nil || cc != (ControllerCapabilities{CreateDeleteVolume: true, PublishUnpublishVolume: true}) {
		t.Fatalf("ControllerCapabilities = %+v, %v", cc, err)
	}
	nc, err := c.NodeCapabilities(ctx)
	if err != nil || nc != (NodeCapabilities{StageUnstageVolume: true}) {
		t.Fatalf("NodeCapabilities = %+v, %v", nc, err)
	}
	ni, err := c.NodeInfo(ctx)
	if err != nil || ni.NodeID != "node-7" || ni.MaxVolumesPerNode != 16 || !maps.Equal(ni.AccessibleTopology, map[string]string{"zone": "z1"}) {
		t.Fatalf("NodeInfo = %+v, %v", ni, err)
	}
}

func TestClient_ControllerCapabilities_NoControllerService(t *testing.T) {
	_, c := startPlugin(t, fakeplugin.Config{})
	_, err := c.ControllerCapabilities(testCtx(t))
	if Code(err) != codes.Unimplemented || Classify(PublishKind, err) != Final {
		t.Fatalf("ControllerCapabilities on a node-only plugin = %v", err)
	}
}

func TestClient_VolumeLifecycle(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{ControllerPublish: true, CreateDelete: true, StageUnstage: true})
	ctx := testCtx(t)
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")

	cv, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "data", VolumeCapabilities: []*csipb.VolumeCapability{mountCap()}})
	if err != nil {
		t.Fatalf("CreateVolume: %s", err)
	}
	id := cv.GetVolume().GetVolumeId()
	vv, err := c.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csipb.VolumeCapability{mountCap()}})
	if err != nil || vv.GetConfirmed() == nil {
		t.Fatalf("ValidateVolumeCapabilities = %v, %v", vv, err)
	}
	pub, err := c.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: fakeplugin.DefaultNodeID, VolumeCapability: mountCap()})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %s", err)
	}
	if err := c.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap(), PublishContext: pub.GetPublishContext()}); err != nil {
		t.Fatalf("NodeStageVolume: %s", err)
	}
	if err := c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(), PublishContext: pub.GetPublishContext()}); err != nil {
		t.Fatalf("NodePublishVolume: %s", err)
	}
	if p.Staged()[id] != staging || len(p.Published()[id]) != 1 || p.ControllerPublished()[id] != fakeplugin.DefaultNodeID {
		t.Fatalf("plugin state: staged %v published %v controller %v", p.Staged(), p.Published(), p.ControllerPublished())
	}
	if err := c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %s", err)
	}
	if err := c.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %s", err)
	}
	if err := c.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: fakeplugin.DefaultNodeID}); err != nil {
		t.Fatalf("ControllerUnpublishVolume: %s", err)
	}
	if err := c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %s", err)
	}
	if len(p.Volumes()) != 0 || len(p.Staged()) != 0 || len(p.Published()) != 0 || len(p.ControllerPublished()) != 0 {
		t.Fatal("plugin state not empty after teardown")
	}
}

func TestClient_ErrorWrapping_KeepsStatus(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{})
	p.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.NotFound, Message: "no such volume"})
	err := c.NodeUnpublishVolume(testCtx(t), &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "/t"})
	if err == nil || !strings.HasPrefix(err.Error(), "NodeUnpublishVolume: ") || !strings.Contains(err.Error(), "no such volume") {
		t.Fatalf("err = %v", err)
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.NotFound {
		t.Fatalf("status.FromError = %v, %v", st, ok)
	}
	if status.Code(err) != codes.NotFound || Code(err) != codes.NotFound {
		t.Fatalf("status.Code = %s, Code = %s", status.Code(err), Code(err))
	}
	var gs interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &gs) || gs.GRPCStatus().Message() != "no such volume" {
		t.Fatal("errors.As did not find the plugin's status")
	}
	if Classify(UnpublishKind, err) != Success {
		t.Fatal("NotFound on unpublish should classify as success")
	}
}

func TestClient_InvalidResponse_Garbage(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{CreateDelete: true})
	ctx := testCtx(t)
	tests := []struct {
		method string
		call   func() error
		want   string
	}{
		{"GetPluginInfo", func() error { _, err := c.PluginInfo(ctx); return err }, "GetPluginInfo: invalid response from the plugin: name is empty"},
		{"NodeGetInfo", func() error { _, err := c.NodeInfo(ctx); return err }, "NodeGetInfo: invalid response from the plugin: node_id is empty"},
		{"CreateVolume", func() error {
			_, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{mountCap()}})
			return err
		}, "CreateVolume: invalid response from the plugin: volume.volume_id is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			p.SetFault(tt.method, fakeplugin.Fault{Garbage: true, Times: 1})
			err := tt.call()
			if !errors.Is(err, ErrInvalidResponse) || err.Error() != tt.want {
				t.Fatalf("err = %v; want %q", err, tt.want)
			}
			if Classify(PublishKind, err) != Final {
				t.Fatal("an invalid response should be final")
			}
			if err := tt.call(); err != nil {
				t.Fatalf("call after the fault: %s", err)
			}
		})
	}
}

// rawNode is a bare CSI server that answers what the fake plugin never
// would: responses missing whole messages or with out-of-range values.
type rawNode struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedControllerServer
	csipb.UnimplementedNodeServer
}

func (rawNode) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: "raw"}, nil // no vendor_version
}

func (rawNode) CreateVolume(context.Context, *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	return &csipb.CreateVolumeResponse{}, nil // no volume
}

func (rawNode) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: "n", MaxVolumesPerNode: -1,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{"zone": "a"}}}, nil
}

func (rawNode) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil
}

func startRaw(t *testing.T) Client {
	t.Helper()
	path := fakeplugin.SocketPath(t)
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, rawNode{})
	csipb.RegisterControllerServer(srv, rawNode{})
	csipb.RegisterNodeServer(srv, rawNode{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	c, err := Dial(testCtx(t), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestClient_InvalidResponse_RawServer(t *testing.T) {
	c := startRaw(t)
	ctx := testCtx(t)
	if _, err := c.PluginInfo(ctx); !errors.Is(err, ErrInvalidResponse) || !strings.Contains(err.Error(), "vendor_version is empty") {
		t.Errorf("PluginInfo = %v", err)
	}
	if _, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "x"}); !errors.Is(err, ErrInvalidResponse) || !strings.Contains(err.Error(), "volume is missing") {
		t.Errorf("CreateVolume = %v", err)
	}
	if _, err := c.NodeInfo(ctx); !errors.Is(err, ErrInvalidResponse) || !strings.Contains(err.Error(), "max_volumes_per_node is negative (-1)") {
		t.Errorf("NodeInfo = %v", err)
	}
	// Capabilities with nothing in them are valid and empty.
	if _, err := c.NodeCapabilities(ctx); Code(err) != codes.Unimplemented {
		t.Errorf("NodeCapabilities = %v, want Unimplemented", err)
	}
}

func TestClient_RPCTimeout_HangIsUncertain(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{StageUnstage: true}, WithRPCTimeout(50*time.Millisecond))
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Hang: true})
	p.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Hang: true})
	ctx := testCtx(t)

	err := c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", VolumeCapability: mountCap()})
	if Code(err) != codes.DeadlineExceeded || Classify(PublishKind, err) != Uncertain {
		t.Fatalf("hanging NodePublishVolume = %v (%s); want DeadlineExceeded, uncertain", err, Classify(PublishKind, err))
	}
	err = c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "/t"})
	if Code(err) != codes.DeadlineExceeded || Classify(UnpublishKind, err) != Retry {
		t.Fatalf("hanging NodeUnpublishVolume = %v; want DeadlineExceeded, retry", err)
	}
	if len(p.Published()) != 0 {
		t.Fatal("a hung call took effect")
	}
}

func TestClient_ProbeTimeout_AppliesToProbeOnly(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{}, WithProbeTimeout(30*time.Millisecond))
	p.SetFault("Probe", fakeplugin.Fault{Hang: true})
	if _, err := c.Probe(testCtx(t)); Code(err) != codes.DeadlineExceeded {
		t.Fatalf("hanging Probe = %v; want DeadlineExceeded from the probe timeout", err)
	}
	// The caller's own shorter deadline wins too.
	p.SetFault("GetPluginInfo", fakeplugin.Fault{Hang: true})
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Millisecond)
	defer cancel()
	if _, err := c.PluginInfo(ctx); Code(err) != codes.DeadlineExceeded {
		t.Fatalf("hanging GetPluginInfo = %v; want DeadlineExceeded from ctx", err)
	}
}

func TestClient_PluginKilledMidCall_Unavailable(t *testing.T) {
	tests := []struct {
		method string
		kind   RPCKind
		want   Outcome
		call   func(Client) error
	}{
		{"NodeStageVolume", PublishKind, Uncertain, func(c Client) error {
			return c.NodeStageVolume(context.Background(), &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap()})
		}},
		{"NodeUnstageVolume", UnpublishKind, Retry, func(c Client) error {
			return c.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			p, c := startPlugin(t, fakeplugin.Config{StageUnstage: true})
			p.SetFault(tt.method, fakeplugin.Fault{Hang: true})
			errc := make(chan error, 1)
			go func() { errc <- tt.call(c) }()
			waitCalls(t, p, tt.method, 1)
			p.Kill()
			err := <-errc
			if Code(err) != codes.Unavailable || Classify(tt.kind, err) != tt.want {
				t.Fatalf("call cut by Kill = %v (%s); want Unavailable, %s", err, Classify(tt.kind, err), tt.want)
			}
		})
	}
}

func TestClient_CallObserver_SeesEveryEnd(t *testing.T) {
	var mu sync.Mutex
	var ends []CallEnd
	p, c := startPlugin(t, fakeplugin.Config{}, WithRPCTimeout(50*time.Millisecond), WithCallObserver(func(e CallEnd) {
		mu.Lock()
		defer mu.Unlock()
		ends = append(ends, e)
	}))
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Hang: true})
	p.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Internal})
	ctx := testCtx(t)
	if _, err := c.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", VolumeCapability: mountCap()})
	_ = c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "/t"})
	req, resp := &csipb.NodeGetInfoRequest{}, &csipb.NodeGetInfoResponse{}
	_ = c.Invoke(ctx, "/csi.v1.Node/NodeGetInfo", req, resp)

	want := []struct {
		method  string
		service Service
		code    codes.Code
	}{
		{"Probe", ServiceIdentity, codes.OK},
		{"NodePublishVolume", ServiceNode, codes.DeadlineExceeded},
		{"NodeUnpublishVolume", ServiceNode, codes.Internal},
		{"NodeGetInfo", ServiceNode, codes.OK},
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != len(want) {
		t.Fatalf("observed %d ends, want %d: %+v", len(ends), len(want), ends)
	}
	for i, w := range want {
		if e := ends[i]; e.Method != w.method || e.Service != w.service || Code(e.Err) != w.code {
			t.Errorf("end %d = %s %s %s, want %s %s %s", i, e.Service, e.Method, Code(e.Err), w.service, w.method, w.code)
		}
	}
}
