package volume

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// crashPoints are the places of a claim's life where a crash matters: just
// before a step's record is written (the plugin acted, the store does not
// know), just after (the store knows, nothing else happened yet), and in a
// claim actor just before it reports a release step.
var crashPoints = []string{
	"persist:reserve", "persisted:reserve",
	"persist:ControllerPublishVolume", "persisted:ControllerPublishVolume",
	"persist:NodeStageVolume", "persisted:NodeStageVolume",
	"persist:NodePublishVolume", "persisted:NodePublishVolume",
	"persist:release", "persisted:release",
	"claim-done:NodeUnpublishVolume",
	"persist:NodeUnpublishVolume", "persisted:NodeUnpublishVolume",
	"claim-done:NodeUnstageVolume",
	"persist:NodeUnstageVolume", "persisted:NodeUnstageVolume",
	"claim-done:ControllerUnpublishVolume",
	"persist:ControllerUnpublishVolume", "persisted:ControllerUnpublishVolume",
}

// failPoints are crash points on the failure paths.
var failPoints = []string{
	"persist:failure", "persisted:failure",
	"persist:fail", "persisted:fail",
	"persist:release-failure", "persisted:release-failure",
	"claim-done:NodeUnpublishVolume",
}

type crash struct {
	point string
	fired atomic.Int32
}

func (c *crash) hook(point, _ string) {
	if point == c.point && c.fired.Add(1) == 1 {
		panic(fmt.Sprintf("injected crash at %s", point))
	}
}

func TestManager_Crash_AtEveryStepResumes(t *testing.T) {
	for _, cached := range []bool{false, true} {
		for _, point := range crashPoints {
			crashAtStep(t, point, cached)
		}
	}
}

// crashAtStep crashes the actor at point once during a claim and its
// release; cached selects plugins that answer new claims from memory (no
// lookup goroutine).
func crashAtStep(t *testing.T, point string, cached bool) {
	name, opts := point, []envOpt{}
	if cached {
		name, opts = point+"/cached", []envOpt{withCachedPlugins()}
	}
	t.Run(name, func(t *testing.T) {
		c := &crash{point: point}
		e := newEnv(t, fullPlugin, append(opts, withHook(c.hook))...)
		e.register("vol1")
		ctx := ctxT(t)
		req := claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)
		got, err := e.m.Claim(ctx, req)
		if err != nil {
			t.Fatalf("claim: %s", err)
		}
		again, err := e.m.Claim(ctx, req)
		if err != nil || again.TargetPath != got.TargetPath {
			t.Fatalf("claim retried after the crash = %+v, %v; want target %s", again, err, got.TargetPath)
		}
		e.checkAgree()
		if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
			t.Fatalf("release: %s", err)
		}
		e.waitFreed("vol1")
		if c.fired.Load() == 0 {
			t.Fatalf("crash point %s never reached", point)
		}
		if hits := e.plugins.cachedHits.Load(); cached != (hits > 0) {
			t.Errorf("cached answers used: %d (cached plugins: %t)", hits, cached)
		}
		e.checkClean()
		e.checkAgree()
	})
}

func TestManager_Crash_OnFailurePathsResumes(t *testing.T) {
	for _, point := range failPoints {
		t.Run(point, func(t *testing.T) {
			c := &crash{point: point}
			e := newEnv(t, fullPlugin, withHook(c.hook), withConfig(func(c *Config) { c.MaxClaimAttempts = 2 }))
			e.register("vol1")
			ctx := ctxT(t)
			// Publish fails twice (retry, then give up), the first
			// unpublish fails once.
			e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 2})
			e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
			_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
			switch {
			case err == nil:
				// A crash after the first failure was recorded makes the
				// restarted actor retry with the publish fault used up.
				if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
					t.Fatalf("release: %s", err)
				}
			case errors.Is(err, ErrInUse) && point == "persisted:fail":
				// The crash lost the answer; the request sent again
				// finds the failed claim being torn down.
			case !errors.Is(err, ErrClaimFailed):
				t.Fatalf("claim: %v, want success or ErrClaimFailed", err)
			}
			e.waitFreed("vol1")
			if c.fired.Load() == 0 {
				t.Fatalf("crash point %s never reached", point)
			}
			e.checkClean()
		})
	}
}

func TestManager_Restart_ResumesUnfinishedClaim(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	e.register("vol2")
	ctx := ctxT(t)
	// vol2 has a claim to release whose unpublish cannot finish yet.
	if _, err := e.m.Claim(ctx, claimReq("vol2", "b", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Hang: true})
	if _, err := e.m.Release(ctx, "vol2", "b"); err != nil {
		t.Fatal(err)
	}
	// vol1's claim hangs in its stage step.
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Hang: true})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(cctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
		done <- err
	}()
	waitFor(t, "both RPCs to hang", func() bool {
		// vol2's claim staged once before.
		return e.plugin.Calls("NodeStageVolume") == 2 && e.plugin.Calls("NodeUnpublishVolume") == 1
	})
	cancel()
	<-done

	e.plugin.ClearFaults()
	e.restart() // Shutdown cancels the hanging calls; Start resumes both volumes.
	if e.m.Live() != 2 {
		t.Errorf("%d volume actors after start, want 2 (the volumes with unfinished steps)", e.m.Live())
	}
	waitFor(t, "vol1's claim to be published", func() bool {
		v, _ := e.m.Get(ctx, "vol1")
		return len(v.Claims) == 1 && v.Claims[0].State == claim.StatePublished
	})
	c, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil || c.State != claim.StatePublished {
		t.Fatalf("claim after restart = %+v, %v", c, err)
	}
	e.waitFreed("vol2")
	e.checkAgree()
	if _, ok := e.plugin.Published()["ext-vol2"]; ok {
		t.Errorf("vol2 still published after its release resumed")
	}
}

// TestManager_Crash_WhileRegistering crashes the volume actor just before
// and just after a new volume's record is written: the request sent again
// registers it once, and the index (by ID and by plugin volume) agrees with
// the store.
func TestManager_Crash_WhileRegistering(t *testing.T) {
	for _, point := range []string{"persist:register", "persisted:register", "persist:create", "persisted:create"} {
		t.Run(point, func(t *testing.T) {
			c := &crash{point: point}
			e := newEnv(t, fullPlugin, withHook(c.hook), withConfig(func(c *Config) { c.IdleTimeout = time.Millisecond }))
			ctx := ctxT(t)
			s := spec("vol1")
			if strings.HasSuffix(point, ":create") {
				s.ExternalID = ""
				if _, err := e.m.Create(ctx, s); err != nil {
					t.Fatalf("create: %s", err)
				}
			} else if _, err := e.m.Register(ctx, s); err != nil {
				t.Fatalf("register: %s", err)
			}
			if c.fired.Load() == 0 {
				t.Fatalf("crash point %s never reached", point)
			}
			// The actor stops when idle: Get then answers from the index
			// and the store, not from the actor's snapshot.
			waitFor(t, "the volume actor to stop", func() bool { return e.m.Live() == 0 })
			v, err := e.m.Get(ctx, "vol1")
			if err != nil {
				t.Fatalf("get: %s", err)
			}
			alias := spec("alias")
			alias.ExternalID = v.ExternalID
			if _, err := e.m.Register(ctx, alias); !errors.Is(err, ErrConflict) {
				t.Errorf("register of vol1's plugin volume as another ID: %v, want ErrConflict", err)
			}
			if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
				t.Errorf("claim: %s", err)
			}
		})
	}
}
