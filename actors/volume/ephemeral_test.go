package volume

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

// ephSpec is the definition an ephemeral claim of access mode am carries.
func ephSpec(am csi.AccessMode) Spec {
	return Spec{
		Plugin: testPlugin, Capabilities: []csi.VolumeCapability{fsCap(am)},
		CapacityBytes: 1 << 20, Parameters: map[string]string{"kind": "scratch"},
		Secrets: map[string]string{"token": "s3cr3t"},
	}
}

// waitEphemeralGone waits until volume id is deregistered and its plugin
// volume (fake plugin ID "vol-"+id) deleted.
func (e *env) waitEphemeralGone(id string) {
	e.t.Helper()
	waitFor(e.t, "ephemeral volume "+id+" deleted and deregistered", func() bool {
		_, err := e.m.Get(context.Background(), id)
		_, still := e.plugin.Volumes()["vol-"+id]
		return errors.Is(err, ErrNotFound) && !still
	})
	if _, err := e.store.Volume(context.Background(), id); !errors.Is(err, persistence.ErrNotFound) {
		e.t.Errorf("store still has ephemeral volume %s: %v", id, err)
	}
}

func TestManager_ClaimEphemeral_CreatesPublishesDeletes(t *testing.T) {
	for _, cached := range []bool{false, true} {
		name, opts := "lookup", []envOpt{}
		if cached {
			name, opts = "cached", []envOpt{withCachedPlugins()}
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, fullPlugin, opts...)
			ctx := ctxT(t)
			am := csi.AccessModeSingleNodeMultiWriter
			a, err := e.m.ClaimEphemeral(ctx, claimReq("eph1", "a", claim.ModeWrite, am), ephSpec(am))
			if err != nil {
				t.Fatalf("ephemeral claim: %s", err)
			}
			if a.State != claim.StatePublished || a.TargetPath == "" {
				t.Fatalf("claim = %+v, want published with a target", a)
			}
			v, err := e.m.Get(ctx, "eph1")
			if err != nil || !v.Ephemeral || v.EphemeralPhase != persistence.EphemeralReady || !v.Created || v.ExternalID != "vol-eph1" {
				t.Fatalf("volume = %+v, %v; want ephemeral, ready, created as vol-eph1", v, err)
			}
			if pv, ok := e.plugin.Volumes()["vol-eph1"]; !ok || pv.Parameters["kind"] != "scratch" || pv.CapacityBytes != 1<<20 {
				t.Fatalf("plugin volume = %+v, %t; want created with the ephemeral parameters and capacity", pv, ok)
			}
			// The same request again is the same claim; another alloc
			// shares the volume (its access mode allows it); a plain
			// claim on it is a claim too.
			again, err := e.m.ClaimEphemeral(ctx, claimReq("eph1", "a", claim.ModeWrite, am), ephSpec(am))
			if err != nil || again.TargetPath != a.TargetPath {
				t.Fatalf("claim again = %+v, %v; want target %s", again, err, a.TargetPath)
			}
			if _, err := e.m.ClaimEphemeral(ctx, claimReq("eph1", "b", claim.ModeWrite, am), ephSpec(am)); err != nil {
				t.Fatalf("second ephemeral claim: %s", err)
			}
			if _, err := e.m.Claim(ctx, claimReq("eph1", "c", claim.ModeRead, am)); err != nil {
				t.Fatalf("plain claim on the ephemeral volume: %s", err)
			}
			if n := e.plugin.Calls("CreateVolume"); n != 1 {
				t.Errorf("CreateVolume sent %d times, want 1", n)
			}
			e.checkAgree()
			for _, alloc := range []string{"a", "b"} {
				if _, err := e.m.Release(ctx, "eph1", alloc); err != nil {
					t.Fatalf("release %s: %s", alloc, err)
				}
			}
			e.waitFreed("eph1")
			if _, err := e.m.Get(ctx, "eph1"); err != nil || e.plugin.Calls("DeleteVolume") != 0 {
				t.Fatalf("volume deleted while alloc c still claims it: %v, DeleteVolume calls %d", err, e.plugin.Calls("DeleteVolume"))
			}
			if _, err := e.m.Release(ctx, "eph1", "c"); err != nil {
				t.Fatalf("release c: %s", err)
			}
			e.waitEphemeralGone("eph1")
			e.checkClean()
			if _, err := e.m.Claim(ctx, claimReq("eph1", "a", claim.ModeWrite, am)); !errors.Is(err, ErrNotFound) {
				t.Errorf("plain claim on the deleted ephemeral volume: %v, want ErrNotFound", err)
			}
		})
	}
}

func TestManager_ClaimEphemeral_Refusals(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.register("plain")
	am := csi.AccessModeSingleNodeWriter
	wrongPlugin := ephSpec(am)
	wrongPlugin.Plugin = "other"
	for _, tc := range []struct {
		name string
		vol  string
		req  ClaimRequest
		spec Spec
		want error
		msg  string
	}{
		{"not ephemeral", "plain", claimReq("plain", "a", claim.ModeWrite, am), ephSpec(am), ErrConflict, `volume "plain" is registered and not ephemeral`},
		{"capability", "x1", claimReq("x1", "a", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter), ephSpec(am), ErrInvalid, "do not include the claim's access mode"},
		{"no capability", "x2", claimReq("x2", "a", claim.ModeWrite, am), Spec{Plugin: testPlugin}, ErrInvalid, "capabilities is empty"},
		{"external id", "x3", claimReq("x3", "a", claim.ModeWrite, am), Spec{Plugin: testPlugin, ExternalID: "e", Capabilities: ephSpec(am).Capabilities}, ErrInvalid, "external_id"},
		{"no plugin", "x4", claimReq("x4", "a", claim.ModeWrite, am), Spec{Capabilities: ephSpec(am).Capabilities}, ErrInvalid, "plugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.m.ClaimEphemeral(ctx, tc.req, tc.spec)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("ephemeral claim: %v, want %v containing %q", err, tc.want, tc.msg)
			}
			if n := e.plugin.Calls("CreateVolume"); n != 0 {
				t.Errorf("CreateVolume sent %d times, want none", n)
			}
			if tc.vol != "plain" {
				if _, err := e.m.Get(ctx, tc.vol); !errors.Is(err, ErrNotFound) {
					t.Errorf("refused volume %s is known: %v", tc.vol, err)
				}
			}
		})
	}
	if v, _ := e.m.Get(ctx, "plain"); v.Ephemeral || len(v.Claims) != 0 {
		t.Errorf("plain volume changed by the refused claim: %+v", v)
	}

	// A plain claim on an unknown volume stays ErrNotFound.
	if _, err := e.m.Claim(ctx, claimReq("nope", "a", claim.ModeWrite, am)); !errors.Is(err, ErrNotFound) {
		t.Errorf("plain claim on an unknown volume: %v, want ErrNotFound", err)
	}

	// On an ephemeral volume: another plugin's spec is a conflict; it
	// cannot be deregistered, deleted or registered over.
	if _, err := e.m.ClaimEphemeral(ctx, claimReq("eph", "a", claim.ModeWrite, am), ephSpec(am)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.ClaimEphemeral(ctx, claimReq("eph", "b", claim.ModeWrite, am), wrongPlugin); !errors.Is(err, ErrConflict) ||
		!strings.Contains(err.Error(), `is a volume of plugin "fake", not of plugin "other"`) {
		t.Errorf("ephemeral claim naming another plugin: %v, want ErrConflict naming both", err)
	}
	for what, err := range map[string]error{"deregister": e.m.Deregister(ctx, "eph"), "delete": e.m.Delete(ctx, "eph")} {
		if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), `volume "eph" is an ephemeral volume`) {
			t.Errorf("%s of an ephemeral volume: %v, want ErrConflict", what, err)
		}
	}
	s := spec("eph")
	if _, err := e.m.Register(ctx, s); !errors.Is(err, ErrConflict) {
		t.Errorf("register over an ephemeral volume: %v, want ErrConflict", err)
	}
	if n := e.plugin.Calls("DeleteVolume"); n != 0 {
		t.Errorf("DeleteVolume sent %d times while claimed", n)
	}
	// A single-node-writer volume takes one claim: the second is refused
	// and the volume stays.
	if _, err := e.m.ClaimEphemeral(ctx, claimReq("eph", "b", claim.ModeWrite, am), ephSpec(am)); !errors.Is(err, claim.ErrClaimLimit) {
		t.Errorf("second claim of a single-node-writer ephemeral volume: %v, want ErrClaimLimit", err)
	}
	if _, err := e.m.Release(ctx, "eph", "a"); err != nil {
		t.Fatal(err)
	}
	e.waitEphemeralGone("eph")
}

// TestManager_ClaimEphemeral_PluginRefusesCreate: a CreateVolume the
// plugin refuses fails the claim with the plugin's error and forgets the
// intent; nothing is left.
func TestManager_ClaimEphemeral_PluginRefusesCreate(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.plugin.SetFault("CreateVolume", fakeplugin.Fault{Code: codes.InvalidArgument, Message: "no such parameter: kind", Times: 1})
	am := csi.AccessModeSingleNodeWriter
	_, err := e.m.ClaimEphemeral(ctx, claimReq("eph", "a", claim.ModeWrite, am), ephSpec(am))
	if !errors.Is(err, ErrPluginCall) || !strings.Contains(err.Error(), "no such parameter: kind") {
		t.Fatalf("ephemeral claim: %v, want ErrPluginCall with the plugin's message", err)
	}
	e.waitEphemeralGone("eph")
	// A claim whose publish fails for good leaves no volume either.
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.InvalidArgument, Times: 1})
	if _, err := e.m.ClaimEphemeral(ctx, claimReq("eph", "a", claim.ModeWrite, am), ephSpec(am)); !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("ephemeral claim with a failing publish: %v, want ErrClaimFailed", err)
	}
	e.waitEphemeralGone("eph")
	e.checkClean()
}

// ephemeralCrashPoints are the places of an ephemeral volume's life where
// a crash matters, beside those of its claim (crashPoints).
var ephemeralCrashPoints = []string{
	"persist:ephemeral-intent", "persisted:ephemeral-intent",
	"persist:ephemeral-created", "persisted:ephemeral-created",
	"persist:reserve",
	"persist:release", "persisted:release",
	"persist:ephemeral-deleting", "persisted:ephemeral-deleting",
	"persist:ephemeral-forget",
}

// TestManager_ClaimEphemeral_CrashResumes crashes the volume actor once
// at each point of an ephemeral volume's creation, claim, release and
// deletion: the claim sent again is published once, the volume is created
// once, and after the release it is deleted and forgotten.
func TestManager_ClaimEphemeral_CrashResumes(t *testing.T) {
	for _, point := range ephemeralCrashPoints {
		t.Run(point, func(t *testing.T) {
			c := &crash{point: point}
			e := newEnv(t, fullPlugin, withHook(c.hook))
			ctx := ctxT(t)
			am := csi.AccessModeSingleNodeWriter
			req := claimReq("eph", "a", claim.ModeWrite, am)
			got, err := e.m.ClaimEphemeral(ctx, req, ephSpec(am))
			if err != nil {
				t.Fatalf("ephemeral claim: %s", err)
			}
			again, err := e.m.ClaimEphemeral(ctx, req, ephSpec(am))
			if err != nil || again.TargetPath != got.TargetPath {
				t.Fatalf("claim again = %+v, %v; want target %s", again, err, got.TargetPath)
			}
			if n := len(e.plugin.Volumes()); n != 1 {
				t.Errorf("plugin has %d volumes, want 1", n)
			}
			e.checkAgree()
			if _, err := e.m.Release(ctx, "eph", "a"); err != nil {
				t.Fatalf("release: %s", err)
			}
			e.waitEphemeralGone("eph")
			if c.fired.Load() == 0 {
				t.Fatalf("crash point %s never reached", point)
			}
			e.checkClean()
		})
	}
}

// TestManager_ClaimEphemeral_RestartResumesCreateAndDelete stops the
// manager while an ephemeral volume's CreateVolume (its caller gone) and
// another's DeleteVolume hang: the next start finishes both, and the
// volume no claim holds is deleted, not leaked.
func TestManager_ClaimEphemeral_RestartResumesCreateAndDelete(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	am := csi.AccessModeSingleNodeWriter
	if _, err := e.m.ClaimEphemeral(ctx, claimReq("gone", "a", claim.ModeWrite, am), ephSpec(am)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("DeleteVolume", fakeplugin.Fault{Hang: true})
	if _, err := e.m.Release(ctx, "gone", "a"); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("CreateVolume", fakeplugin.Fault{Hang: true})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.m.ClaimEphemeral(cctx, claimReq("new", "b", claim.ModeWrite, am), ephSpec(am))
		done <- err
	}()
	waitFor(t, "CreateVolume and DeleteVolume to hang", func() bool {
		return e.plugin.Calls("CreateVolume") == 2 && e.plugin.Calls("DeleteVolume") == 1
	})
	for id, phase := range map[string]string{"new": persistence.EphemeralCreating, "gone": persistence.EphemeralDeleting} {
		if v, err := e.store.Volume(ctx, id); err != nil || v.Ephemeral != phase {
			t.Fatalf("store: %s = %+v, %v; want phase %s recorded before its RPC", id, v, err, phase)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("claim whose caller went away: %v", err)
	}
	e.plugin.ClearFaults()
	e.restart()
	e.waitEphemeralGone("gone")
	e.waitEphemeralGone("new")
	if n := len(e.plugin.Volumes()); n != 0 {
		t.Errorf("plugin keeps %d volumes: %v", n, e.plugin.Volumes())
	}
	e.checkClean()
}
