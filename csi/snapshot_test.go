package csi_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
)

// TestClient_Snapshots sends the snapshot RPCs to the example plugin over
// a real unix socket: create (idempotent by name), list, restore through
// CreateVolume, delete; and classifies its refusals.
func TestClient_Snapshots(t *testing.T) {
	dir, err := os.MkdirTemp("", "csisnap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	p, err := csiplugin.New(csiplugin.Config{StateDir: filepath.Join(dir, "state"), NodeID: "n1",
		MountMode: csiplugin.MountModeSymlink, Logger: logrus.NewEntry(quiet)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Serve(l) }()
	t.Cleanup(func() { p.Stop(); <-done })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := csi.Dial(ctx, "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caps, err := c.ControllerCapabilities(ctx)
	if err != nil || !caps.CreateDeleteSnapshot || !caps.ListSnapshots || !caps.CloneVolume {
		t.Fatalf("ControllerCapabilities = %+v, %v", caps, err)
	}
	vc := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	vol, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csipb.VolumeCapability{vc}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "s", SourceVolumeId: vol.GetVolume().GetVolumeId()})
	if err != nil || !snap.GetSnapshot().GetReadyToUse() {
		t.Fatalf("CreateSnapshot = %v, %v", snap, err)
	}
	list, err := c.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{SourceVolumeId: vol.GetVolume().GetVolumeId()})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots = %v, %v", list, err)
	}
	_, err = c.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "s2", SourceVolumeId: "vol-00000000000000000000000000000000"})
	if csi.Code(err) != codes.NotFound || csi.Classify(csi.PublishKind, err) != csi.Final {
		t.Errorf("snapshot of an unknown volume = %v", err)
	}
	_, err = c.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{StartingToken: "garbage"})
	if csi.Code(err) != codes.Aborted || !csi.Classify(csi.PublishKind, err).Retryable() {
		t.Errorf("ListSnapshots with a foreign token = %v", err)
	}
	if err := c.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	// Already gone: success, as the spec says.
	if err := c.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); csi.Classify(csi.UnpublishKind, err) != csi.Success {
		t.Errorf("second DeleteSnapshot = %v", err)
	}
}
