package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// startNodeOnly starts a runtime for node on endpoint whose fake plugin is
// a node allocation only: the plugin says it has a controller service
// (and checks the publish context ControllerPublishVolume gives), but this
// host runs no controller of it.
func startNodeOnly(t testing.TB, node, endpoint string) *agent {
	t.Helper()
	a := &agent{t: t, node: node, cfg: clusterConfig(t, node, endpoint)}
	a.start()
	p, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-" + node})
	a.plugin = p
	if _, err := a.rt.RegisterAllocation(context.Background(), "node-"+node, runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeNode, Socket: ep[len("unix://"):],
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.rt.WaitHealthy(ctx, testPlugin, runtime.TypeNode); err != nil {
		t.Fatal(err)
	}
	return a
}

// claimOnce claims on a, waiting while the claim is refused as unavailable
// (the controller hosts have not recorded the plugin's controller yet, no
// leader is elected yet, or, on a loaded machine, this host's lease
// renewal lagged and it stopped admitting for a moment); a refused claim
// changes nothing.
func claimOnce(t testing.TB, a *agent, vol string, req runtime.ClaimRequest) (runtime.Claim, error) {
	t.Helper()
	var c runtime.Claim
	var err error
	eventually(t, "a claim not refused as unavailable on "+a.node, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		c, err = a.rt.Claim(ctx, vol, req)
		return !unavailable(err), nil
	})
	return c, err
}

func unavailable(err error) bool {
	return errors.Is(err, runtime.ErrPluginUnavailable) || errors.Is(err, runtime.ErrClusterUnavailable)
}

// claimRetrying is claimOnce for a goroutine other than the test's: it
// gives up after waitLimit with the last error.
func claimRetrying(a *agent, vol string, req runtime.ClaimRequest) (runtime.Claim, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		c, err := a.rt.Claim(ctx, vol, req)
		if !unavailable(err) || ctx.Err() != nil {
			return c, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leaderOf waits until one of as leads the test plugin's controller and
// returns it.
func leaderOf(t testing.TB, as ...*agent) *agent {
	t.Helper()
	var leader *agent
	eventually(t, "a controller leader", func() (bool, error) {
		for _, a := range as {
			if v := metricValue(t, a, "csiactor_cluster_controller_leader", testPlugin); v == 1 {
				leader = a
				return true, nil
			}
		}
		return false, nil
	})
	return leader
}

// metricValue returns the value of a's gauge or counter name in the
// series with the label value label (0 when there is none).
func metricValue(t testing.TB, a *agent, name, label string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// etcdKeys returns how many keys etcd at endpoint holds under prefix.
func etcdKeys(t testing.TB, endpoint, prefix string) int64 {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// TestCluster_RemoteController: a claim on a host with only a node
// allocation of a plugin that needs ControllerPublishVolume gets it from
// the controller of another host, with the claiming host's node ID; the
// publish context reaches the node steps; the release's
// ControllerUnpublishVolume runs there too, and the request leaves etcd.
func TestCluster_RemoteController(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startAgent(t, "n1", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "rdisk", "single-node-writer"
	if _, err := ctrl.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	c, err := claimOnce(t, node, vol, claimReq("app", "write", am))
	if err != nil {
		t.Fatalf("claim on the node-only host: %v", err)
	}
	if c.State != runtime.ClaimPublished {
		t.Fatalf("claim = %+v", c)
	}
	pub, _ := ctrl.plugin.LastRequest("ControllerPublishVolume").(*csipb.ControllerPublishVolumeRequest)
	if pub.GetNodeId() != "csi-n3" || pub.GetVolumeId() != "ext-"+vol {
		t.Fatalf("controller host's ControllerPublishVolume = %v, want volume ext-%s to node csi-n3", pub, vol)
	}
	if n := node.plugin.Calls("ControllerPublishVolume"); n != 0 {
		t.Fatalf("the node-only host's plugin got %d ControllerPublishVolume calls", n)
	}
	stage, _ := node.plugin.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest)
	if got := stage.GetPublishContext(); !hasValue(got, "/dev/fake/ext-"+vol) {
		t.Fatalf("NodeStageVolume publish context = %v", got)
	}
	if got := ctrl.plugin.ControllerPublished(); got["ext-"+vol] != "csi-n3" {
		t.Fatalf("controller publications = %v", got)
	}
	// Counted after the answer is written, which the claimer may see
	// first.
	eventually(t, "the leader's request counted", func() (bool, error) {
		v := metricValue(t, ctrl, "csiactor_cluster_controller_requests_total", "publish")
		if v > 1 {
			return false, fmt.Errorf("csiactor_cluster_controller_requests_total{op=publish} = %v, want 1", v)
		}
		return v == 1, nil
	})

	if _, err := node.rt.Release(ctx, vol, "app"); err != nil {
		t.Fatal(err)
	}
	node.waitFreed(vol, "app")
	unpub, _ := ctrl.plugin.LastRequest("ControllerUnpublishVolume").(*csipb.ControllerUnpublishVolumeRequest)
	if unpub.GetNodeId() != "csi-n3" || unpub.GetVolumeId() != "ext-"+vol {
		t.Fatalf("controller host's ControllerUnpublishVolume = %v", unpub)
	}
	if got := ctrl.plugin.ControllerPublished(); len(got) != 0 {
		t.Fatalf("controller publications after the release = %v", got)
	}
	eventually(t, "the controller request gone from etcd", func() (bool, error) {
		return etcdKeys(t, srv.Endpoint(), runtime.DefaultClusterPrefix+"/controller/") == 0, nil
	})
}

// TestCluster_RemoteControllerLeaderLost: the controller leader stops
// while it runs a claimer's ControllerPublishVolume (its plugin hangs);
// the next leader runs it and the claim completes.
func TestCluster_RemoteControllerLeaderLost(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	c1 := startAgent(t, "n1", srv.Endpoint())
	c2 := startAgent(t, "n2", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "ldisk", "single-node-writer"
	if _, err := c1.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	leader := leaderOf(t, c1, c2)
	next := c1
	if leader == c1 {
		next = c2
	}
	leader.plugin.SetFault("ControllerPublishVolume", fakeplugin.Fault{Hang: true})
	type result struct {
		c   runtime.Claim
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.c, r.err = claimRetrying(node, vol, claimReq("app", "write", am))
		done <- r
	}()
	eventually(t, "the leader's plugin running ControllerPublishVolume", func() (bool, error) {
		return leader.plugin.Calls("ControllerPublishVolume") > 0, nil
	})
	leader.stop()
	r := <-done
	if r.err != nil || r.c.State != runtime.ClaimPublished {
		t.Fatalf("claim after the leader stopped = %+v, %v", r.c, r.err)
	}
	pub, _ := next.plugin.LastRequest("ControllerPublishVolume").(*csipb.ControllerPublishVolumeRequest)
	if pub.GetNodeId() != "csi-n3" {
		t.Fatalf("next leader's ControllerPublishVolume = %v", pub)
	}
	if got := next.plugin.ControllerPublished(); got["ext-"+vol] != "csi-n3" {
		t.Fatalf("next leader's controller publications = %v", got)
	}
	if _, err := node.rt.Release(ctx, vol, "app"); err != nil {
		t.Fatal(err)
	}
	node.waitFreed(vol, "app")
	if got := next.plugin.ControllerPublished(); len(got) != 0 {
		t.Fatalf("controller publications after the release = %v", got)
	}
}

// TestCluster_RemoteControllerError: a final error of the controller
// host's ControllerPublishVolume reaches the claimer as it would from a
// local controller (InvalidArgument: 400), and the claim is torn down;
// a transient one (Aborted) is retried until it succeeds.
func TestCluster_RemoteControllerError(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startAgent(t, "n1", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "edisk", "single-node-writer"
	if _, err := ctrl.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	ctrl.plugin.SetFault("ControllerPublishVolume", fakeplugin.Fault{Code: codes.InvalidArgument, Message: "bad capability for this disk"})
	_, err := claimOnce(t, node, vol, claimReq("app", "write", am))
	if !errors.Is(err, runtime.ErrInvalid) || !strings.Contains(err.Error(), "bad capability for this disk") ||
		!strings.Contains(err.Error(), "n1") {
		t.Fatalf("claim with the controller answering InvalidArgument = %v, want ErrInvalid naming the answer and host n1", err)
	}
	node.waitFreed(vol, "app")
	ctrl.plugin.ClearFaults()
	ctrl.plugin.SetFault("ControllerPublishVolume", fakeplugin.Fault{Code: codes.Aborted, Message: "busy", Times: 2})
	before := ctrl.plugin.Calls("ControllerPublishVolume")
	if _, err := claimOnce(t, node, vol, claimReq("app", "write", am)); err != nil {
		t.Fatalf("claim with two Aborted answers first: %v", err)
	}
	if n := ctrl.plugin.Calls("ControllerPublishVolume") - before; n != 3 {
		t.Fatalf("ControllerPublishVolume calls = %d, want 3 (two Aborted, then OK)", n)
	}
}

// TestCluster_FenceWithoutController: an agent with no controller of the
// plugin fences a down host: the controller leader runs the unpublish for
// the down host's node ID; then the fencing host claims the volume, its
// publish also run by the leader.
func TestCluster_FenceWithoutController(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startAgent(t, "n1", srv.Endpoint())
	down := startAgent(t, "n2", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "wdisk", "single-node-writer"
	if _, err := ctrl.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	down.waitVolume(vol)
	if _, err := claimOnce(t, down, vol, claimReq("app", "write", am)); err != nil {
		t.Fatal(err)
	}
	down.stop()
	leaderOf(t, ctrl) // n2 led, perhaps: n1 must have taken over
	res, err := node.rt.FenceNode(ctx, "n2")
	if err != nil {
		t.Fatalf("FenceNode(n2) on the node-only host: %v", err)
	}
	if len(res.Claims) != 1 || !res.Claims[0].ControllerUnpublished {
		t.Fatalf("FenceNode(n2) = %+v", res)
	}
	unpub, _ := ctrl.plugin.LastRequest("ControllerUnpublishVolume").(*csipb.ControllerUnpublishVolumeRequest)
	if unpub.GetNodeId() != "csi-n2" || unpub.GetVolumeId() != "ext-"+vol {
		t.Fatalf("leader's ControllerUnpublishVolume = %v, want ext-%s from csi-n2", unpub, vol)
	}
	if _, err := claimOnce(t, node, vol, claimReq("new", "write", am)); err != nil {
		t.Fatalf("claim after the fence: %v", err)
	}
	pub, _ := ctrl.plugin.LastRequest("ControllerPublishVolume").(*csipb.ControllerPublishVolumeRequest)
	if pub.GetNodeId() != "csi-n3" {
		t.Fatalf("leader's ControllerPublishVolume = %v", pub)
	}
}

// TestCluster_AutoFence: with cluster.fence_after set, a host down that
// long is fenced by the controller leader: its claim is unpublished from
// its node ID and taken from it, another host can claim, and the fenced
// host, started again, releases its claim locally.
func TestCluster_AutoFence(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	var as []*agent
	for _, n := range []string{"n1", "n2", "n3"} {
		cfg := clusterConfig(t, n, srv.Endpoint())
		cfg.Cluster.LeaseTTL = 2 * time.Second
		cfg.Cluster.FenceAfter = 3 * time.Second // lease 2s + margin 0.5s < 3s
		as = append(as, startAgentWith(t, n, cfg))
	}
	ctx := context.Background()
	const vol, am = "adisk", "single-node-writer"
	if _, err := as[0].rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		a.waitVolume(vol)
	}
	if _, err := claimOnce(t, as[1], vol, claimReq("app", "write", am)); err != nil {
		t.Fatal(err)
	}
	as[1].stop()
	if _, err := claimOnce(t, as[2], vol, claimReq("new", "write", am)); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("claim while the down host holds it = %v, want ErrConflict", err)
	}
	eventually(t, "the down host fenced automatically", func() (bool, error) {
		_, err := as[2].rt.Claim(ctx, vol, claimReq("new", "write", am))
		if errors.Is(err, runtime.ErrConflict) || unavailable(err) {
			return false, nil
		}
		return err == nil, err
	})
	var unpublished bool
	for _, a := range []*agent{as[0], as[2]} {
		if r, _ := a.plugin.LastRequest("ControllerUnpublishVolume").(*csipb.ControllerUnpublishVolumeRequest); r.GetNodeId() == "csi-n2" {
			unpublished = true
		}
	}
	if !unpublished {
		t.Fatal("no controller unpublished the volume from the fenced host's node csi-n2")
	}
	as[1].start()
	as[1].waitFreed(vol, "app")
	if got := as[1].plugin.Published(); len(got) != 0 {
		t.Fatalf("the fenced host's plugin still publishes %v", got)
	}
	v, err := as[0].rt.Volume(ctx, vol)
	if err != nil || len(v.Claims) != 1 || v.Claims[0].Host != "n3" {
		t.Fatalf("claims after the fenced host came back: %+v, %v", v.Claims, err)
	}
}

func hasValue(m map[string]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

// TestCluster_RemoteControllerClaimerRestart: the claiming host stops
// while it waits for the controller leader's answer; started again, it
// resumes the claim's persisted step, waits for the request still pending
// rather than sending it twice, and the claim is published.
func TestCluster_RemoteControllerClaimerRestart(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startAgent(t, "n1", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "cdisk", "single-node-writer"
	if _, err := ctrl.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	leaderOf(t, ctrl)
	ctrl.plugin.SetFault("ControllerPublishVolume", fakeplugin.Fault{Delay: 2 * time.Second})
	done := make(chan error, 1)
	go func() {
		_, err := claimRetrying(node, vol, claimReq("app", "write", am))
		done <- err
	}()
	eventually(t, "the leader's plugin running ControllerPublishVolume", func() (bool, error) {
		return ctrl.plugin.Calls("ControllerPublishVolume") > 0, nil
	})
	node.stop()
	if err := <-done; err == nil {
		t.Fatal("claim answered although its agent stopped before the controller did")
	}
	node.start()
	eventually(t, "the claim published after the restart", func() (bool, error) {
		v, err := node.rt.Volume(ctx, vol)
		if err != nil {
			return false, err
		}
		for _, c := range v.Claims {
			if c.Alloc == "app" && c.Host == "n3" {
				return c.State == runtime.ClaimPublished, nil
			}
		}
		return false, nil
	})
	if n := ctrl.plugin.Calls("ControllerPublishVolume"); n != 1 {
		t.Fatalf("ControllerPublishVolume calls = %d, want 1: the restarted host waits for its pending request", n)
	}
	stage, _ := node.plugin.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest)
	if !hasValue(stage.GetPublishContext(), "/dev/fake/ext-"+vol) {
		t.Fatalf("NodeStageVolume publish context = %v", stage.GetPublishContext())
	}
}

// TestCluster_RemoteControllerLeaderSessionLost: the controller leader's
// election lease is revoked in etcd (its session ends, as when it is cut
// off for a TTL) while its plugin runs a claimer's ControllerPublishVolume:
// the next leader runs the request and answers it; the old leader's answer,
// if it comes, is refused.
func TestCluster_RemoteControllerLeaderSessionLost(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	c1 := startAgent(t, "n1", srv.Endpoint())
	c2 := startAgent(t, "n2", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "sdisk", "single-node-writer"
	if _, err := c1.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	old := leaderOf(t, c1, c2)
	next := c1
	if old == c1 {
		next = c2
	}
	old.plugin.SetFault("ControllerPublishVolume", fakeplugin.Fault{Delay: 3 * time.Second})
	done := make(chan error, 1)
	go func() {
		_, err := claimRetrying(node, vol, claimReq("app", "write", am))
		done <- err
	}()
	eventually(t, "the leader's plugin running ControllerPublishVolume", func() (bool, error) {
		return old.plugin.Calls("ControllerPublishVolume") > 0, nil
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, runtime.DefaultClusterPrefix+"/leaders/"+testPlugin+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != old.node {
		t.Fatalf("leader key = %v, %v; want %s's", resp, err, old.node)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("claim after the leader lost its election: %v", err)
	}
	if got := next.plugin.ControllerPublished(); got["ext-"+vol] != "csi-n3" {
		t.Fatalf("next leader's controller publications = %v", got)
	}
	eventually(t, "the next leader's answer counted", func() (bool, error) {
		v := metricValue(t, next, "csiactor_cluster_controller_requests_total", "publish")
		if v > 1 {
			return false, fmt.Errorf("next leader answered %v publish requests, want 1", v)
		}
		return v == 1, nil
	})
	eventually(t, "the old leader's term ended, its calls with it", func() (bool, error) {
		return metricValue(t, old, "csiactor_cluster_controller_leader", testPlugin) == 0, nil
	})
	if v := metricValue(t, old, "csiactor_cluster_controller_requests_total", "publish"); v != 0 {
		t.Fatalf("old leader answered %v publish requests after losing its election, want 0", v)
	}
}

// TestCluster_NodeOnlyBeforeAnyController: on a host with only a node
// allocation of a plugin that has a controller service, a claim is refused
// as unavailable (nothing reserved) while no host of the cluster has a
// controller of the plugin to say whether ControllerPublishVolume is
// needed, rather than skipping it; once one joins, the claim goes through
// it.
func TestCluster_NodeOnlyBeforeAnyController(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "odisk", "single-node-writer"
	if _, err := node.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	_, err := node.rt.Claim(ctx, vol, claimReq("app", "write", am))
	if !errors.Is(err, runtime.ErrPluginUnavailable) || !strings.Contains(err.Error(), "no host of the cluster has a controller of it yet") {
		t.Fatalf("claim before any controller joined = %v, want ErrPluginUnavailable saying so", err)
	}
	if v, err := node.rt.Volume(ctx, vol); err != nil || len(v.Claims)+len(v.PastClaims) != 0 {
		t.Fatalf("volume after the refused claim: %+v, %v; want no claims", v, err)
	}
	if n := node.plugin.Calls("NodeStageVolume"); n != 0 {
		t.Fatalf("NodeStageVolume calls = %d, want 0", n)
	}
	ctrl := startAgent(t, "n1", srv.Endpoint())
	ctrl.waitVolume(vol)
	if _, err := claimOnce(t, node, vol, claimReq("app", "write", am)); err != nil {
		t.Fatalf("claim once a controller joined: %v", err)
	}
	if got := ctrl.plugin.ControllerPublished(); got["ext-"+vol] != "csi-n3" {
		t.Fatalf("controller publications = %v", got)
	}
}

// TestCluster_FenceNoController: fencing a down host whose claim went
// through ControllerPublishVolume, when no host of the cluster has a
// controller of the plugin left, is refused as unavailable and leaves the
// claim where it is.
func TestCluster_FenceNoController(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	down := startAgent(t, "n2", srv.Endpoint())
	node := startNodeOnly(t, "n3", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "ndisk", "single-node-writer"
	if _, err := down.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	if _, err := claimOnce(t, down, vol, claimReq("app", "write", am)); err != nil {
		t.Fatal(err)
	}
	down.stop()
	_, err := node.rt.FenceNode(ctx, "n2")
	if !errors.Is(err, runtime.ErrPluginUnavailable) || !strings.Contains(err.Error(), "no healthy controller of plugin") {
		t.Fatalf("FenceNode(n2) with no controller left = %v, want ErrPluginUnavailable", err)
	}
	ns, err := node.rt.Nodes(ctx)
	if err != nil || len(ns) != 2 || ns[0].ID != "n2" || ns[0].Claims != 1 {
		t.Fatalf("nodes after the refused fence = %+v, %v; want n2 still holding its claim", ns, err)
	}
}

// TestCluster_ShutdownWithEtcdDown: agents that lead or campaign for a
// plugin's controller stop while etcd is down: Shutdown returns (it gives
// up on etcd after its dial timeout) and leaves no goroutine behind.
func TestCluster_ShutdownWithEtcdDown(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	as := []*agent{startAgent(t, "n1", srv.Endpoint()), startAgent(t, "n2", srv.Endpoint())}
	leader := leaderOf(t, as...)
	eventually(t, "the other host campaigning", func() (bool, error) {
		return etcdKeys(t, srv.Endpoint(), runtime.DefaultClusterPrefix+"/leaders/"+testPlugin+"/") == 2, nil
	})
	srv.Stop()
	for _, a := range []*agent{as[0], as[1]} {
		done := make(chan error, 1)
		go func() { done <- a.rt.Shutdown(context.Background()) }()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("Shutdown of %s (leader %t) with etcd down: %v", a.node, a == leader, err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("Shutdown of %s (leader %t) with etcd down has not returned after %s", a.node, a == leader, waitLimit)
		}
	}
}

// TestCluster_RemotePublishUndoneRemotely: a claim published through the
// controller leader (its host had no healthy controller then, as a host
// restarting before its plugin is up) is unpublished there too, although
// the host has a healthy controller of its own by its release; run on its
// own controller, the unpublish would leave the leader's publication to
// the host standing, with no claim holding it, and every other host's
// ControllerPublishVolume of the volume failing from then on. Once the
// leader undid it, the host's claims use its own controller again.
func TestCluster_RemotePublishUndoneRemotely(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startAgent(t, "n1", srv.Endpoint())
	node := startNodeOnly(t, "n2", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "udisk", "multi-node-single-writer"
	if _, err := ctrl.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	node.waitVolume(vol)
	if _, err := claimOnce(t, node, vol, claimReq("app", "write", am)); err != nil {
		t.Fatalf("claim on the host without a controller: %v", err)
	}
	if got := ctrl.plugin.ControllerPublished(); got["ext-"+vol] != "csi-n2" {
		t.Fatalf("leader's controller publications = %v, want ext-%s to csi-n2", got, vol)
	}

	// The host gets a controller of its own before the release.
	own, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-n2"})
	if _, err := node.rt.RegisterAllocation(ctx, "ctrl-n2", runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeController, Socket: strings.TrimPrefix(ep, "unix://"),
	}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if err := node.rt.WaitHealthy(wctx, testPlugin, runtime.TypeController); err != nil {
		t.Fatal(err)
	}
	if _, err := node.rt.Release(ctx, vol, "app"); err != nil {
		t.Fatal(err)
	}
	node.waitFreed(vol, "app")
	if got := ctrl.plugin.ControllerPublished(); len(got) != 0 {
		t.Fatalf("leader's controller publications after the release = %v, want none", got)
	}
	if n := own.Calls("ControllerUnpublishVolume"); n != 0 {
		t.Fatalf("the host's own controller got %d ControllerUnpublishVolume calls, want 0: the leader published", n)
	}
	eventually(t, "the controller request gone from etcd", func() (bool, error) {
		return etcdKeys(t, srv.Endpoint(), runtime.DefaultClusterPrefix+"/controller/") == 0, nil
	})

	// The leader's host can publish the volume to itself again, once it
	// has seen the release (its watch of the claims may lag behind etcd;
	// until then admission refuses, the safe way).
	ctrl.waitFreed(vol, "app")
	cctx, ccancel := context.WithTimeout(ctx, waitLimit)
	defer ccancel()
	if _, err := ctrl.rt.Claim(cctx, vol, claimReq("other", "write", am)); err != nil {
		t.Fatalf("claim on the leader's host after the release: %v", err)
	}
	if _, err := ctrl.rt.Release(ctx, vol, "other"); err != nil {
		t.Fatal(err)
	}
	ctrl.waitFreed(vol, "other")

	// Nothing of the host's is left with the leader: its next claim
	// uses its own controller.
	if _, err := claimOnce(t, node, vol, claimReq("app2", "read", am)); err != nil {
		t.Fatalf("second claim on the host: %v", err)
	}
	if n := own.Calls("ControllerPublishVolume"); n != 1 {
		t.Fatalf("the host's own controller got %d ControllerPublishVolume calls, want 1", n)
	}
	if _, err := node.rt.Release(ctx, vol, "app2"); err != nil {
		t.Fatal(err)
	}
	node.waitFreed(vol, "app2")
}

// TestCluster_FenceUndoesRemotePublish: a host whose claim the controller
// leader published is fenced through another host with a controller of
// its own: the unpublish goes to the leader, where the host's request is,
// and the leader's publication to the fenced host is gone.
func TestCluster_FenceUndoesRemotePublish(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	c1 := startAgent(t, "n1", srv.Endpoint())
	c3 := startAgent(t, "n3", srv.Endpoint())
	down := startNodeOnly(t, "n2", srv.Endpoint())
	ctx := context.Background()
	const vol, am = "fdisk", "single-node-writer"
	if _, err := c1.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	down.waitVolume(vol)
	c3.waitVolume(vol)
	leader := leaderOf(t, c1, c3)
	via := c1
	if leader == c1 {
		via = c3
	}
	if _, err := claimOnce(t, down, vol, claimReq("app", "write", am)); err != nil {
		t.Fatal(err)
	}
	if got := leader.plugin.ControllerPublished(); got["ext-"+vol] != "csi-n2" {
		t.Fatalf("leader's controller publications = %v, want ext-%s to csi-n2", got, vol)
	}
	down.stop()
	eventually(t, "n2 down", func() (bool, error) {
		n, err := via.rt.Node(ctx, "n2")
		return err == nil && n.Status == runtime.NodeDown, nil
	})
	res, err := via.rt.FenceNode(ctx, "n2")
	if err != nil || len(res.Claims) != 1 || !res.Claims[0].ControllerUnpublished {
		t.Fatalf("FenceNode(n2) = %+v, %v", res, err)
	}
	if got := leader.plugin.ControllerPublished(); len(got) != 0 {
		t.Fatalf("leader's controller publications after the fence = %v, want none", got)
	}
	if n := via.plugin.Calls("ControllerUnpublishVolume"); n != 0 {
		t.Fatalf("the fencing host's own controller got %d ControllerUnpublishVolume calls, want 0", n)
	}
	eventually(t, "the controller request gone from etcd", func() (bool, error) {
		return etcdKeys(t, srv.Endpoint(), runtime.DefaultClusterPrefix+"/controller/") == 0, nil
	})
	cctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if _, err := via.rt.Claim(cctx, vol, claimReq("next", "write", am)); err != nil {
		t.Fatalf("claim after the fence: %v", err)
	}
}
