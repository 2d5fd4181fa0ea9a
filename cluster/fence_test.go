package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// TestCluster_Fence: a host that went down keeps its claim, which blocks
// other writers; fencing it runs ControllerUnpublishVolume for its node ID
// on the fencing agent's controller and lets another host claim; the
// fenced host, started again, releases its claim locally and leaves the
// new holder's claim alone.
func TestCluster_Fence(t *testing.T) {
	_, as := threeAgents(t)
	ctx := context.Background()
	const vol, am = "fdisk", "single-node-writer"
	if _, err := as[0].rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		a.waitVolume(vol)
	}
	if _, err := as[1].rt.Claim(ctx, vol, claimReq("app", "write", am)); err != nil {
		t.Fatal(err)
	}
	as[1].stop() // n2 is down, its claim published on its host
	if _, err := as[2].rt.Claim(ctx, vol, claimReq("new", "write", am)); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("claim while the down host holds it = %v, want ErrConflict", err)
	}
	for _, tc := range []struct {
		node string
		want error
	}{{"n1", runtime.ErrConflict}, {"n3", runtime.ErrConflict}, {"n9", runtime.ErrNotFound}} {
		if _, err := as[0].rt.FenceNode(ctx, tc.node); !errors.Is(err, tc.want) {
			t.Fatalf("FenceNode(%s) = %v, want %v", tc.node, err, tc.want)
		}
	}
	// Through the API and the CLI: an up host is refused (409), the down
	// one fenced.
	addr := serveAPI(t, as[0].rt)
	var out, errOut bytes.Buffer
	if code := cli.Run(ctx, []string{"node", "fence", "-address", addr, "n3"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "only a down host can be fenced") {
		t.Fatalf("node fence n3: exit %d, %s", code, errOut.String())
	}
	cl, err := api.NewClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res, err := cl.FenceNode(ctx, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Claims) != 1 || res.Claims[0].Alloc != "app" || !res.Claims[0].ControllerUnpublished {
		t.Fatalf("FenceNode(n2) = %+v", res)
	}
	req, _ := as[0].plugin.LastRequest("ControllerUnpublishVolume").(*csipb.ControllerUnpublishVolumeRequest)
	if req.GetNodeId() != "csi-n2" || req.GetVolumeId() != "ext-"+vol {
		t.Fatalf("fencing agent's ControllerUnpublishVolume = %v, want volume ext-%s from node csi-n2", req, vol)
	}
	if _, err := as[2].rt.Claim(ctx, vol, claimReq("new", "write", am)); err != nil {
		t.Fatalf("claim after the fence: %v", err)
	}
	// n2 comes back: it releases its fenced claim, and only its own.
	as[1].start()
	as[1].waitFreed(vol, "app")
	if got := as[1].plugin.Published(); len(got) != 0 {
		t.Fatalf("n2's plugin still publishes %v", got)
	}
	eventually(t, "n2 without claims in the cluster", func() (bool, error) {
		ns, err := as[0].rt.Nodes(ctx)
		if err != nil {
			return false, err
		}
		return ns[1].Status == runtime.NodeUp && ns[1].Claims == 0, nil
	})
	v, err := as[0].rt.Volume(ctx, vol)
	if err != nil || len(v.Claims) != 1 || v.Claims[0].Host != "n3" || v.Claims[0].Alloc != "new" {
		t.Fatalf("claims after n2 came back: %+v, %v", v.Claims, err)
	}
	// Fencing it again finds nothing to fence: it is up.
	if _, err := as[0].rt.FenceNode(ctx, "n2"); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("FenceNode(n2) while up = %v", err)
	}
}

// TestCluster_AdoptLocalClaims: an agent that held claims before cluster
// mode was turned on records them in etcd when it joins, so they block
// other hosts.
func TestCluster_AdoptLocalClaims(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctx := context.Background()
	const vol, am = "old-disk", "single-node-writer"
	cfg := clusterConfig(t, "n1", srv.Endpoint())
	clusterSection := cfg.Cluster
	cfg.Cluster = nil
	a := startAgentWith(t, "n1", cfg)
	if _, err := a.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.rt.Claim(ctx, vol, claimReq("old", "write", am)); err != nil {
		t.Fatal(err)
	}
	a.stop()
	a.cfg.Cluster = clusterSection
	a.start()
	b := startAgent(t, "n2", srv.Endpoint())
	// The volume was not shared (registered before); register it on n2.
	if _, err := b.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.rt.Claim(ctx, vol, claimReq("new", "write", am)); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("claim on n2 over n1's adopted claim = %v, want ErrConflict", err)
	}
	ns, err := b.rt.Nodes(ctx)
	if err != nil || len(ns) != 2 || ns[0].Claims != 1 {
		t.Fatalf("Nodes = %+v, %v", ns, err)
	}
}
