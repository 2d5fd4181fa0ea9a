package volume

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/persistence"
)

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
	return b.runOn(ctx, "bench", i)
}

func (b *bareLifecycle) runOn(ctx context.Context, id string, i int) error {
	vol := "ext-" + id
	capab := fsCap(csi.AccessModeSingleNodeWriter)
	capab.MountOptions = &csi.MountOptions{FSType: "ext4"}
	vc := capab.ToCSI()
	staging := claim.StagingPath(b.dataDir, testPlugin, id, "u")
	target := claim.TargetPath(b.dataDir, testPlugin, fmt.Sprintf("a%d", i), id, "u")
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
// six RPCs sent by plain gRPC clients to the same plugin, in the same run:
// one op is one lifecycle. The two run interleaved, in chunks, so that both
// see the same machine load; ns/op is the manager's, bare-ns/op the
// baseline's and ratio the quotient. Target: ratio ≤ 1.2.
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

// lifecycleChunk is how many lifecycles of one kind run back to back in
// BenchmarkLifecycle before the other kind runs as many.
const lifecycleChunk = 25

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
	for done := 0; done < b.N; {
		n := min(lifecycleChunk, b.N-done)
		b.StopTimer()
		t0 := time.Now()
		for i := range n {
			if err := bare.run(ctx, 20+done+i); err != nil {
				b.Fatal(err)
			}
		}
		bareTime += time.Since(t0)
		b.StartTimer()
		t1 := time.Now()
		for i := range n {
			viaManager(20 + done + i)
		}
		mgrTime += time.Since(t1)
		done += n
	}
	b.StopTimer()
	b.ReportMetric(float64(bareTime.Nanoseconds())/float64(b.N), "bare-ns/op")
	b.ReportMetric(float64(mgrTime)/float64(bareTime), "ratio")
}

// BenchmarkDurableLifecycles runs one claim → publish → release → freed on
// each of 1,000 volumes at once, store sync on, and reports lifecycles/s.
// Two baselines run in the same benchmark: the store alone (the same
// writes per lifecycle, three durable and five deferred, from 1,000
// writers with no RPC: what the store's group commit allows) and the plugin alone (the six RPCs per
// lifecycle from plain gRPC clients, as many in flight as the manager
// allows per plugin). The manager can be no faster than the slower of the
// two.
//
// The store file is on disk (the temporary directory) in both. The data
// dir, where the staging and target directories are made and removed, is in
// /dev/shm when there is one: on this kind of host a mkdir on disk costs
// more than a commit, and ten of them per lifecycle would measure the
// file system, not the agent ("disk-dirs" runs that variant too).
func BenchmarkDurableLifecycles(b *testing.B) {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		b.Run("tmpfs-dirs", func(b *testing.B) { benchDurable(b, "/dev/shm") })
	}
	b.Run("disk-dirs", func(b *testing.B) { benchDurable(b, "") })
}

func benchDurable(b *testing.B, root string) {
	const vols = 1000
	// A lifecycle's writes: reserved (durable), controller-published,
	// staged (deferred), published, taken (durable), node-unpublished,
	// unstaged, freed (deferred).
	durable := []bool{true, false, false, true, true, false, false, false}
	var freedN atomic.Int64
	allFreed := make(chan struct{}, 1)
	var target atomic.Int64
	hook := func(point, _ string) {
		if point == "persisted:ControllerUnpublishVolume" && freedN.Add(1) == target.Load() {
			allFreed <- struct{}{}
		}
	}
	e := newEnv(b, fullPlugin, withHook(hook), withRoot(root), withDurableStore(b.TempDir()), withConfig(func(c *Config) {
		c.MaxInFlightPerPlugin = 64
	}))
	ctx := context.Background()
	testbin.Parallel(b, vols, func(i int) error {
		_, err := e.m.Register(ctx, spec(fmt.Sprintf("vol%04d", i)))
		return err
	})
	var mgr time.Duration
	b.ResetTimer()
	for n := range b.N {
		target.Store(int64((n + 1) * vols))
		t0 := time.Now()
		testbin.Parallel(b, vols, func(i int) error {
			id, alloc := fmt.Sprintf("vol%04d", i), fmt.Sprintf("a%d", n)
			if _, err := e.m.Claim(ctx, claimReq(id, alloc, claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
				return err
			}
			_, err := e.m.Release(ctx, id, alloc)
			return err
		})
		<-allFreed
		mgr += time.Since(t0)
	}
	b.StopTimer()

	// Baseline: the same writes straight into a store of the same kind.
	store, err := persistence.Open(filepath.Join(b.TempDir(), "base.db"), persistence.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	var base time.Duration
	for range b.N {
		t0 := time.Now()
		testbin.Parallel(b, vols, func(i int) error {
			v := persistence.Volume{ID: fmt.Sprintf("vol%04d", i), Plugin: testPlugin, ExternalID: "x"}
			for w, sync := range durable {
				v.Revision = uint64(w)
				put := store.PutVolumeDeferred
				if sync {
					put = store.PutVolume
				}
				if err := put(ctx, v); err != nil {
					return err
				}
			}
			return nil
		})
		base += time.Since(t0)
	}
	// Baseline: the same RPCs from plain gRPC clients, 64 in flight.
	cc, err := grpc.NewClient("unix://"+e.plugin.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	bare := &bareLifecycle{ctrl: csipb.NewControllerClient(cc), node: csipb.NewNodeClient(cc), dataDir: e.dataDir}
	var rpc time.Duration
	for n := range b.N {
		t0 := time.Now()
		var next atomic.Int64
		testbin.Parallel(b, e.m.cfg.MaxInFlightPerPlugin, func(int) error {
			for i := next.Add(1) - 1; i < vols; i = next.Add(1) - 1 {
				if err := bare.runOn(ctx, fmt.Sprintf("vol%04d", i), 1_000_000+n); err != nil {
					return err
				}
			}
			return nil
		})
		rpc += time.Since(t0)
	}
	lc := float64(b.N * vols)
	b.ReportMetric(lc/mgr.Seconds(), "lifecycles/s")
	b.ReportMetric(lc/base.Seconds(), "store-bound-lifecycles/s")
	b.ReportMetric(lc/rpc.Seconds(), "rpc-bound-lifecycles/s")
}

// seedStore writes n volumes, each with one published claim, into a new
// store file at path (sync off: setup only).
func seedStore(b *testing.B, path string, n int) {
	b.Helper()
	s, err := persistence.Open(path, persistence.Config{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	const writers = 64
	testbin.Parallel(b, writers, func(w int) error {
		for i := w; i < n; i += writers {
			id := fmt.Sprintf("vol-%06d", i)
			usage := "rw-file-system-single-node-writer"
			v := persistence.Volume{
				ID: id, Plugin: testPlugin, ExternalID: "ext-" + id, Revision: 4, CreatedAt: now, UpdatedAt: now,
				Capabilities: []persistence.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
				Claims: []persistence.Claim{{
					Alloc: "alloc-" + id, Mode: "write", AccessMode: "single-node-writer", AttachmentMode: "file-system",
					State: claim.StatePublished, Usage: usage, NodeID: fakeplugin.DefaultNodeID,
					TargetPath:  claim.TargetPath("/var/lib/csiactor", testPlugin, "alloc-"+id, id, usage),
					StagingPath: claim.StagingPath("/var/lib/csiactor", testPlugin, id, usage),
					CreatedAt:   now, UpdatedAt: now,
				}},
				Stagings: []persistence.Staging{{Usage: usage, Path: claim.StagingPath("/var/lib/csiactor", testPlugin, id, usage), Users: []string{"alloc-" + id}, Staged: true}},
			}
			if err := s.PutVolume(context.Background(), v); err != nil {
				return err
			}
		}
		return nil
	})
}

const bigVolumes = 100_000

// BenchmarkIdleVolumeHeap reports the heap a manager keeps per tracked,
// idle volume, with 100,000 volumes each holding one published claim.
// Target: ≤ 2 KiB per volume. The store is seeded once; each op starts a
// manager on it and measures.
func BenchmarkIdleVolumeHeap(b *testing.B) {
	dir := b.TempDir()
	seedStore(b, filepath.Join(dir, "state.db"), bigVolumes)
	plugin, endpoint := fakeplugin.Start(b, fullPlugin)
	b.Run("100k", func(b *testing.B) {
		var perVolume float64
		for range b.N {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			e := newEnvWith(b, dir, plugin, endpoint)
			runtime.GC()
			runtime.ReadMemStats(&after)
			if live := e.m.Live(); live != 0 {
				b.Fatalf("%d volume actors in memory for idle volumes", live)
			}
			perVolume += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / bigVolumes
			runtime.KeepAlive(e)
			e.close()
		}
		b.ReportMetric(perVolume/float64(b.N), "bytes/volume")
	})
}

// BenchmarkRestartReady reports how long a new manager takes to be ready
// (Start returns) on a store with 100,000 volumes, each with one published
// claim. Target: ≤ 1 s. The store is seeded once; each op is one restart.
func BenchmarkRestartReady(b *testing.B) {
	dir := b.TempDir()
	seedStore(b, filepath.Join(dir, "state.db"), bigVolumes)
	plugin, endpoint := fakeplugin.Start(b, fullPlugin)
	b.Run("100k", func(b *testing.B) {
		e := newEnvWith(b, dir, plugin, endpoint)
		defer e.close()
		var total time.Duration
		b.ResetTimer()
		for range b.N {
			if err := e.m.Shutdown(context.Background()); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			e.startManager()
			total += time.Since(t0)
		}
		b.StopTimer()
		v, err := e.m.Get(context.Background(), "vol-000042")
		if err != nil || len(v.Claims) != 1 || v.Claims[0].State != claim.StatePublished {
			b.Fatalf("volume after restart = %+v, %v", v, err)
		}
		if err := testutilGather(e, bigVolumes); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/ready")
	})
}

// testutilGather checks that the restarted manager counts n published
// write claims.
func testutilGather(e *env, n int) error {
	return testutil.GatherAndCompare(e.reg, strings.NewReader(claimsExposition(map[string]float64{"published/write": float64(n)})),
		"csiactor_volume_claims")
}
