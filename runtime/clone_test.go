package runtime_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_CreateVolume_Clone clones a volume of the example plugin
// through the HTTP API: data written to the source before is in the clone.
func TestRuntime_CreateVolume_Clone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sock := serveExample(t, shortDir(t, "csiactor-cl-"), csiplugin.Config{})
	if _, err := e.rt.RegisterAllocation(ctx, "ex", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	c := serveAPI(t, e.rt)
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "example", ""
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "src", VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, "src", claimReq("w", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cl.TargetPath, "data.txt"), []byte("before the clone"), 0o644); err != nil {
		t.Fatal(err)
	}
	clone, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "copy", VolumeSpec: spec, ContentSource: &runtime.ContentSource{Volume: "src"}})
	if err != nil {
		t.Fatalf("clone: %s", err)
	}
	if clone.ExternalID == "" {
		t.Fatalf("clone = %+v", clone)
	}
	cc, err := c.Claim(ctx, "copy", claimReq("r", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(cc.TargetPath, "data.txt")); err != nil || string(b) != "before the clone" {
		t.Errorf("clone's data = %q, %v", b, err)
	}

	for _, b := range []struct {
		name   string
		cs     runtime.ContentSource
		status int
		msg    string
	}{
		{"unknown volume", runtime.ContentSource{Volume: "nope"}, http.StatusNotFound, `content_source.volume: volume "nope" not found`},
		{"unknown snapshot", runtime.ContentSource{Snapshot: "s1"}, http.StatusNotFound, `content_source.snapshot: snapshot "s1"`},
		{"both", runtime.ContentSource{Snapshot: "s1", Volume: "src"}, http.StatusBadRequest, "give snapshot or volume, not both"},
	} {
		_, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "bad", VolumeSpec: spec, ContentSource: &b.cs})
		wantAPIError(t, "clone from "+b.name, err, b.status, b.msg)
	}
	if _, err := c.Volume(ctx, "bad"); err == nil {
		t.Error("a refused clone was registered")
	}
	for vol, alloc := range map[string]string{"src": "w", "copy": "r"} {
		if _, err := c.Release(ctx, vol, alloc); err != nil {
			t.Fatal(err)
		}
		e.waitFreed(vol, alloc)
	}
}
