package runtime_test

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// The node volume limit is live: a ControllerPublishVolume answered
// ResourceExhausted makes the node fingerprint again at once (the heartbeat
// here is an hour away), the API shows the lowered max_volumes_per_node,
// and the next claim over it is a 409 naming the limit, with no RPC sent.
func TestRuntime_NodeVolumeLimit_LoweredAfterResourceExhausted(t *testing.T) {
	e := &testEnv{t: t, dataDir: filepath.Join(shortDir(t, "csiactor-nl-"), "d")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Plugins.HeartbeatInterval = time.Hour
	e.start()
	p := e.attach("fake", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, MaxVolumesPerNode: 3})
	ctx := context.Background()
	c := serveAPI(t, e.rt)
	for _, id := range []string{"v1", "v2", "v3"} {
		spec := volSpecFor(id, "single-node-writer")
		spec.Plugin = "fake"
		if _, err := c.RegisterVolume(ctx, id, spec); err != nil {
			t.Fatal(err)
		}
	}
	limit := func() int64 {
		t.Helper()
		pl, err := c.Plugin(ctx, "fake")
		if err != nil || len(pl.Allocations) != 1 || pl.Allocations[0].Capabilities == nil {
			t.Fatalf("Plugin = %+v, %v", pl, err)
		}
		return pl.Allocations[0].Capabilities.MaxVolumesPerNode
	}
	if got := limit(); got != 3 {
		t.Fatalf("max_volumes_per_node = %d, want 3", got)
	}
	if _, err := c.Claim(ctx, "v1", claimReq("a1", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}

	// The plugin lowers its limit and refuses the next attach once.
	p.SetMaxVolumesPerNode(1)
	p.SetFault("ControllerPublishVolume", fakeplugin.Fault{Code: codes.ResourceExhausted, Message: "no attach slot", Times: 1})
	if _, err := c.Claim(ctx, "v2", claimReq("a2", "write", "single-node-writer")); err != nil {
		t.Fatalf("claim retried after ResourceExhausted: %v", err)
	}
	eventually(t, "node-info-changed after ResourceExhausted", func() (bool, error) {
		evs, err := e.rt.Events(ctx)
		return slices.ContainsFunc(evs, func(ev runtime.Event) bool {
			return ev.Type == runtime.EventNodeInfoChanged && ev.Alloc == "fake" && ev.Message == "max_volumes_per_node 1"
		}), err
	})
	if got := limit(); got != 1 {
		t.Fatalf("max_volumes_per_node = %d after the refingerprint, want 1", got)
	}

	methods := []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
	before := make([]int, len(methods))
	for i, m := range methods {
		before[i] = p.Calls(m)
	}
	_, err := c.Claim(ctx, "v3", claimReq("a3", "write", "single-node-writer"))
	wantAPIError(t, "claim over the lowered limit", err, http.StatusConflict, `plugin "fake" has 2 volumes in use on this host, its max_volumes_per_node of 1`)
	for i, m := range methods {
		if n := p.Calls(m); n != before[i] {
			t.Errorf("%s was called %d times for the refused claim", m, n-before[i])
		}
	}
	if v, err := c.Volume(ctx, "v3"); err != nil || len(v.Claims)+len(v.PastClaims) != 0 {
		t.Errorf("v3 after the refusal = %+v, %v; want no claim", v, err)
	}
}
