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

func usageOf(t *testing.T, a attachedVolume) (bytes, inodes *csipb.VolumeUsage) {
	t.Helper()
	resp, err := a.node.NodeGetVolumeStats(context.Background(), &csipb.NodeGetVolumeStatsRequest{VolumeId: a.id, VolumePath: a.target})
	mustOK(t, "NodeGetVolumeStats", err)
	for _, u := range resp.GetUsage() {
		switch u.GetUnit() {
		case csipb.VolumeUsage_BYTES:
			bytes = u
		case csipb.VolumeUsage_INODES:
			inodes = u
		}
	}
	if bytes == nil || inodes == nil {
		t.Fatalf("usage %v, want bytes and inodes", resp.GetUsage())
	}
	return bytes, inodes
}

// TestNode_GetVolumeStats_CountsTheVolume: a file of known size written
// through the target shows in the used bytes and inodes, against the
// volume's own capacity, in both mount modes.
func TestNode_GetVolumeStats_CountsTheVolume(t *testing.T) {
	for _, mode := range []csiplugin.MountMode{csiplugin.MountModeBind, csiplugin.MountModeSymlink} {
		t.Run(string(mode), func(t *testing.T) {
			a := startAttached(t, mode, "stats-"+string(mode), false)
			b0, i0 := usageOf(t, a)
			if b0.GetTotal() != 1<<20 || b0.GetUsed()+b0.GetAvailable() > 1<<20 {
				t.Errorf("bytes before = %v, want the 1 MiB capacity", b0)
			}
			const size = 256 << 10
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i) | 1 // no holes
			}
			if err := os.WriteFile(filepath.Join(a.target, "blob"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			b1, i1 := usageOf(t, a)
			if grew := b1.GetUsed() - b0.GetUsed(); grew < size || grew > size+64<<10 {
				t.Errorf("used bytes grew by %d after writing %d bytes (before %v, after %v)", grew, size, b0, b1)
			}
			if b1.GetAvailable() != b1.GetTotal()-b1.GetUsed() {
				t.Errorf("available %d, want capacity %d less used %d", b1.GetAvailable(), b1.GetTotal(), b1.GetUsed())
			}
			if i1.GetUsed() != i0.GetUsed()+1 || i1.GetTotal() <= 0 {
				t.Errorf("inodes used %d → %d (total %d), want one more", i0.GetUsed(), i1.GetUsed(), i1.GetTotal())
			}
			a.detach(context.Background(), a.id, a.staging, a.target)
		})
	}
}

// TestNode_GetVolumeHealth_ConditionFile: a file in StateDir/conditions
// flips the volume to abnormal; removing it makes it normal again; a
// missing volume directory is inaccessible.
func TestNode_GetVolumeHealth_ConditionFile(t *testing.T) {
	a := startAttached(t, csiplugin.MountModeSymlink, "health", false)
	ctx := context.Background()
	health := func() []*csipb.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		resp, err := a.node.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: a.id, VolumePublishPath: a.target})
		mustOK(t, "NodeGetVolumeHealth", err)
		if resp.GetVolumeHealth().GetVolumeId() != a.id {
			t.Fatalf("health of %q, want %q", resp.GetVolumeHealth().GetVolumeId(), a.id)
		}
		return resp.GetVolumeHealth().GetHealthStatuses()
	}
	if h := health(); len(h) != 0 {
		t.Errorf("a fresh volume reports %v", h)
	}
	flag := filepath.Join(a.cfg.StateDir, csiplugin.ConditionsDir, a.id)
	if fi, err := os.Stat(filepath.Dir(flag)); err != nil || !fi.IsDir() {
		t.Fatalf("the plugin did not create its conditions directory: %v", err)
	}
	if err := os.WriteFile(flag, []byte("  disk reports bad sectors  \nmore detail\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := health()
	if len(h) != 1 || h[0].GetStatus() != csipb.VolumeHealthErrorType_DEGRADED || h[0].GetReason() != "OperatorFlagged" || h[0].GetMessage() != "disk reports bad sectors" {
		t.Errorf("flagged volume reports %v", h)
	}
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	if h := health(); len(h) != 0 {
		t.Errorf("unflagged volume reports %v", h)
	}
	a.detach(ctx, a.id, a.staging, a.target)
	if err := os.RemoveAll(a.volumeDir(a.id)); err != nil {
		t.Fatal(err)
	}
	if h := health(); len(h) != 1 || h[0].GetStatus() != csipb.VolumeHealthErrorType_INACCESSIBLE {
		t.Errorf("volume without its directory reports %v", h)
	}
}

// TestNode_NoVolumeStats: with NoVolumeStats the node announces neither
// GET_VOLUME_STATS nor GET_VOLUME_HEALTH, and both RPCs are Unimplemented.
func TestNode_NoVolumeStats(t *testing.T) {
	a := startAttachedWith(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink, NoVolumeStats: true}, "nostats", false)
	ctx := context.Background()
	caps, err := a.node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	mustOK(t, "NodeGetCapabilities", err)
	for _, c := range caps.GetCapabilities() {
		if typ := c.GetRpc().GetType(); typ == csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS || typ == csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH {
			t.Errorf("capability %s announced with NoVolumeStats", typ)
		}
	}
	_, err = a.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: a.id, VolumePath: a.target})
	wantCode(t, "NodeGetVolumeStats", err, codes.Unimplemented)
	_, err = a.node.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: a.id, VolumePublishPath: a.target})
	wantCode(t, "NodeGetVolumeHealth", err, codes.Unimplemented)
	a.detach(ctx, a.id, a.staging, a.target)
}
