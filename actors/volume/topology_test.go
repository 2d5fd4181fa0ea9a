package volume

import (
	"errors"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

var zonedPlugin = fakeplugin.Config{CreateDelete: true, StageUnstage: true, Topology: map[string]string{"zone": "z1"}}

func createSpec(id string, topo ...map[string]string) Spec {
	return Spec{ID: id, Plugin: testPlugin, Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}, Topology: topo}
}

func TestManager_Create_TopologyOfThisHost(t *testing.T) {
	e := newEnv(t, zonedPlugin)
	ctx := ctxT(t)
	v, err := e.m.Create(ctx, createSpec("vol1"))
	if err != nil {
		t.Fatal(err)
	}
	req := e.plugin.LastRequest("CreateVolume").(*csipb.CreateVolumeRequest)
	ar := req.GetAccessibilityRequirements()
	if len(ar.GetRequisite()) != 1 || ar.GetRequisite()[0].GetSegments()["zone"] != "z1" || len(ar.GetPreferred()) != 1 {
		t.Errorf("CreateVolume accessibility_requirements = %v, want this host's zone z1", ar)
	}
	if len(v.AccessibleTopology) != 1 || v.AccessibleTopology[0]["zone"] != "z1" {
		t.Errorf("volume accessible topology = %v", v.AccessibleTopology)
	}
	if stored, err := e.store.Volume(ctx, "vol1"); err != nil || len(stored.AccessibleTopology) != 1 {
		t.Errorf("stored accessible topology = %v, %v", stored.AccessibleTopology, err)
	}
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Errorf("claim in the volume's zone: %v", err)
	}
}

func TestManager_Claim_OutsideTopologyConflicts(t *testing.T) {
	e := newEnv(t, zonedPlugin)
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, createSpec("vol1", map[string]string{"zone": "z2"})); err != nil {
		t.Fatal(err)
	}
	before, _ := e.store.Volume(ctx, "vol1")
	_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if !errors.Is(err, ErrOutsideTopology) || !errors.Is(err, ErrConflict) ||
		!strings.Contains(err.Error(), `volume "vol1" is reachable from topology {zone=z2}, and this host's node topology is {zone=z1}`) {
		t.Fatalf("claim outside the topology = %v", err)
	}
	after, _ := e.store.Volume(ctx, "vol1")
	if after.Revision != before.Revision || e.plugin.Calls("NodeStageVolume") != 0 {
		t.Errorf("a refused claim changed something: revision %d → %d", before.Revision, after.Revision)
	}
}

func TestManager_Create_TopologyWithoutConstraintsIsInvalid(t *testing.T) {
	e := newEnv(t, fullPlugin)
	_, err := e.m.Create(ctxT(t), createSpec("vol1", map[string]string{"zone": "z2"}))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no VOLUME_ACCESSIBILITY_CONSTRAINTS capability") {
		t.Fatalf("create with a topology = %v", err)
	}
	if e.plugin.Calls("CreateVolume") != 0 {
		t.Error("CreateVolume was called")
	}
}

func TestManager_Claim_MaxVolumesPerNode(t *testing.T) {
	pc := fullPlugin
	pc.MaxVolumesPerNode = 1
	e := newEnv(t, pc)
	e.register("vol1", fsCap(csi.AccessModeMultiNodeMultiWriter))
	e.register("vol2")
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter)); err != nil {
		t.Fatal(err)
	}
	// Another claim of the same volume takes no new place.
	if _, err := e.m.Claim(ctx, claimReq("vol1", "b", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter)); err != nil {
		t.Fatalf("second claim of the volume in use: %v", err)
	}
	wantLimit := func(when string) {
		t.Helper()
		_, err := e.m.Claim(ctx, claimReq("vol2", "c", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
		if !errors.Is(err, ErrNodeVolumeLimit) || !errors.Is(err, ErrConflict) ||
			!strings.Contains(err.Error(), "its max_volumes_per_node of 1") {
			t.Fatalf("%s: claim over the node's limit = %v", when, err)
		}
	}
	wantLimit("running")
	e.restart()
	wantLimit("after a restart")
	for _, alloc := range []string{"a", "b"} {
		if _, err := e.m.Release(ctx, "vol1", alloc); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFreed("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol2", "c", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatalf("claim once the other volume is freed: %v", err)
	}
}

func TestManager_Create_CloneRefusals(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.register("src")
	spec := createSpec("copy")
	spec.CloneOf = "src"
	_, err := e.m.Create(ctx, spec)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no CLONE_VOLUME capability") {
		t.Errorf("clone with a plugin that cannot = %v", err)
	}
	spec.CloneOf = "nope"
	if _, err := e.m.Create(ctx, spec); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "content_source.volume") {
		t.Errorf("clone of an unknown volume = %v", err)
	}
	if e.plugin.Calls("CreateVolume") != 0 {
		t.Error("CreateVolume was called")
	}
}
