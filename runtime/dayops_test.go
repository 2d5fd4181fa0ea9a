package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// An allocation that is down itself still holds its claims' only way to
// its plugin: deregistering it is refused too, and says why.
func TestRuntime_DeregisterAllocation_UnhealthyLast(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	p := e.attach("node-1", testPlugin, runtime.TypeNode, fakeplugin.Config{StageUnstage: true})
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	eventually(t, "node-1 unhealthy", func() (bool, error) {
		pl, err := e.rt.Plugin(ctx, testPlugin)
		return err == nil && pl.NodesHealthy == 0, err
	})
	err := e.rt.DeregisterAllocation(ctx, "node-1")
	want := `allocation "node-1" is unhealthy and plugin "fake" has no other healthy node allocation, and 1 claim depends on it: volume "vol-1": alloc "alloc-1" (published); release them first, or deregister the allocation with force`
	if !errors.Is(err, runtime.ErrConflict) || err.Error() != want {
		t.Fatalf("DeregisterAllocation = %v\nwant %s", err, want)
	}
	if err := e.rt.ForceDeregisterAllocation(ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Plugin(ctx, testPlugin); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("plugin after the forced deregistration: %v", err)
	}
	evs, _ := e.rt.Events(ctx)
	n := 0
	for _, ev := range evs {
		if ev.Type == runtime.EventAllocationForceDeregistered && strings.Contains(ev.Message, `volume "vol-1": alloc "alloc-1" (published)`) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d allocation-force-deregistered events naming the claim", n)
	}
	if err := e.rt.ForceDeregisterAllocation(ctx, "node-1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("forced deregistration of an unknown allocation = %v, want ErrNotFound", err)
	}
}
