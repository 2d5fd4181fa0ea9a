package dockerplugin_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/dockerplugin"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/runtime"
)

// TestCluster_SingleWriterAcrossHosts: in cluster mode the drivers are
// global; a volume mounted for a writer on host A cannot be mounted on
// host B, nor removed there, and B's error names A.
func TestCluster_SingleWriterAcrossHosts(t *testing.T) {
	etcd := etcdtest.Start(t)
	onHost := func(node string) func(*runtime.Config) {
		return func(c *runtime.Config) {
			c.Cluster = &runtime.ClusterConfig{
				NodeID:   node,
				Etcd:     runtime.EtcdConfig{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 2 * time.Second},
				LeaseTTL: 5 * time.Second,
			}
		}
	}
	a := newRigWith(t, onHost("host-a"))
	b := newRigWith(t, onHost("host-b"))
	for _, r := range []*rig{a, b} {
		if got := r.ok("VolumeDriver.Capabilities", struct{}{})["Capabilities"].(map[string]any)["Scope"]; got != "global" {
			t.Errorf("scope = %v, want global in cluster mode", got)
		}
	}
	a.ok("VolumeDriver.Create", map[string]any{"Name": "shared", "Opts": map[string]string{"size": "1GiB"}})
	eventually(t, "the volume listed on host B", func() bool {
		out := b.ok("VolumeDriver.List", struct{}{})
		vs, _ := out["Volumes"].([]any)
		return len(vs) == 1 && vs[0].(map[string]any)["Name"] == "shared"
	})
	a.mount("shared", "m-a")

	status, out := b.call(testDriver, "VolumeDriver.Mount", map[string]string{"Name": "shared", "ID": "m-b"})
	msg, _ := out["Err"].(string)
	if status != http.StatusConflict || !strings.Contains(msg, "host-a") {
		t.Errorf("Mount on host B = %d %q, want 409 naming host-a", status, msg)
	}
	if b.claimed("shared", dockerplugin.AllocFor("m-b")) {
		t.Error("the refused Mount left a claim")
	}
	status, out = b.call(testDriver, "VolumeDriver.Remove", map[string]string{"Name": "shared"})
	if status != http.StatusConflict {
		t.Errorf("Remove on host B while mounted on A = %d %v, want 409", status, out)
	}
	if _, err := a.rt.Volume(context.Background(), "shared"); err != nil {
		t.Fatalf("the volume went: %v", err)
	}
	// Once A's container is gone, B mounts it.
	a.unmount("shared", "m-a")
	a.waitGone("shared", dockerplugin.AllocFor("m-a"))
	eventually(t, "host B sees the claim of host A gone", func() bool { return !b.claimed("shared", dockerplugin.AllocFor("m-a")) })
	mp := b.mount("shared", "m-b")
	if mp == "" {
		t.Fatal("no mount point on host B")
	}
	b.unmount("shared", "m-b")
	b.ok("VolumeDriver.Remove", map[string]string{"Name": "shared"})
	eventually(t, "the volume gone on host A", func() bool {
		_, err := a.rt.Volume(context.Background(), "shared")
		return err != nil
	})
}
