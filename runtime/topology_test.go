package runtime_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/runtime"
)

// serveExample serves the example plugin with cfg (symlink mode unless cfg
// sets a mount mode, its state in dir) on a socket in dir until the test ends, and returns the socket.
func serveExample(t *testing.T, dir string, cfg csiplugin.Config) string {
	t.Helper()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	cfg.StateDir = filepath.Join(dir, "state")
	if cfg.MountMode == "" {
		cfg.MountMode = csiplugin.MountModeSymlink
	}
	cfg.Logger = logrus.NewEntry(quiet)
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	p, err := csiplugin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
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
	return sock
}

func TestRuntime_Topology_ExamplePlugin(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// The controller provisions in zone a; this host's node plugin is in
	// zone b.
	ctl := serveExample(t, shortDir(t, "csiactor-za-"), csiplugin.Config{Zone: "a"})
	nod := serveExample(t, shortDir(t, "csiactor-zb-"), csiplugin.Config{Zone: "b", MaxVolumesPerNode: 1})
	for id, s := range map[string]runtime.AllocationSpec{
		"ctl": {Plugin: "zoned", Type: runtime.TypeController, Socket: ctl},
		"nod": {Plugin: "zoned", Type: runtime.TypeNode, Socket: nod},
	} {
		if _, err := e.rt.RegisterAllocation(ctx, id, s); err != nil {
			t.Fatal(err)
		}
		e.waitAllocHealthy(id)
	}
	c := serveAPI(t, e.rt)
	key := csiplugin.TopologyKeyZone

	p, err := c.Plugin(ctx, "zoned")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Allocations {
		if a.ID == "nod" && (a.Capabilities == nil || a.Capabilities.Topology[key] != "b" || a.Capabilities.MaxVolumesPerNode != 1) {
			t.Errorf("node allocation capabilities = %+v", a.Capabilities)
		}
	}

	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "zoned", ""
	v, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "v1", VolumeSpec: spec, Topology: []map[string]string{{key: "a"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.AccessibleTopology) != 1 || v.AccessibleTopology[0][key] != "a" {
		t.Fatalf("created volume's accessible topology = %v", v.AccessibleTopology)
	}
	if got, err := c.Volume(ctx, "v1"); err != nil || len(got.AccessibleTopology) != 1 {
		t.Errorf("GET volume accessible topology = %v, %v", got.AccessibleTopology, err)
	}
	_, err = c.Claim(ctx, "v1", claimReq("web", "write", "single-node-writer"))
	wantAPIError(t, "claim outside the volume's topology", err, http.StatusConflict,
		`volume "v1" is reachable from topology {`+key+`=a}, and this host's node topology is {`+key+`=b}`)
	if got, _ := c.Volume(ctx, "v1"); len(got.Claims)+len(got.PastClaims) != 0 {
		t.Errorf("a refused claim left %+v", got)
	}
	_, err = c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "v2", VolumeSpec: spec, Topology: []map[string]string{{}}})
	wantAPIError(t, "create with an empty topology", err, http.StatusBadRequest, "topology[0]: has no segments")
}

func TestRuntime_MaxVolumesPerNode_ExamplePlugin(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sock := serveExample(t, shortDir(t, "csiactor-mv-"), csiplugin.Config{MaxVolumesPerNode: 1})
	if _, err := e.rt.RegisterAllocation(ctx, "ex", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	c := serveAPI(t, e.rt)
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "example", ""
	for _, id := range []string{"v1", "v2"} {
		if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: id, VolumeSpec: spec}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Claim(ctx, "v1", claimReq("a", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Claim(ctx, "v2", claimReq("b", "write", "single-node-writer"))
	wantAPIError(t, "claim over the node's limit", err, http.StatusConflict, `plugin "example" has 1 volumes in use on this host, its max_volumes_per_node of 1`)
	if _, err := c.Release(ctx, "v1", "a"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("v1", "a")
	if _, err := c.Claim(ctx, "v2", claimReq("b", "write", "single-node-writer")); err != nil {
		t.Fatalf("claim once the other volume is freed: %v", err)
	}
	if _, err := c.Release(ctx, "v2", "b"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("v2", "b")
}
