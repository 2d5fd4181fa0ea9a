package runtime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_ExpandVolume_ExamplePlugin expands a claimed volume of the
// example plugin through the HTTP API: the data written before is still
// there, the new capacity is stored and shown, and bad requests are 4xx
// that change nothing.
func TestRuntime_ExpandVolume_ExamplePlugin(t *testing.T) {
	e := newEnv(t)
	sock, stop := servePlugin(shortDir(t, "csiactor-ex-"))
	t.Cleanup(stop)
	ctx := context.Background()
	if _, err := e.rt.RegisterAllocation(ctx, "ex", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	c := serveAPI(t, e.rt)

	p, err := c.Plugin(ctx, "example")
	if err != nil {
		t.Fatal(err)
	}
	caps := p.Allocations[0].Capabilities
	if caps == nil || !strings.Contains(strings.Join(caps.Plugin, ","), "EXPANSION_ONLINE") ||
		!strings.Contains(strings.Join(caps.Controller, ","), "EXPAND_VOLUME") || !strings.Contains(strings.Join(caps.Node, ","), "EXPAND_VOLUME") {
		t.Fatalf("example plugin capabilities = %+v", caps)
	}

	const gib = int64(1) << 30
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "example", ""
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "data1", VolumeSpec: spec, CapacityBytes: gib}); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, "data1", claimReq("web", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(cl.TargetPath, "hello.txt")
	if err := os.WriteFile(data, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}

	v, err := c.ExpandVolume(ctx, "data1", runtime.ExpandRequest{CapacityBytes: 20 * gib})
	if err != nil {
		t.Fatalf("expand: %s", err)
	}
	if v.CapacityBytes != 20*gib || v.Expansion != nil {
		t.Errorf("expanded volume = capacity %d, expansion %+v", v.CapacityBytes, v.Expansion)
	}
	if got, err := c.Volume(ctx, "data1"); err != nil || got.CapacityBytes != 20*gib {
		t.Errorf("GET volume after expand = %d, %v", got.CapacityBytes, err)
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != "hello" {
		t.Errorf("data after expand = %q, %v", b, err)
	}
	evs, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var expanded bool
	for _, ev := range evs {
		expanded = expanded || ev.Type == runtime.EventVolumeExpanded && ev.Volume == "data1" && ev.Message == "expanded to 21474836480 bytes"
	}
	if !expanded {
		t.Errorf("no volume-expanded event in %+v", evs)
	}

	bad := []struct {
		id       string
		capacity int64
		status   int
		msg      string
	}{
		{"data1", gib, 400, `capacity_bytes 1073741824 is less than volume "data1"'s 21474836480 bytes: volumes cannot shrink`},
		{"data1", 0, 400, "capacity_bytes: must be positive"},
		{"nope", 30 * gib, 404, `volume "nope"`},
	}
	for _, b := range bad {
		_, err := c.ExpandVolume(ctx, b.id, runtime.ExpandRequest{CapacityBytes: b.capacity})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != b.status || !strings.Contains(ae.Message, b.msg) {
			t.Errorf("expand %s to %d = %v, want %d naming %q", b.id, b.capacity, err, b.status, b.msg)
		}
	}
	if got, _ := c.Volume(ctx, "data1"); got.CapacityBytes != 20*gib {
		t.Errorf("capacity after refused expansions = %d", got.CapacityBytes)
	}
	if _, err := c.Release(ctx, "data1", "web"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("data1", "web")
}
