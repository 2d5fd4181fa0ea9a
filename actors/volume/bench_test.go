package volume

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// lifecyclesPerRound is how many lifecycles one benchmark iteration runs, so
// that `-benchtime 1x` still measures something.
const lifecyclesPerRound = 200

// bareLifecycle sends a claim's six RPCs with plain gRPC clients, as the
// baseline: what the plugin costs with no agent in between. It makes and
// removes the staging and target directories as the manager does, since
// every CO must (on this host's disk a mkdir costs more than an RPC).
type bareLifecycle struct {
	ctrl    csipb.ControllerClient
	node    csipb.NodeClient
	dataDir string
}

func (b *bareLifecycle) run(ctx context.Context, i int) error {
	vol := "ext-bench"
	capab := fsCap(csi.AccessModeSingleNodeWriter)
	capab.MountOptions = &csi.MountOptions{FSType: "ext4"}
	vc := capab.ToCSI()
	staging := claim.StagingPath(b.dataDir, testPlugin, "bench", "u")
	target := claim.TargetPath(b.dataDir, testPlugin, fmt.Sprintf("a%d", i), "bench", "u")
	pub, err := b.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: fakeplugin.DefaultNodeID, VolumeCapability: vc})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return err
	}
	if _, err := b.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol, PublishContext: pub.PublishContext, StagingTargetPath: staging, VolumeCapability: vc}); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	if _, err := b.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol, PublishContext: pub.PublishContext, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc}); err != nil {
		return err
	}
	if _, err := b.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
		return err
	}
	if _, err := b.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
		return err
	}
	_, err = b.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: fakeplugin.DefaultNodeID})
	// The directories are the CO's to make and remove, whoever the CO is.
	_ = os.Remove(target)
	_ = os.Remove(filepath.Dir(target))
	_ = os.Remove(filepath.Dir(filepath.Dir(target)))
	_ = os.Remove(staging)
	_ = os.Remove(filepath.Dir(staging))
	return err
}

// freedSignal returns a hook that signals on ch every time a release
// finishes its last step (the controller unpublish, folded into freed).
func freedSignal(ch chan<- string) func(point, volume string) {
	return func(point, volume string) {
		if point == "persisted:ControllerUnpublishVolume" {
			ch <- volume
		}
	}
}

// BenchmarkLifecycle compares one claim → publish → release → freed through
// the manager (six RPCs, every step persisted, store sync off) with the same
// six RPCs sent by plain gRPC clients to the same plugin, in the same run.
// Target: ratio ≤ 1.2.
//
// "disk" keeps the data dir (and its staging and target directories) in the
// temporary directory; "tmpfs" in /dev/shm, which shows the agent's own
// overhead without the disk's mkdir cost.
func BenchmarkLifecycle(b *testing.B) {
	b.Run("disk", func(b *testing.B) { benchLifecycle(b, "") })
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		b.Run("tmpfs", func(b *testing.B) { benchLifecycle(b, "/dev/shm") })
	}
}

func benchLifecycle(b *testing.B, root string) {
	freed := make(chan string, 1)
	e := newEnv(b, fullPlugin, withHook(freedSignal(freed)), withRoot(root))
	e.register("bench")
	cc, err := grpc.NewClient("unix://"+e.plugin.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	bare := &bareLifecycle{ctrl: csipb.NewControllerClient(cc), node: csipb.NewNodeClient(cc), dataDir: e.dataDir}
	ctx := context.Background()
	viaManager := func(i int) {
		alloc := fmt.Sprintf("a%d", i)
		if _, err := e.m.Claim(ctx, claimReq("bench", alloc, claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
			b.Fatal(err)
		}
		if _, err := e.m.Release(ctx, "bench", alloc); err != nil {
			b.Fatal(err)
		}
		<-freed
	}
	// Warm both paths (connections, the volume actor).
	for i := range 20 {
		if err := bare.run(ctx, i); err != nil {
			b.Fatal(err)
		}
		viaManager(i)
	}
	var bareTime, mgrTime time.Duration
	b.ResetTimer()
	for n := range b.N {
		t0 := time.Now()
		for i := range lifecyclesPerRound {
			if err := bare.run(ctx, n*lifecyclesPerRound+i); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		for i := range lifecyclesPerRound {
			viaManager(n*lifecyclesPerRound + i)
		}
		bareTime += t1.Sub(t0)
		mgrTime += time.Since(t1)
	}
	b.StopTimer()
	lc := float64(b.N * lifecyclesPerRound)
	b.ReportMetric(float64(bareTime.Nanoseconds())/lc, "bare-ns/lifecycle")
	b.ReportMetric(float64(mgrTime.Nanoseconds())/lc, "manager-ns/lifecycle")
	b.ReportMetric(float64(mgrTime)/float64(bareTime), "ratio")
}
