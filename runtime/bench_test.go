package runtime_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// benchEnv is a runtime with one monolith allocation of a fake plugin
// (controller publish and stage/unstage), one registered volume, and a bare
// gRPC connection to the same plugin socket. The data dir is on tmpfs
// (/dev/shm) when there is one, so that the staging and target
// directories, which both paths make and remove, cost what the agent's own
// work costs and not what this host's disk does.
type benchEnv struct {
	rt      *runtime.Runtime
	reg     *prometheus.Registry
	dataDir string
	events  <-chan runtime.Event
	ctrl    csipb.ControllerClient
	node    csipb.NodeClient
	next    int // lifecycles run so far; names each one's allocation
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	root := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		root = "/dev/shm"
	}
	dataDir, err := os.MkdirTemp(root, "csiactor-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dataDir) })
	p, endpoint := fakeplugin.Start(b, fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	cfg := testConfig(dataDir)
	cfg.Plugins.HeartbeatInterval = 10 * time.Second // heartbeats are not what is measured
	cfg.Plugins.ProbeTimeout = 5 * time.Second
	reg := prometheus.NewRegistry()
	rt, err := runtime.New(cfg, runtime.Options{Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
	if _, err := rt.RegisterAllocation(ctx, "mono-1", runtime.AllocationSpec{Plugin: testPlugin, Type: runtime.TypeMonolith, Socket: p.SocketPath()}); err != nil {
		b.Fatal(err)
	}
	if err := rt.WaitHealthy(ctx, testPlugin, runtime.TypeMonolith); err != nil {
		b.Fatal(err)
	}
	spec := volSpec("single-node-writer")
	spec.MountOptions = &runtime.MountOptions{FSType: "ext4"}
	if _, err := rt.RegisterVolume(ctx, "bench", spec); err != nil {
		b.Fatal(err)
	}
	events, err := rt.Subscribe(ctx)
	if err != nil {
		b.Fatal(err)
	}
	cc, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	e := &benchEnv{rt: rt, reg: reg, dataDir: dataDir, events: events, ctrl: csipb.NewControllerClient(cc), node: csipb.NewNodeClient(cc)}
	// Warm both paths: connections, the volume actor, worker goroutines.
	for range 20 {
		e.bare(b, false)
		e.bare(b, true)
		e.viaRuntime(b)
	}
	return e
}

// viaRuntime runs one claim → publish → release → freed through the
// runtime's public API, waiting for the claim-freed event.
func (e *benchEnv) viaRuntime(b *testing.B) {
	ctx := context.Background()
	e.next++
	alloc := fmt.Sprintf("a%d", e.next)
	if _, err := e.rt.Claim(ctx, "bench", claimReq(alloc, runtime.ModeWrite, "single-node-writer")); err != nil {
		b.Fatal(err)
	}
	if _, err := e.rt.Release(ctx, "bench", alloc); err != nil {
		b.Fatal(err)
	}
	awaitFreed(b, e.events, alloc)
}

// awaitFreed reads events until alloc's claim is freed, failing b on a
// failed claim, dropped events or the end of the stream.
func awaitFreed(b *testing.B, events <-chan runtime.Event, alloc string) {
	for ev := range events {
		switch {
		case ev.Type == runtime.EventClaimFreed && ev.Alloc == alloc:
			return
		case ev.Type == runtime.EventClaimFailed, ev.Type == runtime.EventsDropped:
			b.Fatalf("%s: %s", ev.Type, ev.Message)
		}
	}
	b.Fatal("event stream closed")
}

// bare sends the same six RPCs with plain gRPC clients, making and removing
// the same directories as the runtime (the CO's job by the CSI spec). With
// timeouts, each RPC gets its own context.WithTimeout, as a CO's calls do
// (kubelet's and Nomad's CSI clients): gRPC then sends the deadline to the
// plugin, which arms a timer for it.
func (e *benchEnv) bare(b *testing.B, timeouts bool) {
	e.next++
	rpcCtx := func() (context.Context, context.CancelFunc) {
		if timeouts {
			return context.WithTimeout(context.Background(), csi.DefaultRPCTimeout)
		}
		return context.Background(), func() {}
	}
	vol, usage := "ext-1", "rw-file-system-single-node-writer"
	staging := filepath.Join(e.dataDir, "volumes", testPlugin, "staging", "bench", usage)
	target := filepath.Join(e.dataDir, "volumes", testPlugin, "per-alloc", fmt.Sprintf("a%d", e.next), "bench", usage)
	vc := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
	}
	check := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := rpcCtx()
	pub, err := e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: fakeplugin.DefaultNodeID, VolumeCapability: vc})
	cancel()
	check(err)
	check(os.MkdirAll(staging, 0o750))
	ctx, cancel = rpcCtx()
	_, err = e.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol, PublishContext: pub.PublishContext, StagingTargetPath: staging, VolumeCapability: vc})
	cancel()
	check(err)
	check(os.MkdirAll(filepath.Dir(target), 0o750))
	ctx, cancel = rpcCtx()
	_, err = e.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol, PublishContext: pub.PublishContext, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc})
	cancel()
	check(err)
	ctx, cancel = rpcCtx()
	_, err = e.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target})
	cancel()
	check(err)
	_ = os.Remove(target)
	_ = os.Remove(filepath.Dir(target))
	_ = os.Remove(filepath.Dir(filepath.Dir(target)))
	ctx, cancel = rpcCtx()
	_, err = e.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging})
	cancel()
	check(err)
	_ = os.Remove(staging)
	_ = os.Remove(filepath.Dir(staging))
	ctx, cancel = rpcCtx()
	_, err = e.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: fakeplugin.DefaultNodeID})
	cancel()
	check(err)
}

// lifecycleChunk is how many lifecycles of one kind run back to back in
// BenchmarkLifecycle/runtime before the other kind runs as many.
const lifecycleChunk = 25

// BenchmarkLifecycle measures one claim → ControllerPublish → NodeStage →
// NodePublish → release → NodeUnpublish → NodeUnstage → ControllerUnpublish
// → freed, waited for, per op:
//
//   - bare-grpc: the six RPCs from a plain gRPC client to the plugin,
//     making and removing the same directories;
//   - runtime: the same lifecycle through the runtime's API (every step
//     persisted, store sync off, metrics on).
//
// The runtime variant also runs as many bare lifecycles of both kinds
// (without and with per-RPC timeouts), interleaved in chunks with its own
// (outside its timer), and reports its time ratio to each: all then see the
// same machine load. Stretch target: ratio ≤ 1.2. "ratio" is against
// RPCs without any timeout; "ratio-timeouts" against RPCs that carry a
// timeout each, as the runtime's do (every RPC has one), which
// the plugin pays for: here it runs in the same process.
func BenchmarkLifecycle(b *testing.B) {
	e := newBenchEnv(b)
	b.Run("bare-grpc", func(b *testing.B) {
		for range b.N {
			e.bare(b, false)
		}
	})
	b.Run("runtime", func(b *testing.B) {
		var bareTime, timeoutsTime, rtTime time.Duration
		for done := 0; done < b.N; {
			n := min(lifecycleChunk, b.N-done)
			b.StopTimer()
			t0 := time.Now()
			for range n {
				e.bare(b, false)
			}
			bareTime += time.Since(t0)
			t0 = time.Now()
			for range n {
				e.bare(b, true)
			}
			timeoutsTime += time.Since(t0)
			b.StartTimer()
			t1 := time.Now()
			for range n {
				e.viaRuntime(b)
			}
			rtTime += time.Since(t1)
			done += n
		}
		b.ReportMetric(float64(bareTime.Nanoseconds())/float64(b.N), "bare-ns/op")
		b.ReportMetric(float64(rtTime)/float64(bareTime), "ratio")
		b.ReportMetric(float64(rtTime)/float64(timeoutsTime), "ratio-timeouts")
	})
}
