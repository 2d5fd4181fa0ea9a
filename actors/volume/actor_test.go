package volume

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// Each way an alloc's work in flight can end (a claim failed for good, a
// claim released while its publish step backs off or while the
// NodeExpandVolume its publish owes backs off, a forced release of a
// hanging teardown) leaves the volume actor with nothing in flight: it
// passivates once the past claim is freed.
func TestVolumeActor_Passivates_AfterAllocWork(t *testing.T) {
	write := func(alloc string) ClaimRequest {
		return claimReq("vol1", alloc, claim.ModeWrite, csi.AccessModeSingleNodeWriter)
	}
	// claimBlocked starts a claim that cannot be published yet, and
	// returns its outcome's channel.
	claimBlocked := func(e *env, alloc string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := e.m.Claim(context.Background(), write(alloc))
			done <- err
		}()
		return done
	}
	tests := []struct {
		name   string
		plugin fakeplugin.Config
		run    func(t *testing.T, e *env)
	}{
		{"claim failed", fullPlugin, func(t *testing.T, e *env) {
			e.register("vol1")
			e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.InvalidArgument, Times: 1})
			if _, err := e.m.Claim(ctxT(t), write("a")); !errors.Is(err, ErrClaimFailed) {
				t.Fatalf("claim = %v, want ErrClaimFailed", err)
			}
		}},
		{"released while a publish step backs off", fullPlugin, func(t *testing.T, e *env) {
			e.register("vol1")
			e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable})
			done := claimBlocked(e, "a")
			waitFor(t, "NodeStageVolume retried", func() bool { return e.plugin.Calls("NodeStageVolume") >= 2 })
			if _, err := e.m.Release(ctxT(t), "vol1", "a"); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, ErrReleased) {
				t.Fatalf("claim = %v, want ErrReleased", err)
			}
			e.plugin.ClearFaults()
		}},
		{"released while the owed NodeExpandVolume backs off", fakeplugin.Config{
			CreateDelete: true, StageUnstage: true, ControllerExpand: true, NodeExpand: true, NodeExpansionRequired: true,
		}, func(t *testing.T, e *env) {
			ctx := ctxT(t)
			if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: gib,
				Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
				t.Fatal(err)
			}
			// No published claim: the node expands on the next publish.
			if _, err := e.m.Expand(ctx, "vol1", 2*gib); err != nil {
				t.Fatal(err)
			}
			e.plugin.SetFault("NodeExpandVolume", fakeplugin.Fault{Code: codes.Unavailable})
			done := claimBlocked(e, "a")
			waitFor(t, "NodeExpandVolume retried", func() bool { return e.plugin.Calls("NodeExpandVolume") >= 2 })
			if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, ErrReleased) {
				t.Fatalf("claim = %v, want ErrReleased", err)
			}
			e.plugin.ClearFaults()
		}},
		{"forced release", fullPlugin, func(t *testing.T, e *env) {
			ctx := ctxT(t)
			e.register("vol1")
			if _, err := e.m.Claim(ctx, write("a")); err != nil {
				t.Fatal(err)
			}
			e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Hang: true, Times: 1})
			if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the teardown to hang", func() bool { return e.plugin.Calls("NodeUnpublishVolume") == 1 })
			if c, _, err := e.m.ForceRelease(ctx, "vol1", "a"); err != nil || c.State != claim.StateFreed {
				t.Fatalf("ForceRelease = %+v, %v", c, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.plugin, withConfig(func(c *Config) { c.IdleTimeout = 5 * time.Millisecond }))
			tt.run(t, e)
			e.waitFreed("vol1")
			waitFor(t, "the volume actor to passivate", func() bool { return e.m.Live() == 0 })
			e.checkClean()
		})
	}
}
