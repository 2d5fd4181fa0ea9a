package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// twoAgents starts an etcd server and two agents on it, n1 and n2.
func twoAgents(t *testing.T) (*etcdtest.Server, *agent, *agent) {
	t.Helper()
	t.Cleanup(leakcheck.Check(t)) // last: after the agents and the server stopped
	srv := etcdtest.Start(t)
	return srv, startAgent(t, "n1", srv.Endpoint()), startAgent(t, "n2", srv.Endpoint())
}

// waitParams waits until a's record of vol has the parameters want.
func (a *agent) waitParams(vol string, want map[string]string) {
	a.t.Helper()
	eventually(a.t, fmt.Sprintf("parameters %v of %s on %s", want, vol, a.node), func() (bool, error) {
		v, err := a.rt.Volume(context.Background(), vol)
		return err == nil && maps.Equal(v.Parameters, want), err
	})
}

// publishedSecret claims vol on a for alloc, returns the secret key the
// plugin got in NodePublishVolume, and releases the claim.
func (a *agent) publishedSecret(vol, alloc, accessMode, key string) string {
	a.t.Helper()
	ctx := context.Background()
	if _, err := a.rt.Claim(ctx, vol, claimReq(alloc, "write", accessMode)); err != nil {
		a.t.Fatalf("claim %s on %s: %v", vol, a.node, err)
	}
	pub, ok := a.plugin.LastRequest("NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	if !ok {
		a.t.Fatalf("%s's plugin got no NodePublishVolume", a.node)
	}
	if _, err := a.rt.Release(ctx, vol, alloc); err != nil {
		a.t.Fatal(err)
	}
	a.waitFreed(vol, alloc)
	return pub.GetSecrets()[key]
}

// TestCluster_UpdateRules: PUT of a registered volume in cluster mode,
// from either host, by the one-host rules applied to the claims of every
// host. Unclaimed, any field but the plugin and the external ID changes,
// on the host that registered it or another, and every host has the new
// definition. While a host holds a claim, a field other than the secrets
// is refused on every host (ErrConflict naming the claim and its host,
// and the field), and the definition stays as it was everywhere; the
// secrets change, and the next RPC on the other hosts sends the new ones.
func TestCluster_UpdateRules(t *testing.T) {
	_, n1, n2 := twoAgents(t)
	ctx := context.Background()
	const vol, am = "upd", "multi-node-multi-writer"
	spec := volSpec(vol, am)
	spec.Secrets = map[string]string{"token": "one"}
	if _, err := n1.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatal(err)
	}
	n2.waitVolume(vol)

	// Unclaimed: on the other host, then on the registering one.
	spec.Parameters = map[string]string{"tier": "fast"}
	spec.MountOptions = &runtime.MountOptions{FSType: "ext4", MountFlags: []string{"noatime"}}
	if _, err := n2.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatalf("update on n2, unclaimed: %v", err)
	}
	n1.waitParams(vol, spec.Parameters)
	spec.Parameters = map[string]string{"tier": "slow"}
	if _, err := n1.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatalf("update on n1, unclaimed: %v", err)
	}
	n2.waitParams(vol, spec.Parameters)
	if v, err := n2.rt.Volume(ctx, vol); err != nil || v.MountOptions == nil || v.MountOptions.FSType != "ext4" || v.MountOptions.MountFlagCount != 1 {
		t.Fatalf("n2's record after the updates: %+v, %v; want fs ext4 with one mount flag", v.MountOptions, err)
	}
	// The plugin and the external ID never change, from any host.
	bad := spec
	bad.ExternalID = "ext-other"
	if _, err := n2.rt.RegisterVolume(ctx, vol, bad); !errors.Is(err, runtime.ErrInvalid) || !strings.Contains(err.Error(), "external_id") {
		t.Fatalf("another external ID on n2 = %v, want ErrInvalid naming external_id", err)
	}

	// n2 claims: no host changes a field but the secrets.
	if _, err := n2.rt.Claim(ctx, vol, claimReq("a2", "write", am)); err != nil {
		t.Fatal(err)
	}
	for _, a := range []*agent{n1, n2} {
		for field, change := range map[string]func(*runtime.VolumeSpec){
			"parameters":    func(s *runtime.VolumeSpec) { s.Parameters = map[string]string{"tier": "gold"} },
			"mount_options": func(s *runtime.VolumeSpec) { s.MountOptions = nil },
			"context":       func(s *runtime.VolumeSpec) { s.Context = map[string]string{"k": "v"} },
		} {
			next := spec
			change(&next)
			next.Secrets = map[string]string{"token": "refused-" + a.node}
			_, err := a.rt.RegisterVolume(ctx, vol, next)
			if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), `alloc "a2" on host "n2"`) || !strings.Contains(err.Error(), field) {
				t.Errorf("%s changed on %s while n2 holds a claim = %v; want ErrConflict naming the claim, its host and %s", field, a.node, err, field)
			}
		}
	}
	for _, a := range []*agent{n1, n2} {
		if v, err := a.rt.Volume(ctx, vol); err != nil || !maps.Equal(v.Parameters, spec.Parameters) {
			t.Fatalf("%s's record after the refused updates: %v, %v; want %v", a.node, v.Parameters, err, spec.Parameters)
		}
	}
	// The secrets change at any time, from either host.
	spec.Secrets = map[string]string{"token": "two"}
	if _, err := n1.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatalf("secrets changed on n1 while n2 holds a claim: %v", err)
	}
	eventually(t, "the secrets update on n2", func() (bool, error) {
		evs, err := n2.rt.Events(ctx)
		for _, e := range evs {
			if e.Type == runtime.EventVolumeUpdated && e.Volume == vol && strings.Contains(e.Message, "secrets") {
				return true, nil
			}
		}
		return false, err
	})
	if got := n2.publishedSecret(vol, "b2", am, "token"); got != "two" {
		t.Errorf("n2's next NodePublishVolume sent secret %q, want the update's", got)
	}
	spec.Secrets = map[string]string{"token": "three"}
	if _, err := n2.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatalf("secrets changed on n2, which holds a claim: %v", err)
	}
	eventually(t, "n1 sending the secrets n2 set", func() (bool, error) {
		return n1.publishedSecret(vol, "b1", am, "token") == "three", nil
	})
	if _, err := n2.rt.Release(ctx, vol, "a2"); err != nil {
		t.Fatal(err)
	}
	n2.waitFreed(vol, "a2")
	// n2 frees its claim locally first, then in etcd: n1 shows the
	// claim (as remote) until then, and refuses the update meanwhile.
	n1.waitFreed(vol, "a2")
	// Released everywhere: the other fields change again.
	spec.Parameters = map[string]string{"tier": "gold"}
	if _, err := n1.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatalf("update on n1 once n2 released its claim: %v", err)
	}
	n2.waitParams(vol, spec.Parameters)
}

// TestCluster_ConcurrentUpdates: both hosts update one volume at once,
// again and again, one only its secrets and parameters, the other its
// parameters. Every update succeeds (a lost compare-and-swap reads the
// definition again) or is a clean ErrConflict; none is lost: etcd holds
// the last one written, and both hosts end with it.
func TestCluster_ConcurrentUpdates(t *testing.T) {
	srv, n1, n2 := twoAgents(t)
	ctx := context.Background()
	const vol, rounds = "race", 20
	spec := volSpec(vol, "single-node-writer")
	if _, err := n1.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatal(err)
	}
	n2.waitVolume(vol)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	key := runtime.DefaultClusterPrefix + "/volumes/" + vol
	for i := range rounds {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, a := range []*agent{n1, n2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := spec
				s.Parameters = map[string]string{"by": fmt.Sprintf("%s-%d", a.node, i)}
				s.Secrets = map[string]string{"token": fmt.Sprintf("%s-%d", a.node, i)}
				_, errs[j] = a.rt.RegisterVolume(ctx, vol, s)
			}()
		}
		wg.Wait()
		won := 0
		for j, err := range errs {
			switch {
			case err == nil:
				won++
			case errors.Is(err, runtime.ErrConflict):
			default:
				t.Fatalf("round %d: update on n%d: %v; want success or a clean conflict", i, j+1, err)
			}
		}
		if won == 0 {
			t.Fatalf("round %d: no update succeeded: %v", i, errs)
		}
		// etcd has one of them, and both hosts have what etcd has.
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("round %d: read %s: %v", i, key, err)
		}
		var def struct {
			Spec struct {
				Parameters map[string]string `json:"parameters"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(resp.Kvs[0].Value, &def); err != nil {
			t.Fatal(err)
		}
		by := def.Spec.Parameters["by"]
		if by != fmt.Sprintf("n1-%d", i) && by != fmt.Sprintf("n2-%d", i) {
			t.Fatalf("round %d: etcd holds parameters %v, want one of this round's", i, def.Spec.Parameters)
		}
		if errs[0] != nil && by == fmt.Sprintf("n1-%d", i) || errs[1] != nil && by == fmt.Sprintf("n2-%d", i) {
			t.Fatalf("round %d: etcd holds %q, whose update failed: %v", i, by, errs)
		}
		for _, a := range []*agent{n1, n2} {
			a.waitParams(vol, def.Spec.Parameters)
		}
	}
}

// TestCluster_UpdateAgainstClaim: one host updates a volume's context
// while the other claims it, at once, again and again. Either the claim
// came first (the update is refused, naming it) or the update did (the
// claim publishes with the new context, or is refused): a claim never
// publishes with a definition etcd no longer has, and every host ends
// with etcd's definition.
func TestCluster_UpdateAgainstClaim(t *testing.T) {
	_, n1, n2 := twoAgents(t)
	ctx := context.Background()
	const vol, am, rounds = "vs", "single-node-writer", 30
	spec := volSpec(vol, am)
	if _, err := n1.rt.RegisterVolume(ctx, vol, spec); err != nil {
		t.Fatal(err)
	}
	n2.waitVolume(vol)
	for i := range rounds {
		next := spec
		next.Context = map[string]string{"round": fmt.Sprint(i)}
		var wg sync.WaitGroup
		var updErr, claimErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, updErr = n1.rt.RegisterVolume(ctx, vol, next)
		}()
		go func() {
			defer wg.Done()
			_, claimErr = n2.rt.Claim(ctx, vol, claimReq("a", "write", am))
		}()
		wg.Wait()
		if updErr != nil && !errors.Is(updErr, runtime.ErrConflict) || claimErr != nil && !errors.Is(claimErr, runtime.ErrConflict) {
			t.Fatalf("round %d: update %v, claim %v; want each to succeed or be a clean conflict", i, updErr, claimErr)
		}
		if updErr == nil {
			spec = next
		}
		if claimErr == nil {
			pub, _ := n2.plugin.LastRequest("NodePublishVolume").(*csipb.NodePublishVolumeRequest)
			if got := pub.GetVolumeContext(); !maps.Equal(got, spec.Context) {
				t.Fatalf("round %d (update %v): n2 published with context %v, want the cluster's %v", i, updErr, got, spec.Context)
			}
			if _, err := n2.rt.Release(ctx, vol, "a"); err != nil {
				t.Fatal(err)
			}
			n2.waitFreed(vol, "a")
		}
		for _, a := range []*agent{n1, n2} {
			eventually(t, fmt.Sprintf("round %d: context %v on %s", i, spec.Context, a.node), func() (bool, error) {
				v, err := a.rt.Volume(ctx, vol)
				return err == nil && maps.Equal(v.Context, spec.Context), err
			})
		}
	}
}
