package cluster_test

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// threeAgents starts an etcd server and three agents on it, n1..n3.
func threeAgents(t *testing.T) (*etcdtest.Server, []*agent) {
	t.Helper()
	t.Cleanup(leakcheck.Check(t)) // last: after the agents and the server stopped
	srv := etcdtest.Start(t)
	var as []*agent
	for i := 1; i <= 3; i++ {
		as = append(as, startAgent(t, fmt.Sprintf("n%d", i), srv.Endpoint()))
	}
	return srv, as
}

// TestCluster_VolumeVisibleEverywhere: a volume registered on one agent
// is registered on the others, with its secrets and mount flags; another
// external ID under its ID is refused (it never changes), the same
// definition is not; deregistering it on one removes it everywhere.
func TestCluster_VolumeVisibleEverywhere(t *testing.T) {
	_, as := threeAgents(t)
	ctx := context.Background()
	spec := volSpec("shared", "single-node-writer")
	spec.Secrets = map[string]string{"token": "s3cret"}
	spec.MountOptions = &runtime.MountOptions{FSType: "ext4", MountFlags: []string{"noatime"}}
	if _, err := as[1].rt.RegisterVolume(ctx, "shared", spec); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		a.waitVolume("shared")
	}
	_, err := as[2].rt.RegisterVolume(ctx, "shared", volSpec("other", "single-node-writer"))
	if !errors.Is(err, runtime.ErrInvalid) || !strings.Contains(err.Error(), "external_id") {
		t.Fatalf("another external ID = %v, want ErrInvalid naming external_id", err)
	}
	if _, err := as[2].rt.RegisterVolume(ctx, "shared", spec); err != nil {
		t.Fatalf("the same definition again, on a host that learnt it from the cluster: %v", err)
	}
	// A host that learnt the volume from the cluster sends its plugin the
	// secrets and mount flags it was registered with.
	if _, err := as[0].rt.Claim(ctx, "shared", claimReq("a1", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	pub, ok := as[0].plugin.LastRequest("NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	if !ok {
		t.Fatal("the plugin got no NodePublishVolume")
	}
	if got := pub.GetSecrets()["token"]; got != "s3cret" {
		t.Errorf("NodePublishVolume secret token = %q, want the registered one", got)
	}
	if got := pub.GetVolumeCapability().GetMount().GetMountFlags(); len(got) != 1 || got[0] != "noatime" {
		t.Errorf("NodePublishVolume mount flags = %q, want [noatime]", got)
	}
	if _, err := as[0].rt.Release(ctx, "shared", "a1"); err != nil {
		t.Fatal(err)
	}
	as[0].waitFreed("shared", "a1")
	if err := as[0].rt.DeleteVolume(ctx, "shared", false); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		eventually(t, "volume gone on "+a.node, func() (bool, error) {
			_, err := a.rt.Volume(ctx, "shared")
			return errors.Is(err, runtime.ErrNotFound), nil
		})
	}
}

// TestCluster_ReadyAfterListing: an agent that joins a cluster holding
// more volume definitions than one page of its listing says it is ready
// only once it has every one of them: from then on it lists and claims
// every volume of the cluster.
func TestCluster_ReadyAfterListing(t *testing.T) {
	srv := etcdtest.Start(t)
	a := startAgent(t, "a", srv.Endpoint())
	ctx := context.Background()
	const n = 600 // more than a page
	for i := range n {
		id := fmt.Sprintf("v%03d", i)
		if _, err := a.rt.RegisterVolume(ctx, id, volSpec(id, "single-node-writer")); err != nil {
			t.Fatal(err)
		}
	}
	b := startAgent(t, "b", srv.Endpoint())
	eventually(t, "b ready", func() (bool, error) {
		r, err := b.rt.Ready(ctx)
		return r.Status == runtime.ReadyOK, err
	})
	vs, err := b.rt.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != n {
		t.Fatalf("b lists %d volumes once ready, want %d", len(vs), n)
	}
	if _, err := b.rt.Claim(ctx, fmt.Sprintf("v%03d", n-1), claimReq("b1", "write", "single-node-writer")); err != nil {
		t.Fatalf("claim on the last volume listed: %v", err)
	}
}

// TestCluster_SingleNodeWriter300: 300 concurrent write claims from 3
// agents on one single-node-writer volume: exactly one wins, the other
// 299 get ErrConflict (HTTP 409). After its release the volume can be
// claimed from another host, and not while it is held.
func TestCluster_SingleNodeWriter300(t *testing.T) {
	_, as := threeAgents(t)
	ctx := context.Background()
	const vol, am = "disk", "single-node-writer"
	if _, err := as[0].rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		a.waitVolume(vol)
	}
	const n = 300
	type result struct {
		agent int
		alloc string
		err   error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := i % 3
			alloc := fmt.Sprintf("w-%d", i)
			<-start
			_, err := as[a].rt.Claim(ctx, vol, claimReq(alloc, "write", am))
			results[i] = result{a, alloc, err}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(began)
	var winners []result
	conflicts := 0
	for _, r := range results {
		switch {
		case r.err == nil:
			winners = append(winners, r)
		case errors.Is(r.err, runtime.ErrConflict):
			conflicts++
		default:
			t.Errorf("claim of %s on %s: %v (want nil or ErrConflict)", r.alloc, as[r.agent].node, r.err)
		}
	}
	if len(winners) != 1 || conflicts != n-1 {
		t.Fatalf("%d winners %+v, %d conflicts; want 1 and %d", len(winners), winners, conflicts, n-1)
	}
	w := winners[0]
	t.Logf("%d claims from 3 agents in %s: %s on %s won, %d conflicts", n, took.Round(time.Millisecond), w.alloc, as[w.agent].node, conflicts)
	// Every agent's view shows the one claim and its host.
	for _, a := range as {
		v, err := a.rt.Volume(ctx, vol)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Claims) != 1 || v.Claims[0].Alloc != w.alloc || v.Claims[0].Host != as[w.agent].node {
			t.Fatalf("volume on %s: claims %+v, want %s on %s", a.node, v.Claims, w.alloc, as[w.agent].node)
		}
		if a == as[w.agent] && v.Claims[0].State != runtime.ClaimPublished {
			t.Fatalf("winner's claim state %q", v.Claims[0].State)
		}
	}
	other := as[(w.agent+1)%3]
	if _, err := other.rt.Claim(ctx, vol, claimReq("late", "write", am)); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("claim while held = %v", err)
	}
	if err := other.rt.DeleteVolume(ctx, vol, false); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("deregister while claimed elsewhere = %v, want ErrConflict", err)
	}
	if _, err := as[w.agent].rt.Release(ctx, vol, w.alloc); err != nil {
		t.Fatal(err)
	}
	as[w.agent].waitFreed(vol, w.alloc)
	eventually(t, "claim from another host after the release", func() (bool, error) {
		_, err := other.rt.Claim(ctx, vol, claimReq("late", "write", am))
		if errors.Is(err, runtime.ErrConflict) {
			return false, nil // the free reaches etcd in the background
		}
		return err == nil, err
	})
}

// TestCluster_MultiNodeSingleWriter: readers on every host, one writer in
// the cluster among writers racing on all three.
func TestCluster_MultiNodeSingleWriter(t *testing.T) {
	_, as := threeAgents(t)
	ctx := context.Background()
	const vol, am = "lun", "multi-node-single-writer"
	if _, err := as[2].rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		a.waitVolume(vol)
		for j := range 3 {
			if _, err := a.rt.Claim(ctx, vol, claimReq(fmt.Sprintf("r-%s-%d", a.node, j), "read", am)); err != nil {
				t.Fatalf("reader on %s: %v", a.node, err)
			}
		}
	}
	var mu sync.Mutex
	var won []string
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := as[i%3]
			alloc := fmt.Sprintf("w-%d", i)
			_, err := a.rt.Claim(ctx, vol, claimReq(alloc, "write", am))
			switch {
			case err == nil:
				mu.Lock()
				won = append(won, a.node+"/"+alloc)
				mu.Unlock()
			case !errors.Is(err, runtime.ErrConflict):
				t.Errorf("writer %s on %s: %v", alloc, a.node, err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("writers admitted: %v, want one", won)
	}
	v, err := as[0].rt.Volume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]int{}
	writers := 0
	for _, c := range v.Claims {
		hosts[c.Host]++
		if c.Mode == "write" {
			writers++
		}
	}
	if len(v.Claims) != 10 || writers != 1 || len(hosts) != 3 {
		t.Fatalf("claims seen from n1: %+v", v.Claims)
	}
	t.Logf("9 readers on 3 hosts and writer %s", won[0])
	// The hosts and their claims, and the metrics.
	ns, err := as[0].rt.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range ns {
		if n.Status != runtime.NodeUp {
			t.Fatalf("node %+v not up", n)
		}
		total += n.Claims
	}
	if len(ns) != 3 || total != 10 || !ns[0].Self || ns[0].ID != "n1" {
		t.Fatalf("Nodes = %+v", ns)
	}
	waitHostsGauge(t, as[0], 3, 0)
	if n, err := testutil.GatherAndCount(as[0].reg, "csiactor_cluster_etcd_request_seconds", "csiactor_cluster_lease_renewals_total"); err != nil || n == 0 {
		t.Fatalf("cluster metrics: %d series, %v", n, err)
	}
}

// TestCluster_EtcdDown: with etcd down, new claims fail with
// ErrClusterUnavailable (HTTP 503) while the published claim stays
// published; once etcd is back, claims are admitted again. A host that
// shut down is listed down, its claims kept.
func TestCluster_EtcdDown(t *testing.T) {
	srv, as := threeAgents(t)
	ctx := context.Background()
	const vol, am = "shared-fs", "multi-node-multi-writer"
	if _, err := as[0].rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	as[0].waitVolume(vol)
	if _, err := as[0].rt.Claim(ctx, vol, claimReq("before", "write", am)); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	_, err := as[0].rt.Claim(ctx, vol, claimReq("during", "write", am))
	if !errors.Is(err, runtime.ErrClusterUnavailable) {
		t.Fatalf("claim with etcd down = %v, want ErrClusterUnavailable", err)
	}
	t.Log(err)
	v, err := as[0].rt.Volume(ctx, vol)
	if err != nil || len(v.Claims) != 1 || v.Claims[0].State != runtime.ClaimPublished {
		t.Fatalf("published claim during the outage: %+v, %v", v.Claims, err)
	}
	srv.Restart()
	eventually(t, "claims admitted again", func() (bool, error) {
		_, err := as[0].rt.Claim(ctx, vol, claimReq("after", "write", am))
		if errors.Is(err, runtime.ErrClusterUnavailable) {
			return false, nil
		}
		return err == nil, err
	})
	as[1].waitVolume(vol)
	eventually(t, "claims admitted again on n2", func() (bool, error) {
		_, err := as[1].rt.Claim(ctx, vol, claimReq("on-n2", "write", am))
		if errors.Is(err, runtime.ErrClusterUnavailable) {
			return false, nil
		}
		return err == nil, err
	})
	as[1].stop()
	// Down once its lease is gone: revoked on the way out (within
	// cluster.LeaveTimeout, which a loaded machine may overrun; then the
	// lease expires at its TTL), and seen through n1's watch.
	var ns []runtime.Node
	eventually(t, "n2 listed down with its claim", func() (bool, error) {
		var err error
		ns, err = as[0].rt.Nodes(ctx)
		return err == nil && len(ns) > 1 && ns[1].ID == "n2" && ns[1].Status == runtime.NodeDown, err
	})
	if ns[1].Claims != 1 {
		t.Fatalf("n2 after shutdown: %+v (want down with its claim)", ns[1])
	}
	// The gauge counts it down too (from counts of the host records and
	// the liveness keys, at n1's next renewal).
	waitHostsGauge(t, as[0], 2, 1)
	// With every agent shut down and etcd still up, no goroutine of the
	// etcd client or of the cluster package is left.
	as[0].stop()
	as[2].stop()
	noClientGoroutines(t)
}

// noClientGoroutines fails t if a goroutine of the etcd client (or a gRPC
// client transport: the agents' CSI clients are closed too) or of the
// cluster package is still running after a grace period.
func noClientGoroutines(t *testing.T) {
	t.Helper()
	var left []string
	deadline := time.Now().Add(leakcheck.Grace)
	for {
		left = left[:0]
		buf := make([]byte, 1<<22)
		buf = buf[:goruntime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "etcd/server/") {
				continue // the embedded server's, which goes on running
			}
			if strings.Contains(g, "go.etcd.io/etcd/client/v3") || strings.Contains(g, "csiactor/cluster.(*Session)") ||
				strings.Contains(g, "grpc/internal/transport.NewHTTP2Client") {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("%d etcd client goroutines left after Shutdown:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// TestCluster_ThreeMembers: against a 3-member etcd, claims go on being
// admitted with one member down; with all down they fail with
// ErrClusterUnavailable; with all back they are admitted again.
func TestCluster_ThreeMembers(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	members := etcdtest.StartCluster(t, 3)
	ctx := context.Background()
	var as []*agent
	for i := 1; i <= 2; i++ {
		cfg := clusterConfig(t, fmt.Sprintf("n%d", i), "")
		cfg.Cluster.Etcd.Endpoints = etcdtest.Endpoints(members)
		as = append(as, startAgentWith(t, fmt.Sprintf("n%d", i), cfg))
	}
	const vol, am = "mm", "multi-node-single-writer"
	if _, err := as[0].rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	as[1].waitVolume(vol)
	claimOn := func(a *agent, alloc string) error {
		_, err := a.rt.Claim(ctx, vol, claimReq(alloc, "read", am))
		return err
	}
	if err := claimOn(as[0], "r0"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	step := func(what string) { t.Logf("%s at %s", what, time.Since(began).Round(time.Millisecond)) }
	members[0].Stop()
	step("member m1 stopped")
	for i, a := range as {
		alloc := fmt.Sprintf("one-down-%d", i)
		eventually(t, "a claim with one member down on "+a.node, func() (bool, error) {
			err := claimOn(a, alloc)
			if errors.Is(err, runtime.ErrClusterUnavailable) {
				t.Logf("while the client fails over: %v", err)
				return false, nil
			}
			return err == nil, err
		})
	}
	if _, err := as[1].rt.Claim(ctx, vol, claimReq("w1", "write", am)); err != nil {
		t.Fatal(err)
	}
	if _, err := as[0].rt.Claim(ctx, vol, claimReq("w0", "write", am)); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("second writer with one member down = %v, want ErrConflict", err)
	}
	step("claims admitted with m1 down")
	members[1].Stop()
	members[2].Stop()
	step("every member stopped")
	if err := claimOn(as[0], "all-down"); !errors.Is(err, runtime.ErrClusterUnavailable) {
		t.Fatalf("claim with every member down = %v, want ErrClusterUnavailable", err)
	}
	step("claim refused")
	etcdtest.RestartAll(t, members)
	step("every member back")
	for _, a := range as {
		eventually(t, "claims admitted again on "+a.node, func() (bool, error) {
			err := claimOn(a, "back-"+a.node)
			if errors.Is(err, runtime.ErrClusterUnavailable) {
				return false, nil
			}
			return err == nil, err
		})
	}
	step("claims admitted again")
	v, err := as[0].rt.Volume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	writers := 0
	for _, c := range v.Claims {
		if c.Mode == "write" {
			writers++
		}
	}
	if len(v.Claims) != 6 || writers != 1 {
		t.Fatalf("claims after the outage: %+v", v.Claims)
	}
}

// waitHostsGauge waits until a's csiactor_cluster_hosts shows up hosts up
// and down hosts down.
func waitHostsGauge(t *testing.T, a *agent, up, down int) {
	t.Helper()
	want := fmt.Sprintf(`
# HELP csiactor_cluster_hosts Hosts of the cluster by status (up: its lease is alive; down: it expired), as this agent last saw them.
# TYPE csiactor_cluster_hosts gauge
csiactor_cluster_hosts{status="down"} %d
csiactor_cluster_hosts{status="up"} %d
`, down, up)
	eventually(t, fmt.Sprintf("csiactor_cluster_hosts at %d up, %d down", up, down), func() (bool, error) {
		return testutil.GatherAndCompare(a.reg, strings.NewReader(want), "csiactor_cluster_hosts") == nil, nil
	})
}
