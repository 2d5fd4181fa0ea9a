package cluster_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

// answering answers every controller request with OK.
type answering struct{}

func (answering) Handle(context.Context, cluster.ControllerRequest) cluster.ControllerAnswer {
	return cluster.ControllerAnswer{}
}
func (answering) Lead(ctx context.Context) { <-ctx.Done() }

// TestCluster_SweepAbandonedAnswers: the plugin's controller leader
// removes, when it is elected, the answers to one-shot requests older
// than the retention that their requesters never read; it keeps younger
// ones, and the claim steps (removed by their own unpublish) whatever
// their age.
func TestCluster_SweepAbandonedAnswers(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the session and the server stopped
	srv := etcdtest.Start(t)
	cli := directClient(t, srv.Endpoint())
	ctx := context.Background()
	const plugin = "sweep.example"
	base := cluster.DefaultPrefix + "/controller/" + plugin + "/"
	put := func(key string, r cluster.ControllerRequest) {
		t.Helper()
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, key, string(data)); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour).UTC()
	answered := &cluster.ControllerAnswer{By: "leader-gone", Attempt: "a1"}
	oldCreate := base + "~create-volume/lost-name/gone-host"
	put(oldCreate, cluster.ControllerRequest{Volume: "lost-name", Op: cluster.OpCreateVolume, Host: "gone-host", Attempt: "a1", At: old, Answer: answered})
	oldExpand := base + "~expand-volume/vol-1/gone-host"
	put(oldExpand, cluster.ControllerRequest{Volume: "vol-1", Op: cluster.OpExpandVolume, Host: "gone-host", Attempt: "a1", At: old,
		Answer: &cluster.ControllerAnswer{Code: 3, Message: "refused", By: "leader-gone", Attempt: "a1"}})
	fresh := base + "~create-volume/new-name/slow-host"
	put(fresh, cluster.ControllerRequest{Volume: "new-name", Op: cluster.OpCreateVolume, Host: "slow-host", Attempt: "a1", At: time.Now().UTC(), Answer: answered})
	claimStep := base + "vol-2/csi-node-9"
	put(claimStep, cluster.ControllerRequest{Volume: "vol-2", Node: "csi-node-9", Op: cluster.OpPublish, Host: "node-9", Attempt: "a1", At: old, Answer: answered})

	s := openWith(t, cluster.Config{NodeID: "leader", Endpoints: []string{srv.Endpoint()}, AnswerRetention: time.Hour})
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() {
		defer close(served)
		s.ServeController(sctx, plugin, answering{})
	}()
	defer func() { cancel(); <-served }()

	eventually(t, "the old answers removed", func() (bool, error) {
		n := 0
		for _, k := range []string{oldCreate, oldExpand} {
			r, err := cli.Get(ctx, k, clientv3.WithCountOnly())
			if err != nil {
				return false, err
			}
			n += int(r.Count)
		}
		return n == 0, nil
	})
	for _, k := range []string{fresh, claimStep} {
		r, err := cli.Get(ctx, k, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if r.Count != 1 {
			t.Errorf("%s removed; only answered one-shot requests older than the retention go", k)
		}
	}
}
