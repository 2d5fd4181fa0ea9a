package volume

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// nodeLocalPlugin knows only the volumes created through it, like a
// node-local driver on another host than the one that created a volume.
var nodeLocalPlugin = fakeplugin.Config{ControllerPublish: true, StageUnstage: true, StrictVolumes: true,
	Topology: map[string]string{"node": "b"}}

// TestManager_Mirror_NodeLocal: a definition of another host is mirrored
// without asking the plugin, which does not know the volume; its capacity
// and accessible topology come with it and are updated by the next
// mirror; only a claim asks the plugin, and fails naming the cause.
func TestManager_Mirror_NodeLocal(t *testing.T) {
	e := newEnv(t, nodeLocalPlugin)
	ctx := ctxT(t)
	s := spec("vol1")
	if _, err := e.m.Register(ctx, s); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Register of a volume the plugin does not know = %v, want ErrNotFound", err)
	}
	validations := e.plugin.Calls("ValidateVolumeCapabilities")
	s.CapacityBytes = 1 << 20
	s.AccessibleTopology = []map[string]string{{"node": "a"}}
	v, err := e.m.Mirror(ctx, s)
	if err != nil {
		t.Fatalf("Mirror: %v", err)
	}
	if e.plugin.Calls("ValidateVolumeCapabilities") != validations {
		t.Error("Mirror asked the plugin")
	}
	if v.CapacityBytes != 1<<20 || len(v.AccessibleTopology) != 1 || v.AccessibleTopology[0]["node"] != "a" {
		t.Errorf("mirrored volume = capacity %d topology %v", v.CapacityBytes, v.AccessibleTopology)
	}
	again, err := e.m.Mirror(ctx, s)
	if err != nil || again.Revision != v.Revision {
		t.Errorf("the same definition again = revision %d, %v; want %d unchanged", again.Revision, err, v.Revision)
	}

	// A claim is refused before any RPC, naming both sides.
	_, err = e.m.Claim(ctx, claimReq("vol1", "a1", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if !errors.Is(err, ErrOutsideTopology) || !strings.Contains(err.Error(), "{node=a}") || !strings.Contains(err.Error(), "{node=b}") {
		t.Fatalf("claim outside the volume's topology = %v, want ErrOutsideTopology naming {node=a} and {node=b}", err)
	}
	if n := e.plugin.Calls("ControllerPublishVolume") + e.plugin.Calls("NodeStageVolume"); n != 0 {
		t.Errorf("a claim outside the topology sent %d RPCs", n)
	}

	// An update: more capacity, another topology and parameters; less
	// capacity never shrinks the record.
	s.CapacityBytes = 2 << 20
	s.AccessibleTopology = nil
	s.Parameters = map[string]string{"tier": "gold"}
	v, err = e.m.Mirror(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if v.CapacityBytes != 2<<20 || len(v.AccessibleTopology) != 0 || v.Parameters["tier"] != "gold" {
		t.Errorf("updated mirror = capacity %d topology %v parameters %v", v.CapacityBytes, v.AccessibleTopology, v.Parameters)
	}
	s.CapacityBytes = 1
	if v, err = e.m.Mirror(ctx, s); err != nil || v.CapacityBytes != 2<<20 {
		t.Errorf("a smaller capacity = %d, %v; want %d kept", v.CapacityBytes, err, 2<<20)
	}

	// Reachable from everywhere now: the plugin's own refusal fails the
	// claim, with its code.
	_, err = e.m.Claim(ctx, claimReq("vol1", "a1", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if !errors.Is(err, ErrClaimFailed) || csi.Code(err) != codes.NotFound {
		t.Fatalf("claim of a volume the plugin does not know = %v, want ErrClaimFailed with the plugin's NotFound", err)
	}
	e.waitFreed("vol1")

	// The external ID never changes.
	s.ExternalID = "other"
	if _, err := e.m.Mirror(ctx, s); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "external_id") {
		t.Errorf("a mirror with another external ID = %v, want ErrInvalid naming external_id", err)
	}
}

// TestManager_Mirror_StopsIdleActor: the actor started to mirror a new
// definition stops as soon as the record is written, not an idle timeout
// later (a host joining a cluster mirrors every volume); the volume is
// listed and claimed as before, by a new actor, which the claim keeps.
func TestManager_Mirror_StopsIdleActor(t *testing.T) {
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.IdleTimeout = time.Hour }))
	ctx := ctxT(t)
	for _, id := range []string{"m1", "m2", "m3"} {
		if _, err := e.m.Mirror(ctx, spec(id)); err != nil {
			t.Fatalf("Mirror %s: %v", id, err)
		}
	}
	waitFor(t, "the mirroring actors stopped", func() bool { return e.m.Live() == 0 })
	vs, err := e.m.List(ctx, Filter{})
	if err != nil || len(vs) != 3 {
		t.Fatalf("List = %d volumes, %v; want the 3 mirrored", len(vs), err)
	}
	if _, err := e.m.Claim(ctx, claimReq("m2", "a1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatalf("claim on a mirrored volume: %v", err)
	}
	if n := e.m.Live(); n != 1 {
		t.Errorf("%d volume actors live after a claim, want the claimed volume's", n)
	}
	// Mirrored again (as at a restart): the same, and the actor started
	// for it stops again.
	for _, id := range []string{"m1", "m3"} {
		if _, err := e.m.Mirror(ctx, spec(id)); err != nil {
			t.Fatalf("Mirror %s again: %v", id, err)
		}
	}
	waitFor(t, "the actors started to mirror again stopped", func() bool { return e.m.Live() == 1 })
}

func TestCheckUpdate(t *testing.T) {
	old := spec("vol1")
	next := old
	next.Secrets = map[string]string{"token": "new"}
	if held, err := CheckUpdate(old, next); err != nil || len(held) != 0 {
		t.Errorf("secrets only = %v, %v; want nothing held", held, err)
	}
	next.Parameters = map[string]string{"a": "b"}
	next.Capabilities = []csi.VolumeCapability{fsCap(csi.AccessModeMultiNodeMultiWriter)}
	if held, err := CheckUpdate(old, next); err != nil || strings.Join(held, ",") != "capabilities,parameters" {
		t.Errorf("capabilities and parameters = %v, %v", held, err)
	}
	next.Plugin = "other"
	if _, err := CheckUpdate(old, next); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "plugin") {
		t.Errorf("another plugin = %v, want ErrInvalid naming plugin", err)
	}
}
