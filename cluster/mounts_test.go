package cluster_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/runtime"
)

// startExampleAgent starts a runtime for node on endpoint with the example
// plugin ("example", bind mounts) as a monolith allocation, served in this
// process with its state in the agent's data dir; cfg adjusts the config.
// Whatever is still mounted under the data dir when t ends is unmounted.
func startExampleAgent(t *testing.T, node, endpoint string, cfg func(*runtime.Config)) *agent {
	t.Helper()
	a := &agent{t: t, node: node, cfg: clusterConfig(t, node, endpoint)}
	if cfg != nil {
		cfg(&a.cfg)
	}
	dir := a.cfg.DataDir
	t.Cleanup(func() {
		mps, _ := mountinfo.Under(dir)
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", mp, err)
			}
		}
	})
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	p, err := csiplugin.New(csiplugin.Config{
		NodeID: "csi-" + node, StateDir: filepath.Join(dir, "example-state"),
		MountMode: csiplugin.MountModeBind, Logger: logrus.NewEntry(quiet),
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "example.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Serve(l)
	}()
	t.Cleanup(func() { p.Stop(); <-done })
	a.start()
	if _, err := a.rt.RegisterAllocation(context.Background(), "example-"+node, runtime.AllocationSpec{
		Plugin: "example", Type: runtime.TypeMonolith, Socket: sock,
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.rt.WaitHealthy(ctx, "example", runtime.TypeMonolith); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestCluster_FencedHostUnmounts: a host's claim of a volume of the
// example plugin is a real bind mount; the host goes down and its mount
// stays; the other host, now the plugin's controller leader, fences it
// automatically after fence_after (ControllerUnpublishVolume for its node
// ID); the host, started again, finds its claim fenced and
// unmounts it (target and staging); the volume is free in the cluster.
// (The example plugins of two hosts share no storage, so the other host
// cannot mount it.)
func TestCluster_FencedHostUnmounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	fast := func(c *runtime.Config) { c.Cluster.LeaseTTL, c.Cluster.FenceAfter = 2*time.Second, 3*time.Second }
	// n1's "example" plugin is a fake: it takes any volume, so that n1
	// registers the volume n2's example plugin creates (the example
	// plugins of two hosts share no storage).
	cfg1 := clusterConfig(t, "n1", srv.Endpoint())
	fast(&cfg1)
	a1 := &agent{t: t, node: "n1", cfg: cfg1}
	a1.start()
	fake, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-n1"})
	a1.plugin = fake
	if _, err := a1.rt.RegisterAllocation(context.Background(), "fake-n1", runtime.AllocationSpec{
		Plugin: "example", Type: runtime.TypeMonolith, Socket: ep[len("unix://"):],
	}); err != nil {
		t.Fatal(err)
	}
	a2 := startExampleAgent(t, "n2", srv.Endpoint(), fast)
	ctx := context.Background()
	const vol, am = "mdisk", "single-node-writer"
	if _, err := a2.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{
		ID: vol,
		VolumeSpec: runtime.VolumeSpec{Plugin: "example",
			Capabilities: []runtime.Capability{{AccessMode: am, AttachmentMode: "file-system"}}},
		CapacityBytes: 1 << 20,
	}); err != nil {
		t.Fatal(err)
	}
	a1.waitVolume(vol)
	c, err := claimOnce(t, a2, vol, claimReq("app", "write", am))
	if err != nil {
		t.Fatal(err)
	}
	if !mountinfo.IsMountPoint(c.TargetPath) {
		t.Fatalf("claim's target %s is not a mount point", c.TargetPath)
	}
	a2.stop()
	if !mountinfo.IsMountPoint(c.TargetPath) {
		t.Fatal("the target was unmounted when the agent stopped; published claims outlive it")
	}
	eventually(t, "n2 fenced automatically", func() (bool, error) {
		ns, err := a1.rt.Nodes(ctx)
		if err != nil {
			return false, err
		}
		for _, n := range ns {
			if n.ID == "n2" {
				return n.Claims == 0, nil
			}
		}
		return false, nil
	})
	a2.start()
	a2.waitFreed(vol, "app")
	if mps, err := mountinfo.Under(a2.cfg.DataDir); err != nil || len(mps) != 0 {
		t.Fatalf("mounts left under the fenced host's data dir: %v, %v", mps, err)
	}
	if r, _ := fake.LastRequest("ControllerUnpublishVolume").(*csipb.ControllerUnpublishVolumeRequest); r.GetNodeId() != "csi-n2" {
		t.Fatalf("n1's ControllerUnpublishVolume = %v, want one from node csi-n2", r)
	}
	v, err := a1.rt.Volume(ctx, vol)
	if err != nil || len(v.Claims) != 0 {
		t.Fatalf("volume after the fence: claims %+v, %v; want none", v.Claims, err)
	}
}
