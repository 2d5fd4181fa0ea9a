package volume

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

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
