package runtime_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_ExpandVolume_RetryFreesTheSlot_OfflineNodeOnNextPublish: an
// expansion whose ControllerExpandVolume keeps failing does not hold the
// volume while it backs off (a claim goes through meanwhile); when the
// controller then asks for a node expansion while the volume is claimed
// on a node that expands only offline, NodeExpandVolume waits for the next
// publish, which runs it. An unclaimed volume's node expansion also waits
// for its first publish.
func TestRuntime_ExpandVolume_RetryFreesTheSlot_OfflineNodeOnNextPublish(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.attach("m", "off", runtime.TypeMonolith, fakeplugin.Config{
		CreateDelete: true, ControllerExpand: true, NodeExpand: true, OfflineExpansion: true, NodeExpansionRequired: true,
	})
	c := serveAPI(t, e.rt)
	const gib = int64(1) << 30
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "off", ""
	for _, id := range []string{"v1", "v2"} {
		if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: id, VolumeSpec: spec, CapacityBytes: gib}); err != nil {
			t.Fatal(err)
		}
	}

	// v1: the controller fails while a claim gets in.
	p.SetFault("ControllerExpandVolume", fakeplugin.Fault{Code: codes.Unavailable, Message: "busy"})
	done := make(chan error, 1)
	go func() {
		_, err := c.ExpandVolume(ctx, "v1", runtime.ExpandRequest{CapacityBytes: 2 * gib})
		done <- err
	}()
	eventually(t, "ControllerExpandVolume retried", func() (bool, error) { return p.Calls("ControllerExpandVolume") >= 2, nil })
	cl, err := c.Claim(ctx, "v1", claimReq("w", "write", "single-node-writer"))
	if err != nil {
		t.Fatalf("claim while the expansion backs off: %v", err)
	}
	p.ClearFaults()
	if err := <-done; err != nil {
		t.Fatalf("expand: %v", err)
	}
	if n := p.Calls("NodeExpandVolume"); n != 0 {
		t.Errorf("NodeExpandVolume called %d times on a node that expands only offline, while published", n)
	}
	if _, err := c.Release(ctx, "v1", "w"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("v1", "w")
	cl2, err := c.Claim(ctx, "v1", claimReq("w2", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.NodeExpanded()[cl2.TargetPath]; got != 2*gib {
		t.Errorf("NodeExpandVolume on the next publish = %d at %s (all: %v), want %d", got, cl2.TargetPath, p.NodeExpanded(), 2*gib)
	}
	if _, ok := p.NodeExpanded()[cl.TargetPath]; ok {
		t.Errorf("the first claim's path was expanded while published: %v", p.NodeExpanded())
	}
	v, err := c.Volume(ctx, "v1")
	if err != nil || v.CapacityBytes != 2*gib {
		t.Errorf("volume after = %d, %v", v.CapacityBytes, err)
	}

	// v2: unclaimed; the node expands on the first publish, once.
	if _, err := c.ExpandVolume(ctx, "v2", runtime.ExpandRequest{CapacityBytes: 3 * gib}); err != nil {
		t.Fatal(err)
	}
	before := p.Calls("NodeExpandVolume")
	p.SetFault("NodeExpandVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	c2, err := c.Claim(ctx, "v2", claimReq("a", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.NodeExpanded()[c2.TargetPath]; got != 3*gib || p.Calls("NodeExpandVolume")-before != 2 {
		t.Errorf("first publish of v2: expanded %d after %d calls, want %d after 2 (retried once)", got, p.Calls("NodeExpandVolume")-before, 3*gib)
	}
	for vol, alloc := range map[string]string{"v1": "w2", "v2": "a"} {
		if _, err := c.Release(ctx, vol, alloc); err != nil {
			t.Fatal(err)
		}
		e.waitFreed(vol, alloc)
	}
	before = p.Calls("NodeExpandVolume")
	if _, err := c.Claim(ctx, "v2", claimReq("b", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if n := p.Calls("NodeExpandVolume") - before; n != 0 {
		t.Errorf("a later publish expanded again (%d calls)", n)
	}
}
