package volume

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// dayEvents collects a manager's events.
type dayEvents struct {
	mu  sync.Mutex
	evs []Event
}

func (l *dayEvents) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, e)
}

func (l *dayEvents) of(typ string) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func withDayEvents(l *dayEvents) envOpt { return withConfig(func(c *Config) { c.OnEvent = l.add }) }

// A created volume is updated with its full definition, the external ID
// and context the plugin chose included; the same definition again is
// idempotent.
func TestManager_Update_CreatedVolume(t *testing.T) {
	var evs dayEvents
	e := newEnv(t, fullPlugin, withDayEvents(&evs))
	ctx := ctxT(t)
	s := spec("made")
	s.ExternalID = ""
	v, err := e.m.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	up := spec("made")
	up.ExternalID = v.ExternalID
	up.Context = maps.Clone(v.Context)
	again, err := e.m.Register(ctx, up)
	if err != nil || again.Revision != v.Revision {
		t.Fatalf("the created volume's definition through Register = rev %d, %v; want rev %d unchanged", again.Revision, err, v.Revision)
	}
	up.Secrets = map[string]string{"token": "rotated"}
	up.Parameters = map[string]string{"tier": "slow"}
	got, err := e.m.Register(ctx, up)
	if err != nil || got.Revision != v.Revision+1 || !got.Created || got.Parameters["tier"] != "slow" {
		t.Fatalf("update of a created volume = %+v, %v", got, err)
	}
	if u := evs.of(EventVolumeUpdated); len(u) != 1 || u[0].Message != "volume updated: parameters, secrets changed" {
		t.Errorf("volume-updated events %+v", u)
	}
	// Persisted: a new manager has it.
	e.restart()
	if got, err := e.m.Get(ctx, "made"); err != nil || got.Parameters["tier"] != "slow" {
		t.Errorf("after a restart = %+v, %v", got, err)
	}
	// And the secrets go to the next RPC.
	if err := e.m.Delete(ctx, "made"); err != nil {
		t.Fatal(err)
	}
	if req, _ := e.plugin.LastRequest("DeleteVolume").(*csipb.DeleteVolumeRequest); req.GetSecrets()["token"] != "rotated" {
		t.Errorf("DeleteVolume after the update has token %q", req.GetSecrets()["token"])
	}
}

// A forced release of a claim whose teardown step hangs: the hanging RPC
// is given up, each remaining RPC runs once, and the claim is forgotten,
// for good (a restart does not bring it back).
func TestManager_ForceRelease_HangingTeardown(t *testing.T) {
	var evs dayEvents
	e := newEnv(t, fullPlugin, withDayEvents(&evs))
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Hang: true, Times: 1})
	if _, err := e.m.Release(ctx, "vol1", "web1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the teardown to hang", func() bool { return e.plugin.Calls("NodeUnpublishVolume") == 1 })
	c, left, err := e.m.ForceRelease(ctx, "vol1", "web1")
	if err != nil || c.State != claim.StateFreed || len(left) != 0 {
		t.Fatalf("ForceRelease = %+v, %v, %v; want freed with nothing left", c, left, err)
	}
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"} {
		if n := e.plugin.Calls(m); n < 1 {
			t.Errorf("%s sent %d times", m, n)
		}
	}
	e.checkClean()
	if f := evs.of(EventClaimForceReleased); len(f) != 1 || f[0].Message != "claim forgotten by a forced release; its last teardown finished, nothing is left" {
		t.Errorf("claim-force-released events %+v", f)
	}
	// Forcing again: the claim is gone.
	if _, _, err := e.m.ForceRelease(ctx, "vol1", "web1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ForceRelease again = %v, want ErrNotFound", err)
	}
	e.restart()
	v, err := e.m.Get(ctx, "vol1")
	if err != nil || len(v.PastClaims)+len(v.Claims)+len(v.Stagings) != 0 || v.ControllerPublished {
		t.Errorf("after a restart = %+v, %v", v, err)
	}
	e.checkAgree()
}

// A staging the last teardown could not undo stays in the record, not
// staged: the next claim stages again at the same path.
func TestManager_ForceRelease_StagingLeft(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("NodeUnstageVolume", fakeplugin.Fault{Code: codes.Internal, Message: "busy"})
	_, left, err := e.m.ForceRelease(ctx, "vol1", "web1")
	// The fake plugin refuses to detach a volume still staged: the
	// attachment is left too.
	if err != nil || len(left) != 2 || !strings.HasPrefix(left[0], "staging ") || !strings.Contains(left[0], "(NodeUnstageVolume: rpc error: code = Internal desc = busy)") ||
		!strings.HasPrefix(left[1], "controller attachment to node fake-node (ControllerUnpublishVolume: ") {
		t.Fatalf("ForceRelease = %q, %v; want the staging and the attachment left", left, err)
	}
	v, _ := e.m.Get(ctx, "vol1")
	if len(v.Stagings) != 1 || v.Stagings[0].Staged || len(v.Stagings[0].Users) != 0 {
		t.Fatalf("stagings after the forced release: %+v", v.Stagings)
	}
	e.plugin.ClearFaults()
	stages := e.plugin.Calls("NodeStageVolume")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web2", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	if e.plugin.Calls("NodeStageVolume") != stages+1 {
		t.Errorf("the next claim did not stage again")
	}
	if _, err := e.m.Release(ctx, "vol1", "web2"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1")
	e.checkClean()
}

// A waiting claim ends with the manager: Shutdown is not held up by it.
func TestManager_ClaimWait_Shutdown(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.ClaimWait(ctx, claimReq("vol1", "web2", claim.ModeWrite, csi.AccessModeSingleNodeWriter), MaxClaimWait+time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("ClaimWait over the cap = %v, want ErrInvalid", err)
	}
	// Refusals that waiting cannot change are answered at once.
	if _, err := e.m.ClaimWait(ctx, claimReq("vol1", "web2", claim.ModeRead, csi.AccessModeMultiNodeReaderOnly), time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("ClaimWait with a capability the volume lacks = %v, want ErrInvalid at once", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.m.ClaimWait(context.Background(), claimReq("vol1", "web2", claim.ModeWrite, csi.AccessModeSingleNodeWriter), MaxClaimWait)
		done <- err
	}()
	waitFor(t, "the claim to wait", func() bool {
		e.m.waits.mu.Lock()
		defer e.m.waits.mu.Unlock()
		return len(e.m.waits.byID) == 1
	})
	e.close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrShutdown) {
			t.Errorf("waiting claim at shutdown = %v, want ErrShutdown", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a waiting claim held up Shutdown")
	}
	if n := len(e.m.waits.byID); n != 0 {
		t.Errorf("%d watches left after the wait ended", n)
	}
}
