package csiplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/examples/csiplugin"
)

// TestSnapshot_RestoreAndClone: data written before a snapshot is in the
// volume restored from it and in a clone; data written after is in
// neither; the copies are independent of their source.
func TestSnapshot_RestoreAndClone(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	src := tp.createVolume(ctx, "src")
	write := func(id, name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(tp.volumeDir(id), "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tp.volumeDir(id), "sub", name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(id, name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(tp.volumeDir(id), "sub", name))
		if err != nil {
			return ""
		}
		return string(b)
	}
	write(src.GetVolumeId(), "before", "hello")
	snap, err := tp.ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "s1", SourceVolumeId: src.GetVolumeId()})
	mustOK(t, "CreateSnapshot", err)
	again, err := tp.ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "s1", SourceVolumeId: src.GetVolumeId()})
	mustOK(t, "CreateSnapshot again", err)
	if again.GetSnapshot().GetSnapshotId() != snap.GetSnapshot().GetSnapshotId() || !snap.GetSnapshot().GetReadyToUse() {
		t.Errorf("snapshots %v, %v", snap, again)
	}
	write(src.GetVolumeId(), "after", "later")

	create := func(name string, cs *csipb.VolumeContentSource) string {
		t.Helper()
		resp, err := tp.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw)}, VolumeContentSource: cs})
		mustOK(t, "CreateVolume "+name, err)
		return resp.GetVolume().GetVolumeId()
	}
	restored := create("restored", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
		Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}})
	clone := create("clone", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
		Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}})
	if read(restored, "before") != "hello" || read(restored, "after") != "" {
		t.Errorf("restored volume: before %q, after %q; want hello and nothing", read(restored, "before"), read(restored, "after"))
	}
	if read(clone, "before") != "hello" || read(clone, "after") != "later" {
		t.Errorf("clone: before %q, after %q", read(clone, "before"), read(clone, "after"))
	}
	write(clone, "before", "changed")
	if read(src.GetVolumeId(), "before") != "hello" {
		t.Error("writing the clone changed its source")
	}

	_, err = tp.ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "s1", SourceVolumeId: clone})
	wantCode(t, "same snapshot name of another volume", err, codes.AlreadyExists)
	_, err = tp.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw)},
		VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
			Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: "snap-nope"}}}})
	wantCode(t, "restore of an unknown snapshot", err, codes.NotFound)

	_, err = tp.ctrl.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	mustOK(t, "DeleteSnapshot", err)
	list, err := tp.ctrl.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{})
	mustOK(t, "ListSnapshots", err)
	if len(list.GetEntries()) != 0 {
		t.Errorf("snapshots after delete: %v", list.GetEntries())
	}
	if read(restored, "before") != "hello" {
		t.Error("deleting the snapshot changed the volume restored from it")
	}
}
