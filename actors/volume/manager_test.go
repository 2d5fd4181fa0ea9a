package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

func TestManager_Claim_PublishesStepByStep(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)

	c, err := e.m.Claim(ctx, claimReq("vol1", "alloc1", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil {
		t.Fatalf("claim: %s", err)
	}
	usage := "rw-file-system-single-node-writer"
	wantTarget := filepath.Join(e.dataDir, "volumes", testPlugin, "per-alloc", "alloc1", "vol1", usage)
	wantStaging := filepath.Join(e.dataDir, "volumes", testPlugin, "staging", "vol1", usage)
	if c.State != claim.StatePublished || c.TargetPath != wantTarget || c.StagingPath != wantStaging || c.Usage != usage {
		t.Fatalf("claim = %+v; want published at %s staged at %s", c, wantTarget, wantStaging)
	}
	if got := e.plugin.ControllerPublished()["ext-vol1"]; got != fakeplugin.DefaultNodeID {
		t.Errorf("controller published to %q, want %q", got, fakeplugin.DefaultNodeID)
	}
	if got := e.plugin.Staged()["ext-vol1"]; got != wantStaging {
		t.Errorf("staged at %q, want %q", got, wantStaging)
	}
	if got := e.plugin.Published()["ext-vol1"]; !slices.Equal(got, []string{wantTarget}) {
		t.Errorf("published at %v, want %s", got, wantTarget)
	}
	want := []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
	var got []string
	for _, m := range e.plugin.History() {
		if slices.Contains(want, m) {
			got = append(got, m)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("plugin saw %v, want %v", got, want)
	}

	// The store holds the published claim and its usage count.
	rec, err := e.store.Volume(ctx, "vol1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Claims) != 1 || rec.Claims[0].State != claim.StatePublished || !rec.ControllerPublished ||
		len(rec.Stagings) != 1 || !rec.Stagings[0].Staged || !slices.Equal(rec.Stagings[0].Users, []string{"alloc1"}) {
		t.Fatalf("stored record = %+v", rec)
	}
	e.checkAgree()

	past, err := e.m.Release(ctx, "vol1", "alloc1")
	if err != nil {
		t.Fatalf("release: %s", err)
	}
	if past.Alloc != "alloc1" || past.TargetPath != wantTarget {
		t.Errorf("release returned %+v", past)
	}
	if !slices.Contains([]string{claim.StateTaken, claim.StateNodeDetached, claim.StateControllerDetached, claim.StateReadyToFree}, past.State) {
		t.Errorf("release returned state %q", past.State)
	}
	v := e.waitFreed("vol1")
	if len(v.Claims) != 0 || len(v.Stagings) != 0 || v.ControllerPublished {
		t.Errorf("after release: %+v", v)
	}
	e.checkClean()
	if _, err := os.Stat(filepath.Join(e.dataDir, "volumes", testPlugin, "per-alloc", "alloc1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("per-alloc directory left behind: %v", err)
	}
	if _, err := e.m.Release(ctx, "vol1", "alloc1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second release after freed: %v, want ErrNotFound", err)
	}
	if err := e.m.Deregister(ctx, "vol1"); err != nil {
		t.Fatalf("deregister: %s", err)
	}
	if _, err := e.m.Get(context.Background(), "vol1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after deregister: %v", err)
	}
}

func TestManager_Claim_Idempotent(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	req := claimReq("vol1", "alloc1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)
	first, err := e.m.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.m.Claim(ctx, req)
	if err != nil {
		t.Fatalf("repeated claim: %s", err)
	}
	if first.TargetPath != second.TargetPath || second.State != claim.StatePublished {
		t.Errorf("repeated claim = %+v, want the first %+v", second, first)
	}
	if n := e.plugin.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("NodePublishVolume called %d times, want 1", n)
	}
	// Same alloc, other mode: a conflict, not a second claim.
	_, err = e.m.Claim(ctx, claimReq("vol1", "alloc1", claim.ModeRead, csi.AccessModeSingleNodeWriter))
	if !errors.Is(err, ErrConflict) {
		t.Errorf("same alloc, other mode: %v, want ErrConflict", err)
	}
}

func TestManager_Claim_AccessModes(t *testing.T) {
	type step struct {
		alloc string
		mode  claim.Mode
		want  error // nil, ErrClaimLimit, ErrInvalid
	}
	r, w := claim.ModeRead, claim.ModeWrite
	tests := []struct {
		am    csi.AccessMode
		steps []step
	}{
		{csi.AccessModeSingleNodeReaderOnly, []step{{"a", w, ErrInvalid}, {"a", r, nil}, {"b", r, ErrClaimLimit}}},
		{csi.AccessModeSingleNodeWriter, []step{{"a", r, nil}, {"b", r, ErrClaimLimit}, {"c", w, ErrClaimLimit}}},
		{csi.AccessModeSingleNodeSingleWriter, []step{{"a", w, nil}, {"b", r, ErrClaimLimit}, {"c", w, ErrClaimLimit}}},
		{csi.AccessModeSingleNodeMultiWriter, []step{{"a", w, nil}, {"b", w, nil}, {"c", r, nil}}},
		{csi.AccessModeMultiNodeReaderOnly, []step{{"a", r, nil}, {"b", r, nil}, {"c", w, ErrInvalid}}},
		{csi.AccessModeMultiNodeSingleWriter, []step{{"a", w, nil}, {"b", r, nil}, {"c", w, ErrClaimLimit}, {"d", r, nil}}},
		{csi.AccessModeMultiNodeMultiWriter, []step{{"a", w, nil}, {"b", w, nil}, {"c", r, nil}}},
	}
	// One plugin for every case: node-only without staging, so read and
	// write claims (two usages) can share a volume.
	e := newEnv(t, fakeplugin.Config{})
	ctx := ctxT(t)
	for _, tt := range tests {
		t.Run(tt.am.String(), func(t *testing.T) {
			id := "v-" + tt.am.String()
			e.register(id, fsCap(tt.am))
			for _, s := range tt.steps {
				_, err := e.m.Claim(ctx, claimReq(id, s.alloc, s.mode, tt.am))
				switch {
				case s.want == nil && err != nil:
					t.Errorf("%s %s: %s", s.alloc, s.mode, err)
				case s.want != nil && !errors.Is(err, s.want):
					t.Errorf("%s %s: %v, want %v", s.alloc, s.mode, err, s.want)
				}
			}
		})
	}
	// A capability the volume does not have is invalid input.
	_, err := e.m.Claim(ctx, claimReq("v-"+csi.AccessModeSingleNodeWriter.String(), "z", w, csi.AccessModeMultiNodeMultiWriter))
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("claim with a capability the volume lacks: %v, want ErrInvalid", err)
	}
}

func TestManager_Claim_ReleasedWriterStillHoldsUntilDetached(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	// Keep the old writer published: its unpublish keeps failing.
	e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Unavailable})
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Claim(ctx, claimReq("vol1", "b", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); !errors.Is(err, ErrClaimLimit) {
		t.Errorf("claim while the released writer is still published: %v, want ErrClaimLimit", err)
	}
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); !errors.Is(err, ErrInUse) {
		t.Errorf("same alloc claims again during its release: %v, want ErrInUse", err)
	}
	e.plugin.ClearFaults()
	e.waitFreed("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "b", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Errorf("claim after the release finished: %s", err)
	}
	e.checkAgree()
}

func TestManager_Claim_ConcurrentWritersOneWins(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	const n = 16
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.m.Claim(ctx, claimReq("vol1", fmt.Sprintf("alloc%d", i), claim.ModeWrite, csi.AccessModeSingleNodeWriter))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	won := 0
	for err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrClaimLimit) || !errors.Is(err, ErrConflict):
			t.Errorf("loser got %v, want ErrClaimLimit (a conflict)", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d claims won, want exactly 1", won)
	}
	v, _ := e.m.Get(ctx, "vol1")
	if len(v.Claims) != 1 {
		t.Errorf("volume has %d claims, want 1", len(v.Claims))
	}
	if n := e.plugin.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("NodePublishVolume called %d times, want 1", n)
	}
}

func TestManager_Claim_VolumesInParallel(t *testing.T) {
	e := newEnv(t, fullPlugin)
	const n = 6
	for i := range n {
		e.register(fmt.Sprintf("vol%d", i))
	}
	// Every stage takes a while, so claims on different volumes overlap
	// unless something serializes them.
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Delay: 100 * time.Millisecond})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.m.Claim(ctx, claimReq(fmt.Sprintf("vol%d", i), "alloc", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
				t.Errorf("claim vol%d: %s", i, err)
			}
		}()
	}
	wg.Wait()
	if m := e.plugins.client.max.Load(); m < 2 {
		t.Errorf("at most %d stage calls were in flight at once; claims on different volumes must run in parallel", m)
	}
}

func TestManager_Claim_InFlightBoundedPerPlugin(t *testing.T) {
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.MaxInFlightPerPlugin = 2 }))
	const n = 6
	for i := range n {
		e.register(fmt.Sprintf("vol%d", i))
	}
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Delay: 50 * time.Millisecond})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.m.Claim(ctx, claimReq(fmt.Sprintf("vol%d", i), "alloc", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
				t.Errorf("claim vol%d: %s", i, err)
			}
		}()
	}
	wg.Wait()
	if m := e.plugins.client.max.Load(); m > 2 {
		t.Errorf("%d calls were in flight to one plugin at once, want at most 2", m)
	}
}

func TestManager_Claim_FinalErrorTearsDown(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.InvalidArgument, Message: "bad target"})
	_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if !errors.Is(err, ErrClaimFailed) || csi.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "bad target") {
		t.Fatalf("claim: %v, want ErrClaimFailed with the plugin's error", err)
	}
	if n := e.plugin.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("NodePublishVolume called %d times; a final error is not retried", n)
	}
	e.plugin.ClearFaults()
	v := e.waitFreed("vol1")
	if len(v.Claims) != 0 {
		t.Errorf("failed claim still current: %+v", v.Claims)
	}
	e.checkClean()
	if e.plugin.Calls("NodeUnstageVolume") == 0 || e.plugin.Calls("ControllerUnpublishVolume") == 0 {
		t.Errorf("teardown did not unstage and controller-unpublish: %v", e.plugin.History())
	}
}

func TestManager_Claim_RetryableErrorsRetried(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 2})
	e.plugin.SetFault("ControllerPublishVolume", fakeplugin.Fault{Code: codes.DeadlineExceeded, AfterApply: true, Times: 1})
	c, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil {
		t.Fatalf("claim: %s", err)
	}
	if c.State != claim.StatePublished || c.LastError != "" || c.Attempts != 0 {
		t.Errorf("claim = %+v", c)
	}
	if n := e.plugin.Calls("NodeStageVolume"); n != 3 {
		t.Errorf("NodeStageVolume called %d times, want 3", n)
	}
	if n := e.plugin.Calls("ControllerPublishVolume"); n != 2 {
		t.Errorf("ControllerPublishVolume called %d times, want 2", n)
	}
	e.checkAgree()
}

func TestManager_Claim_UncertainGivesUpThenTearsDown(t *testing.T) {
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.MaxClaimAttempts = 3 }))
	e.register("vol1")
	ctx := ctxT(t)
	// The plugin publishes but the answer is lost, every time.
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.DeadlineExceeded, AfterApply: true})
	_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("claim: %v, want ErrClaimFailed", err)
	}
	if n := e.plugin.Calls("NodePublishVolume"); n != 3 {
		t.Errorf("NodePublishVolume called %d times, want 3", n)
	}
	e.plugin.ClearFaults()
	e.waitFreed("vol1")
	e.checkClean()
}

func TestManager_Release_RetriesUntilFreed(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("NodeUnstageVolume", fakeplugin.Fault{Code: codes.Internal, Message: "device busy"})
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	// The failure is visible in the status, in the step's state.
	waitFor(t, "the unstage failure in the status", func() bool {
		v, _ := e.m.Get(ctx, "vol1")
		return len(v.PastClaims) == 1 && v.PastClaims[0].Attempts > 1 && strings.Contains(v.PastClaims[0].LastError, "device busy")
	})
	v, _ := e.m.Get(ctx, "vol1")
	if s := v.PastClaims[0].State; s != claim.StateTaken {
		t.Errorf("past claim state %q while unstage fails, want %q", s, claim.StateTaken)
	}
	if len(v.Stagings) != 1 || len(v.Stagings[0].Users) != 0 {
		t.Errorf("usage count after unpublish: %+v", v.Stagings)
	}
	if _, ok := e.plugin.Published()["ext-vol1"]; ok {
		t.Errorf("still published after NodeUnpublishVolume succeeded")
	}
	again, err := e.m.Release(ctx, "vol1", "a")
	if err != nil || again.State != claim.StateTaken {
		t.Errorf("repeated release = %+v, %v; want the past claim", again, err)
	}
	e.plugin.ClearFaults()
	e.waitFreed("vol1")
	e.checkClean()
}

func TestManager_Release_WaitsForHealthyPlugin(t *testing.T) {
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) {
		c.Backoff = csi.Backoff{Initial: time.Millisecond, Max: time.Millisecond}
	}))
	e.register("vol1")
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugins.setDown(true)
	before := e.plugins.clients.Load()
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the release to fail on the down plugin", func() bool {
		v, _ := e.m.Get(ctx, "vol1")
		return len(v.PastClaims) == 1 && strings.Contains(v.PastClaims[0].LastError, errDown.Error())
	})
	// With a 1 ms backoff, a loop that did not wait for health would ask
	// for the client hundreds of times in this pause.
	time.Sleep(100 * time.Millisecond)
	if n := e.plugins.clients.Load() - before; n > 2 {
		t.Errorf("asked for the client %d times while the plugin was down; must wait for health", n)
	}
	e.plugins.setDown(false)
	e.waitFreed("vol1")
	e.checkClean()
}

func TestManager_Get_NotQueuedBehindRPC(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Hang: true})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
		done <- err
	}()
	waitFor(t, "the stage call to hang", func() bool { return e.plugin.Calls("NodeStageVolume") == 1 })
	// The volume actor's RPC hangs; status is still answered.
	v, err := e.m.Get(context.Background(), "vol1")
	if err != nil || len(v.Claims) != 1 || v.Claims[0].State != claim.StateControllerPublished {
		t.Fatalf("get during a hanging RPC = %+v, %v", v, err)
	}
	// And so is a request for another alloc on the same volume.
	if _, err := e.m.Claim(context.Background(), claimReq("vol1", "b", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); !errors.Is(err, ErrClaimLimit) {
		t.Errorf("second claim during a hanging RPC: %v, want ErrClaimLimit", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("claim: %v, want context.Canceled", err)
	}
	// Shutdown cancels the hanging RPC.
}

func TestManager_Claim_ReadAndWriteShareStaging(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1", fsCap(csi.AccessModeMultiNodeMultiWriter))
	ctx := ctxT(t)
	w, err := e.m.Claim(ctx, claimReq("vol1", "w", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter))
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.m.Claim(ctx, claimReq("vol1", "r", claim.ModeRead, csi.AccessModeMultiNodeMultiWriter))
	if err != nil {
		t.Fatalf("read claim next to a write claim: %s", err)
	}
	if r.StagingPath != w.StagingPath || r.TargetPath == w.TargetPath {
		t.Errorf("claims %+v and %+v", w, r)
	}
	if n := e.plugin.Calls("NodeStageVolume"); n != 1 {
		t.Errorf("NodeStageVolume called %d times, want 1", n)
	}
	e.checkAgree()
	for _, a := range []string{"w", "r"} {
		if _, err := e.m.Release(ctx, "vol1", a); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFreed("vol1")
	e.checkClean()
}

// A claim that arrives while the last user's NodeUnstageVolume is in flight
// must stage again, not publish into a staging that is going away (the
// plugin answers FailedPrecondition "must be staged" to that forever).
func TestManager_Claim_DuringLastUsersUnstage(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1", fsCap(csi.AccessModeMultiNodeMultiWriter))
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("NodeUnstageVolume", fakeplugin.Fault{Delay: 300 * time.Millisecond, Times: 1})
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's NodeUnstageVolume in flight", func() bool { return e.plugin.Calls("NodeUnstageVolume") == 1 })
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := e.m.Claim(bctx, claimReq("vol1", "b", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter))
	if err != nil {
		t.Fatalf("claim during the last user's unstage: %s", err)
	}
	if e.plugin.Staged()["ext-vol1"] != b.StagingPath || !slices.Contains(e.plugin.Published()["ext-vol1"], b.TargetPath) {
		t.Errorf("plugin after b's claim: staged %v, published %v", e.plugin.Staged(), e.plugin.Published())
	}
	if n := e.plugin.Calls("NodeStageVolume"); n != 2 {
		t.Errorf("NodeStageVolume called %d times, want 2 (a, then b after a's unstage)", n)
	}
	e.waitFreed("vol1")
	e.checkAgree()
	if _, err := e.m.Release(ctx, "vol1", "b"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1")
	e.checkClean()
}

// A ControllerUnpublishVolume that took effect but whose answer was lost
// leaves the attachment uncertain: the next claim publishes again instead
// of staging a volume that is no longer attached.
func TestManager_Claim_AfterUncertainControllerUnpublish(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1", fsCap(csi.AccessModeMultiNodeMultiWriter))
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("ControllerUnpublishVolume", fakeplugin.Fault{Code: codes.Unavailable, AfterApply: true, Message: "reply lost"})
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's ControllerUnpublishVolume applied and failing", func() bool {
		v, _ := e.m.Get(ctx, "vol1")
		return len(v.PastClaims) == 1 && strings.Contains(v.PastClaims[0].LastError, "reply lost") &&
			len(e.plugin.ControllerPublished()) == 0
	})
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := e.m.Claim(bctx, claimReq("vol1", "b", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter)); err != nil {
		t.Fatalf("claim after an uncertain ControllerUnpublishVolume: %s", err)
	}
	if _, ok := e.plugin.ControllerPublished()["ext-vol1"]; !ok {
		t.Errorf("volume not controller-published for b: %v", e.plugin.ControllerPublished())
	}
	e.waitFreed("vol1")
	e.plugin.ClearFaults()
	e.checkAgree()
	if _, err := e.m.Release(ctx, "vol1", "b"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1")
	e.checkClean()
}
