package csiplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/examples/csiplugin"
)

// startShared serves two instances (node-a, node-b) sharing one dir, each
// with its own state dir, in mode.
func startShared(t *testing.T, mode csiplugin.MountMode) (a, b *testPlugin, shared string) {
	t.Helper()
	base := newTestDir(t)
	shared = filepath.Join(base, "shared")
	a = startPlugin(t, csiplugin.Config{StateDir: filepath.Join(base, "a"), SharedDir: shared, NodeID: "node-a", MountMode: mode})
	b = startPlugin(t, csiplugin.Config{StateDir: filepath.Join(base, "b"), SharedDir: shared, NodeID: "node-b", MountMode: mode})
	return a, b, shared
}

// TestShared_VolumesAndPublications: two instances sharing a dir see the
// same volumes; either controller publishes to either node; a
// single-node volume published to one node is FailedPrecondition for the
// other until it is unpublished (as fencing does, from the other
// instance); a multi-node volume goes to both.
func TestShared_VolumesAndPublications(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	a, b, shared := startShared(t, csiplugin.MountModeSymlink)
	vol := a.createVolume(ctx, "disk")
	id := vol.GetVolumeId()
	if _, err := os.Stat(filepath.Join(shared, "volumes", id)); err != nil {
		t.Fatalf("volume directory not in the shared dir: %v", err)
	}
	list, err := b.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	mustOK(t, "ListVolumes on b", err)
	if len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Fatalf("b lists %v, want the volume a created", list.GetEntries())
	}
	// The same name through b is the same volume.
	if again := b.createVolume(ctx, "disk"); again.GetVolumeId() != id {
		t.Fatalf("CreateVolume through b = %s, want %s", again.GetVolumeId(), id)
	}

	publish := func(via *testPlugin, node string, mode csipb.VolumeCapability_AccessMode_Mode) error {
		_, err := via.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
			VolumeId: id, NodeId: node, VolumeCapability: mountCap(mode),
		})
		return err
	}
	unpublish := func(via *testPlugin, node string) {
		t.Helper()
		_, err := via.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
		mustOK(t, "ControllerUnpublishVolume", err)
	}
	mustOK(t, "publish to node-a through b", publish(b, "node-a", snw))
	wantCode(t, "publish to node-b while node-a has it", publish(a, "node-b", snw), codes.FailedPrecondition)
	wantCode(t, "publish to an unknown node", publish(a, "node-c", snw), codes.NotFound)
	// node-a is gone; node-b's controller takes its publication away.
	unpublish(b, "node-a")
	mustOK(t, "publish to node-b after node-a's unpublish", publish(a, "node-b", snw))
	// b's node can stage it (the publication is in the shared state).
	staging := filepath.Join(newTestDir(t), "staging")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	_, err = b.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap(snw)})
	mustOK(t, "NodeStageVolume on b", err)
	_, err = a.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging + "-a", VolumeCapability: mountCap(snw)})
	wantCode(t, "NodeStageVolume on a (not published to node-a)", err, codes.FailedPrecondition)
	// In use on b: deleting it through a is refused.
	_, err = a.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "DeleteVolume through a while b stages it", err, codes.FailedPrecondition)
	_, err = b.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	mustOK(t, "NodeUnstageVolume", err)
	unpublish(a, "node-b")

	// A multi-node volume is published to both nodes.
	mustOK(t, "multi-node publish to node-a", publish(a, "node-a", csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER))
	mustOK(t, "multi-node publish to node-b", publish(b, "node-b", csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER))
	unpublish(a, "")
	_, err = b.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	mustOK(t, "DeleteVolume through b", err)
	list, err = a.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	mustOK(t, "ListVolumes on a", err)
	if len(list.GetEntries()) != 0 {
		t.Fatalf("a still lists %v", list.GetEntries())
	}
}

// TestShared_ConcurrentChanges: many creates through both instances at
// once are all kept (the shared lock serializes their read-modify-write
// of the state file), and a restarted instance finds them.
func TestShared_ConcurrentChanges(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	a, b, _ := startShared(t, csiplugin.MountModeSymlink)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := a
			if i%2 == 1 {
				via = b
			}
			_, err := via.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
				Name: fmt.Sprintf("v%d", i), VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw)},
			})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		mustOK(t, "CreateVolume", err)
	}
	for _, tp := range []*testPlugin{a, b} {
		list, err := tp.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
		mustOK(t, "ListVolumes", err)
		if got := len(list.GetEntries()); got != n {
			t.Fatalf("%s lists %d volumes, want %d", tp.cfg.NodeID, got, n)
		}
	}
	cfg := b.cfg
	b.stop()
	cfg.Logger = nil
	c := startPlugin(t, cfg)
	list, err := c.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	mustOK(t, "ListVolumes after a restart", err)
	if got := len(list.GetEntries()); got != n {
		t.Fatalf("restarted instance lists %d volumes, want %d", got, n)
	}
}

// TestShared_Config: a shared dir that is the state dir, or with
// lose-mounts-on-start, is refused; two instances with one state dir are
// refused even when they share a dir.
func TestShared_Config(t *testing.T) {
	checkLeaks(t)
	base := newTestDir(t)
	state := filepath.Join(base, "state")
	for _, cfg := range []csiplugin.Config{
		{StateDir: state, SharedDir: state + "/"},
		{StateDir: state, SharedDir: filepath.Join(base, "shared"), LoseMountsOnStart: true},
	} {
		if err := cfg.Validate(); !errors.Is(err, csiplugin.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	startPlugin(t, csiplugin.Config{StateDir: state, SharedDir: filepath.Join(base, "shared"), MountMode: csiplugin.MountModeSymlink})
	p, err := csiplugin.New(csiplugin.Config{StateDir: state, SharedDir: filepath.Join(base, "shared"), MountMode: csiplugin.MountModeSymlink})
	if !errors.Is(err, csiplugin.ErrStateDirLocked) {
		if p != nil {
			p.Stop()
		}
		t.Fatalf("second instance on one state dir = %v, want ErrStateDirLocked", err)
	}
}
