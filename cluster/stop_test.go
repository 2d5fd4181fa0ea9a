package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// stopLimit is how long an agent may take from SIGTERM to its exit with
// etcd unreachable: the requirement, not a measure of speed. An agent
// that waits on no etcd request stops in milliseconds; the race-enabled
// binary the tests build adds a second at exit (GORACE's atexit_sleep_ms),
// and a frozen connection twice cluster.LeaveTimeout.
const stopLimit = 5 * time.Second

// TestCluster_StopWithoutEtcd: an agent (the binary, with the production
// lease TTL and dial timeout) holds a published claim of a real volume
// (the example plugin's bind mounts, or the hostpath driver's), then loses
// etcd: stopped (connections refused), cut off (a proxy that drops the
// connections and answers no new one) or frozen (a proxy that keeps the
// connections and drops every byte, so the agent's connection still
// looks up: each request on the way out waits cluster.LeaveTimeout at
// most). SIGTERM ends it in under stopLimit, with
// a clean exit, and the claim's staging and target stay mounted. With
// etcd back, the agent started again finds its claim published and etcd
// still holds it: nothing was released.
func TestCluster_StopWithoutEtcd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the plugins mount the volumes")
	}
	for _, plugin := range []string{"example", hostpath.PluginName} {
		for _, cut := range []string{"stopped", "cut-off", "frozen"} {
			t.Run(plugin+"/"+cut, func(t *testing.T) {
				testStopWithoutEtcd(t, plugin, cut)
			})
		}
	}
}

func testStopWithoutEtcd(t *testing.T, plugin, cut string) {
	var driver string
	if plugin == hostpath.PluginName {
		driver = hostpath.Binary(t) // skips without the driver
	}
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	px := startProxy(t, srv.Endpoint()[len("http://"):])
	c := newProcCluster(t, px.Endpoint())
	c.leaseTTL = runtime.DefaultLeaseTTL.String()
	node := "n1"
	alloc := fmt.Sprintf("  - id: %s\n    plugin: %s\n    type: monolith\n", plugin, plugin)
	if plugin == hostpath.PluginName {
		var args []string
		for _, arg := range hostpath.Command(driver, node, filepath.Join(c.base, node, "plugin")) {
			args = append(args, strconv.Quote(arg))
		}
		alloc += "    command: [" + strings.Join(args, ", ") + "]\n"
	} else {
		alloc += fmt.Sprintf("    command: [%q, example-plugin, -state-dir, %q, -node-id, csi-%s, -mount-mode, bind]\n",
			c.bin, filepath.Join(c.base, node, "plugin"), node)
	}
	a := c.addAgent(node, alloc)
	a.start()
	t.Cleanup(a.checkLogs)
	waitPluginHealthy(t, a, plugin)

	ctx := context.Background()
	const vol, am = "disk", "single-node-writer"
	if _, err := a.mustClient().CreateVolume(ctx, runtime.CreateVolumeSpec{ID: vol, CapacityBytes: 1 << 20,
		VolumeSpec: runtime.VolumeSpec{Plugin: plugin, Capabilities: []runtime.Capability{{AccessMode: am, AttachmentMode: "file-system"}}},
	}); err != nil {
		t.Fatal(err)
	}
	cl, err := a.mustClient().Claim(ctx, vol, claimReq("app", "write", am))
	if err != nil {
		t.Fatal(err)
	}
	// The example plugin bind-mounts the staging and the target; the
	// hostpath driver's staging is no mount.
	mounts := mountsUnder(a.dataDir)
	if want := map[string]int{"example": 2, hostpath.PluginName: 1}[plugin]; len(mounts) != want || !slices.Contains(mounts, cl.TargetPath) {
		t.Fatalf("mounts %v: want %d, the target %s among them", mounts, want, cl.TargetPath)
	}

	switch cut {
	case "stopped":
		srv.Stop()
	case "cut-off":
		px.block()
	case "frozen":
		px.freeze()
	}
	took := a.stop()
	t.Logf("%s with etcd %s: SIGTERM to exit %s", plugin, cut, took)
	if took >= stopLimit {
		t.Errorf("the agent took %s from SIGTERM to its exit with etcd unreachable, want under %s:\n%s",
			took, stopLimit, testbin.Tail(a.lastLog(), 30))
	}
	for _, m := range mounts {
		if !mountinfo.IsMountPoint(m) {
			t.Errorf("%s is no longer mounted after the agent stopped", m)
		}
	}

	// etcd back: the claim is still this host's, published, in etcd too.
	if cut == "stopped" {
		srv.Restart()
	} else {
		px.unblock()
	}
	a.start()
	v, err := a.mustClient().Volume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Claims) != 1 || v.Claims[0].Alloc != "app" || v.Claims[0].State != runtime.ClaimPublished || v.Claims[0].TargetPath != cl.TargetPath {
		t.Fatalf("claims after the restart: %+v; want app's, published at %s", v.Claims, cl.TargetPath)
	}
	ns, err := a.mustClient().Nodes(ctx)
	if err != nil || len(ns) != 1 || ns[0].Claims != 1 {
		t.Fatalf("nodes after the restart = %+v, %v; want %s holding its claim in etcd", ns, err, node)
	}
	for _, m := range mounts {
		if !mountinfo.IsMountPoint(m) {
			t.Errorf("%s is no longer mounted after the agent started again", m)
		}
	}
	// Released, everything unmounts and the agent stops cleanly.
	if _, err := a.mustClient().Release(ctx, vol, "app"); err != nil {
		t.Fatal(err)
	}
	testbin.Eventually(t, "no mounts left", procDeadline, 50*time.Millisecond, func() (bool, string) {
		left := mountsUnder(a.dataDir)
		return len(left) == 0, fmt.Sprint(left)
	})
	a.stop()
}
