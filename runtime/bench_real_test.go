package runtime_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// examplePluginEnv makes the test binary run as the example plugin, its
// state in the directory the variable names (see runExamplePlugin).
const examplePluginEnv = "CSIACTOR_RT_EXAMPLE_PLUGIN"

// runExamplePlugin serves the example plugin on $CSI_ENDPOINT until SIGTERM
// or SIGINT, as `csiactor example-plugin -state-dir DIR -log-format json`
// does under `csiactor agent -dev`: the same plugin code in its own
// process, logging JSON at info to stderr, mounting as the default mount
// mode says (bind mounts as root, symlinks otherwise).
func runExamplePlugin() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	err := csiplugin.Run(ctx, csiplugin.Config{
		Endpoint: os.Getenv("CSI_ENDPOINT"),
		StateDir: os.Getenv(examplePluginEnv),
		Logger:   logrus.NewEntry(l).WithField("plugin", "example"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

const (
	// realPlugin is the example plugin's name and allocation ID in
	// BenchmarkLifecycleRealPlugin, as under `csiactor agent -dev`.
	realPlugin = "example"
	// realVolume is the volume its lifecycles claim.
	realVolume = "bench"
	// realUsage is the usage of a write claim of a file-system,
	// single-node-writer volume: the last element of its staging and
	// target paths.
	realUsage = "rw-file-system-single-node-writer"
)

// realEnv is a runtime with the store synced (the default) on a data dir
// under root, the example plugin as its exec-managed monolith allocation
// (a process of its own, state and volumes in the data dir), one volume
// created through the runtime, and a bare gRPC connection to the same
// plugin socket.
type realEnv struct {
	rt      *runtime.Runtime
	reg     *prometheus.Registry
	dataDir string
	events  <-chan runtime.Event
	vol     runtime.Volume
	nodeID  string
	ctrl    csipb.ControllerClient
	node    csipb.NodeClient
	timeout time.Duration // each bare RPC's, the runtime's RPC timeout
	bareRPC time.Duration // the bare lifecycles' time in RPCs, so far
	next    int           // lifecycles run so far; names each one's allocation
}

// newRealEnv starts a realEnv with its data dir under root, checks that
// the runtime publishes where the bare lifecycle will, and warms both up.
// Everything is stopped and removed when b ends.
func newRealEnv(b *testing.B, root string) *realEnv {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	dataDir, err := os.MkdirTemp(root, "csiactor-benchreal-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		// Mounts a failed lifecycle left (as root) first, so that
		// RemoveAll neither fails on them nor removes through them.
		if points, err := mountinfo.Under(dataDir); err == nil {
			for i := len(points) - 1; i >= 0; i-- {
				_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
			}
		}
		_ = os.RemoveAll(dataDir)
	})
	bind := os.Geteuid() == 0
	cfg := runtime.Config{DataDir: dataDir}
	// Its plugin goes with the runtime: Shutdown waits for it to exit.
	cfg.Plugins.StopOnAgentExit = true
	// In symlink mode (not root) the example plugin mounts nothing, and
	// the mount table would show every published claim missing.
	cfg.Host.SkipMountCheck = !bind
	// An agent logs at info: the same formatting work, written nowhere.
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	reg := prometheus.NewRegistry()
	rt, err := runtime.New(cfg, runtime.Options{Registerer: reg, Log: logrus.NewEntry(logger)})
	if err != nil {
		b.Fatal(err)
	}
	if rt.Config().Store.NoSync {
		b.Fatal("the store is not synced; this benchmark measures it synced")
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := rt.Shutdown(context.Background()); err != nil {
			b.Errorf("shutdown: %s", err)
		}
	})
	if _, err := rt.RegisterAllocation(ctx, realPlugin, runtime.AllocationSpec{
		Plugin: realPlugin, Type: runtime.TypeMonolith,
		Command: []string{self, "-test.run=^$"},
		Env:     map[string]string{examplePluginEnv: filepath.Join(dataDir, "example-plugin")},
	}); err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if err := rt.WaitHealthy(wctx, realPlugin, runtime.TypeMonolith); err != nil {
		b.Fatalf("the example plugin did not turn healthy: %s", err)
	}
	vol, err := rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: realVolume, VolumeSpec: runtime.VolumeSpec{
		Plugin:       realPlugin,
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
	}})
	if err != nil {
		b.Fatal(err)
	}
	events, err := rt.Subscribe(ctx)
	if err != nil {
		b.Fatal(err)
	}
	as, err := rt.Allocations(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var socket string
	var pid int
	for _, a := range as {
		if a.ID == realPlugin {
			socket, pid = a.Socket, a.PID
		}
	}
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	info, err := csipb.NewNodeClient(cc).NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil {
		b.Fatal(err)
	}
	e := &realEnv{
		rt: rt, reg: reg, dataDir: dataDir, events: events, vol: vol, nodeID: info.GetNodeId(),
		ctrl: csipb.NewControllerClient(cc), node: csipb.NewNodeClient(cc), timeout: rt.Config().Plugins.RPCTimeout,
	}
	// The bare lifecycle uses the runtime's paths: check it has them.
	e.next++
	alloc := fmt.Sprintf("a%d", e.next)
	c, err := rt.Claim(ctx, realVolume, claimReq(alloc, runtime.ModeWrite, "single-node-writer"))
	if err != nil {
		b.Fatal(err)
	}
	if want := claim.TargetPath(dataDir, realPlugin, alloc, realVolume, realUsage); c.TargetPath != want {
		b.Fatalf("the runtime published at %s; the bare lifecycle would at %s", c.TargetPath, want)
	}
	if bind && !mountinfo.IsMountPoint(c.TargetPath) {
		b.Fatalf("running as root, the example plugin did not bind-mount the target %s", c.TargetPath)
	}
	e.release(b, alloc)
	// Warm both paths: connections, the volume actor, worker goroutines,
	// the plugin's state file.
	for range 5 {
		e.bare(b)
		e.viaRuntime(b)
	}
	mode := "symlinks (not root: the example plugin mounts nothing)"
	if bind {
		mode = "bind mounts"
	}
	b.Logf("data dir %s; the example plugin (pid %d) publishes with %s", dataDir, pid, mode)
	return e
}

// viaRuntime runs one claim → publish → release → freed through the
// runtime's API, waiting for the claim-freed event.
func (e *realEnv) viaRuntime(b *testing.B) {
	e.next++
	alloc := fmt.Sprintf("a%d", e.next)
	if _, err := e.rt.Claim(context.Background(), realVolume, claimReq(alloc, runtime.ModeWrite, "single-node-writer")); err != nil {
		b.Fatal(err)
	}
	e.release(b, alloc)
}

// release releases alloc's claim and waits for it to be freed.
func (e *realEnv) release(b *testing.B, alloc string) {
	if _, err := e.rt.Release(context.Background(), realVolume, alloc); err != nil {
		b.Fatal(err)
	}
	awaitFreed(b, e.events, alloc)
}

// bare sends the runtime's six RPCs for one lifecycle from a plain gRPC
// client, each with its own timeout as a CO's are (and the runtime's),
// with the same requests (volume, node, capability, volume context,
// publish context, paths) and making and removing the same directories as
// the runtime does (the CO's job by the CSI spec).
func (e *realEnv) bare(b *testing.B) {
	e.next++
	vol := e.vol.ExternalID
	staging := claim.StagingPath(e.dataDir, realPlugin, realVolume, realUsage)
	target := claim.TargetPath(e.dataDir, realPlugin, fmt.Sprintf("a%d", e.next), realVolume, realUsage)
	vc := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
	}
	check := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	// rpc sends one RPC with its own timeout, counting its time.
	rpc := func(send func(ctx context.Context) error) {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		err := send(ctx)
		cancel()
		e.bareRPC += time.Since(t0)
		check(err)
	}
	var pubCtx map[string]string
	rpc(func(ctx context.Context) error {
		resp, err := e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: e.nodeID, VolumeCapability: vc, VolumeContext: e.vol.Context})
		pubCtx = resp.GetPublishContext()
		return err
	})
	check(os.MkdirAll(staging, 0o750))
	rpc(func(ctx context.Context) error {
		_, err := e.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol, PublishContext: pubCtx, StagingTargetPath: staging, VolumeCapability: vc, VolumeContext: e.vol.Context})
		return err
	})
	check(os.MkdirAll(filepath.Dir(target), 0o750))
	rpc(func(ctx context.Context) error {
		_, err := e.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol, PublishContext: pubCtx, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc, VolumeContext: e.vol.Context})
		return err
	})
	rpc(func(ctx context.Context) error {
		_, err := e.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target})
		return err
	})
	_ = os.Remove(target)
	_ = os.Remove(filepath.Dir(target))
	_ = os.Remove(filepath.Dir(filepath.Dir(target)))
	rpc(func(ctx context.Context) error {
		_, err := e.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging})
		return err
	})
	_ = os.Remove(staging)
	_ = os.Remove(filepath.Dir(staging))
	rpc(func(ctx context.Context) error {
		_, err := e.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: e.nodeID})
		return err
	})
}

// histTotals returns the count and the sum of every series of the
// histogram family name in reg.
func histTotals(b *testing.B, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

// usage is CPU time and voluntary context switches (a thread blocking:
// on a channel, a lock, a syscall, the network) of this process, the
// runtime and the bare client; not of the plugin or the hogs.
type usage struct {
	cpu      time.Duration
	switches int64
}

func getUsage(b *testing.B) usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return usage{
		cpu:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		switches: ru.Nvcsw,
	}
}

func (u usage) sub(v usage) usage { return usage{u.cpu - v.cpu, u.switches - v.switches} }

func (u *usage) add(v usage) { u.cpu += v.cpu; u.switches += v.switches }

// run is one sub-benchmark: b.N lifecycles through the runtime, timed,
// each paired with a bare one, untimed, run just before or just after it
// (by turns), so that both see the same machine: a lifecycle takes tens of
// milliseconds, long enough for the load of other processes to change
// between chunks of them.
func (e *realEnv) run(b *testing.B) {
	commits0, commitSecs0 := histTotals(b, e.reg, "csiactor_store_commit_seconds")
	rpcs0, rpcSecs0 := histTotals(b, e.reg, "csiactor_csi_operations_seconds")
	var bareTime, rtTime time.Duration
	var bareUse, rtUse usage
	bareRPC0 := e.bareRPC
	ratios := make([]float64, 0, b.N)
	bare := func() time.Duration {
		b.StopTimer()
		u, t := getUsage(b), time.Now()
		e.bare(b)
		d := time.Since(t)
		bareUse.add(getUsage(b).sub(u))
		b.StartTimer()
		return d
	}
	b.ResetTimer()
	for i := range b.N {
		var bd time.Duration
		if i%2 == 0 {
			bd = bare()
		}
		u, t := getUsage(b), time.Now()
		e.viaRuntime(b)
		rd := time.Since(t)
		rtUse.add(getUsage(b).sub(u))
		if i%2 == 1 {
			bd = bare()
		}
		bareTime += bd
		rtTime += rd
		ratios = append(ratios, float64(rd)/float64(bd))
	}
	b.StopTimer()
	commits, commitSecs := histTotals(b, e.reg, "csiactor_store_commit_seconds")
	rpcs, rpcSecs := histTotals(b, e.reg, "csiactor_csi_operations_seconds")
	n := float64(b.N)
	b.ReportMetric(float64(rtTime.Microseconds())/1e3/n, "agent-ms/op")
	b.ReportMetric(float64(bareTime.Microseconds())/1e3/n, "bare-ms/op")
	b.ReportMetric(float64(rtTime)/float64(bareTime), "ratio")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ratio-median")
	b.ReportMetric(float64((e.bareRPC-bareRPC0).Microseconds())/1e3/n, "bare-rpc-ms/op")
	b.ReportMetric(float64(rtUse.cpu.Microseconds())/1e3/n, "agent-cpu-ms/op")
	b.ReportMetric(float64(bareUse.cpu.Microseconds())/1e3/n, "bare-cpu-ms/op")
	b.ReportMetric(float64(rtUse.switches)/n, "agent-csw/op")
	b.ReportMetric(float64(bareUse.switches)/n, "bare-csw/op")
	b.ReportMetric(float64(commits-commits0)/n, "commits/op")
	b.ReportMetric((commitSecs-commitSecs0)*1e3/n, "commit-ms/op")
	b.ReportMetric(float64(rpcs-rpcs0)/n, "rpcs/op")
	b.ReportMetric((rpcSecs-rpcSecs0)*1e3/n, "rpc-ms/op")
}

// BenchmarkLifecycleRealPlugin is the lifecycle as users feel it: the
// example plugin as a real process (the exec-managed allocation `csiactor
// agent -dev` runs; bind mounts as root, symlinks otherwise) and the
// store synced. Each op is one claim → ControllerPublish → NodeStage →
// NodePublish → release → NodeUnpublish → NodeUnstage → ControllerUnpublish
// → freed (waited for) through the runtime's API; beside each, just
// before or after it, the same six RPCs from a bare gRPC client on the
// same plugin socket with the same paths and directory work (the plugin
// syncs its own state file on every change, in both). Target: ratio ≤
// 1.05.
//
// Sub-benchmarks: disk (the data dir under os.TempDir: the store and the
// plugin sync to a real disk when that is one) and tmpfs (/dev/shm: syncs
// cost next to nothing, leaving the agent's own work), each idle and
// loaded (a CPU hog per GOMAXPROCS beside it: testbin.CPUHog). Metrics,
// per lifecycle:
//
//   - agent-ms/op and bare-ms/op; ratio, agent/bare of the totals, and
//     ratio-median, the median of the pairs' ratios (a lifecycle stalled
//     by another process weighs no more than any other);
//   - commits/op and commit-ms/op: the agent's store commits
//     (csiactor_store_commit_seconds);
//   - rpcs/op and rpc-ms/op: the RPCs' time as the agent saw it
//     (csiactor_csi_operations_seconds); bare-rpc-ms/op the same for the
//     bare client, the rest of bare-ms/op being its directory work;
//   - agent-cpu-ms/op, bare-cpu-ms/op, agent-csw/op, bare-csw/op: the CPU
//     time and voluntary context switches of this process during each
//     kind, the agent's own cost, which a loaded machine makes it wait for.
func BenchmarkLifecycleRealPlugin(b *testing.B) {
	roots := []struct{ name, dir string }{{"disk", os.TempDir()}, {"tmpfs", "/dev/shm"}}
	for _, root := range roots {
		b.Run(root.name, func(b *testing.B) {
			if fi, err := os.Stat(root.dir); err != nil || !fi.IsDir() {
				b.Skipf("no %s at %s", root.name, root.dir)
			}
			e := newRealEnv(b, root.dir)
			b.Run("idle", e.run)
			b.Run("loaded", func(b *testing.B) {
				testbin.CPUHog(b, goruntime.GOMAXPROCS(0))
				e.run(b)
			})
		})
	}
}
