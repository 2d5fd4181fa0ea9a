package cluster_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// TestCluster_RoutedModify: a host with only a node allocation of a
// plugin modifies a volume's mutable parameters through the plugin's
// controller leader (~modify-volume), with the volume's secrets; the
// parameters reach every host's record, merged; a parameter the leader's
// plugin refuses is ErrInvalid naming it, and changes nothing anywhere.
func TestCluster_RoutedModify(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	modifying := fullController
	modifying.ControllerModify, modifying.AcceptedMutableParameters = true, []string{"iops", "throughput"}
	ctrl := startWithPlugin(t, "n1", srv.Endpoint(), modifying, runtime.TypeMonolith)
	node := startWithPlugin(t, "n3", srv.Endpoint(), fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	ctx := context.Background()
	if err := untilAvailable(t, "create v1", func(ctx context.Context) error {
		_, err := node.rt.CreateVolume(ctx, createSpec("v1"))
		return err
	}); err != nil {
		t.Fatalf("create v1 on the node-only host: %v", err)
	}
	ctrl.waitVolume("v1")

	if _, err := node.rt.ModifyVolume(ctx, "v1", runtime.ModifyRequest{MutableParameters: map[string]string{"iops": "3000"}}); err != nil {
		t.Fatalf("modify v1 on the node-only host: %v", err)
	}
	v, err := node.rt.ModifyVolume(ctx, "v1", runtime.ModifyRequest{MutableParameters: map[string]string{"throughput": "125"}})
	want := map[string]string{"iops": "3000", "throughput": "125"}
	if err != nil || !maps.Equal(v.MutableParameters, want) {
		t.Fatalf("second modify on the node-only host = %v, %v; want %v", v.MutableParameters, err, want)
	}
	if got := ctrl.plugin.Volumes()["vol-v1"].MutableParameters; !maps.Equal(got, want) {
		t.Fatalf("the leader's plugin has mutable parameters %v, want %v", got, want)
	}
	if got := ctrl.plugin.LastRequest("ControllerModifyVolume").(interface{ GetSecrets() map[string]string }).GetSecrets(); got["token"] != "s3cr3t-route" {
		t.Fatalf("the leader's ControllerModifyVolume secrets = %d entries, want the volume's", len(got))
	}
	eventually(t, "v1's mutable parameters on the controller host", func() (bool, error) {
		v, err := ctrl.rt.Volume(ctx, "v1")
		return err == nil && maps.Equal(v.MutableParameters, want), err
	})

	_, err = node.rt.ModifyVolume(ctx, "v1", runtime.ModifyRequest{MutableParameters: map[string]string{"color": "blue"}})
	if !errors.Is(err, runtime.ErrInvalid) || !strings.Contains(err.Error(), `"color"`) {
		t.Fatalf("modify with a refused parameter = %v, want ErrInvalid naming it", err)
	}
	for _, a := range []*agent{node, ctrl} {
		if v, err := a.rt.Volume(ctx, "v1"); err != nil || !maps.Equal(v.MutableParameters, want) || len(v.Modifying) != 0 {
			t.Errorf("v1 on %s after the refusal = %v (modifying %v), %v", a.node, v.MutableParameters, v.Modifying, err)
		}
	}
	if got := ctrl.plugin.Volumes()["vol-v1"].MutableParameters; !maps.Equal(got, want) {
		t.Errorf("the leader's plugin after the refusal = %v", got)
	}
	if n := node.plugin.Calls("ControllerModifyVolume"); n != 0 {
		t.Errorf("the node-only host's plugin got %d ControllerModifyVolume calls", n)
	}
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
}
